"""Quantization from scratch: number formats, round-to-nearest, fp8, NF4, GPTQ, AWQ, packed
``QuantLinear``, model-level quantization, evaluation and the KV cache quantized.

Entry points (what notebooks, checkers and the bench call):

* ``quantize(w, scheme) -> QuantizedTensor`` with ``.dequantize()`` and honest ``.nbytes``;
* ``quantize_model(model, scheme, calibration=None)`` replaces the transformer blocks'
  ``nn.Linear`` layers by :class:`QuantLinear` (also ``"gptq-…"``, ``"awq-…"``, ``"int8-dynamic"``);
* ``fake_quantize_model(model, scheme)`` rounds the same weights and stores them back
  dequantized (the rounding's effect alone, at full speed);
* :class:`QuantLinear`.

Taught in chapter 03 (``notebooks/03_precision_and_quantization.ipynb``).
"""

from __future__ import annotations

from llminfra.quant.cpu_kernels import int4_linear
from llminfra.quant.quant_linear import QuantLinear
from llminfra.quant.quantize_model import fake_quantize_model, quantize_model
from llminfra.quant.quantize_tensor import quantize
from llminfra.quant.schemes import STANDARD_SCHEMES, Scheme, parse_scheme
from llminfra.quant.tensor import QuantizedTensor

__all__ = ["quantize", "quantize_model", "fake_quantize_model", "QuantLinear", "QuantizedTensor",
           "Scheme", "parse_scheme", "STANDARD_SCHEMES", "int4_linear"]
