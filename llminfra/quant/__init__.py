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

import torch

from llminfra.quant.fp8 import quantize_fp8
from llminfra.quant.nf4 import quantize_nf4
from llminfra.quant.rtn import quantize_int
from llminfra.quant.schemes import STANDARD_SCHEMES, Scheme, parse_scheme
from llminfra.quant.tensor import QuantizedTensor


def quantize(w: torch.Tensor, scheme: str) -> QuantizedTensor:
    """Quantize tensor ``w (..., C)`` with the round-to-nearest ``scheme`` (see
    :mod:`llminfra.quant.schemes`), e.g. ``quantize(w, "int4-g128").dequantize()``."""
    s = parse_scheme(scheme)
    if s.kind == "int":
        return quantize_int(w, s.bits, s.granularity, s.symmetric, scheme=scheme)
    if s.kind == "fp8":
        return quantize_fp8(w, s.fp8_format, s.granularity, scheme=scheme)
    return quantize_nf4(w, s.granularity, scheme=scheme)


from llminfra.quant.quant_linear import QuantLinear  # noqa: E402
from llminfra.quant.quantize_model import fake_quantize_model, quantize_model  # noqa: E402

__all__ = ["quantize", "quantize_model", "fake_quantize_model", "QuantLinear", "QuantizedTensor", "Scheme",
           "parse_scheme", "STANDARD_SCHEMES"]
