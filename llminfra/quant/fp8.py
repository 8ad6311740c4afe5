"""fp8 weights (Micikevicius et al., 2022, arXiv:2209.05433): e4m3 for range ±448 with 3
mantissa bits, e5m2 for range ±57344 with 2.

A scale maps the tensor (or each output row) onto the format's range,
``s = max|x| / fp8_max``, and the values ``x / s`` are *stored in torch's float8 dtypes*
(``torch.float8_e4m3fn`` / ``torch.float8_e5m2``): ``x̂ = float(fp8(x / s)) · s``. The relative
error per weight is at most half the format's epsilon (``2**-4`` for e4m3, ``2**-3`` for e5m2)
while values stay normal. The software rounding of :mod:`llminfra.quant.formats` reproduces
torch's cast (tested). Chapter 03.
"""

from __future__ import annotations

import torch

from llminfra.quant.formats import TORCH_DTYPES
from llminfra.quant.tensor import (QuantizedTensor, check_weight, layout_for, store_scale, to_groups,
                                   ungroup_codes)
from llminfra.specs.formats import get_format

FP8_FORMATS = ("fp8-e4m3", "fp8-e5m2")


def quantize_fp8(w: torch.Tensor, fmt: str = "fp8-e4m3", granularity: str = "tensor",
                 scheme: str | None = None) -> QuantizedTensor:
    """Scale ``w`` onto ``fmt``'s range per tensor or per channel and store it as float8.

    ``w (..., C)`` -> :class:`QuantizedTensor` of kind ``"fp8"``, 1 byte per value + scales.
    """
    if fmt not in FP8_FORMATS:
        raise KeyError(f"unknown fp8 format {fmt!r}; allowed: {FP8_FORMATS}")
    if granularity not in ("tensor", "channel"):
        raise ValueError(f"fp8 granularity must be 'tensor' or 'channel', got {granularity!r}")
    check_weight(w)
    layout = layout_for(w, granularity)
    G = to_groups(w, layout)
    scale = store_scale(G.abs().amax(-1) / get_format(fmt).max)
    s = scale.float().unsqueeze(-1)
    s = torch.where(s == 0, torch.ones_like(s), s)
    x = (G / s).clamp(-get_format(fmt).max, get_format(fmt).max)
    codes = ungroup_codes(x.to(TORCH_DTYPES[fmt]), layout)
    return QuantizedTensor(scheme or fmt, "fp8", 8, layout, codes, scale)
