"""``quantize(w, scheme)``: one tensor, round to nearest, in any scheme of
:mod:`llminfra.quant.schemes` (the int / fp8 / nf4 quantizers behind one name)."""

from __future__ import annotations

import torch

from llminfra.quant.fp8 import quantize_fp8
from llminfra.quant.nf4 import quantize_nf4
from llminfra.quant.rtn import quantize_int
from llminfra.quant.schemes import parse_scheme
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
