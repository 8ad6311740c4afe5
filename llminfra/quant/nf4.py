"""NF4: the 4-bit NormalFloat code of QLoRA (Dettmers et al., 2023, arXiv:2305.14314, §3).

Weights of a trained layer are roughly normal, so NF4 puts its 16 levels at quantiles of
N(0, 1) instead of evenly: 8 positive levels at ``Φ⁻¹(p)`` for ``p`` evenly spaced in
``[0.5, δ]``, 7 negative ones at ``-Φ⁻¹(p)`` for ``p`` in ``[0.5, δ]`` (7 steps), and an exact 0;
all divided by the largest so the code spans ``[-1, 1]``. ``δ = 0.9677083`` is the offset of
the reference implementation (bitsandbytes ``create_normal_map``). A block of 64 weights
shares one absmax scale: ``w ≈ code[i] · absmax``. (QLoRA's "double quantization" of the
scales is not done here: scales stay fp16.) Chapter 03.
"""

from __future__ import annotations

import torch

#: bitsandbytes' NF4 table, as published (used to check :func:`nf4_code`)
NF4_REFERENCE = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)

NF4_OFFSET = 0.9677083


def nf4_code(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 16 NF4 levels, ascending, computed from normal quantiles (see module docstring)."""
    pos = torch.special.ndtri(torch.linspace(NF4_OFFSET, 0.5, 9, dtype=torch.float64)[:-1])
    neg = -torch.special.ndtri(torch.linspace(NF4_OFFSET, 0.5, 8, dtype=torch.float64)[:-1])
    v = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).sort().values
    return (v / v.abs().max()).to(dtype)


def nf4_encode(x: torch.Tensor) -> torch.Tensor:
    """Index (uint8 in 0..15) of the nearest NF4 level to each element of ``x`` (in [-1, 1])."""
    code = nf4_code(torch.float32).to(x.device)
    mid = (code[1:] + code[:-1]) / 2                      # 15 decision boundaries
    return torch.bucketize(x.float().clamp(-1, 1).contiguous(), mid).to(torch.uint8)


def nf4_decode(idx: torch.Tensor) -> torch.Tensor:
    """NF4 level of each index (float32)."""
    return nf4_code(torch.float32).to(idx.device)[idx.long()]


def quantize_nf4(w: torch.Tensor, block_size: int = 64, scheme: str | None = None):
    """NF4 with one absmax scale per block of ``block_size`` weights along the last axis.

    ``w (..., C)`` -> :class:`~llminfra.quant.tensor.QuantizedTensor` of kind ``"nf4"``:
    4 bits per weight packed two per byte + one fp16 scale per block
    (``0.5 + 2/64 = 0.53125`` bytes per weight at the QLoRA block size of 64).
    """
    from llminfra.quant import packing
    from llminfra.quant.tensor import (QuantizedTensor, check_weight, layout_for, store_scale,
                                       to_groups, ungroup_codes)
    check_weight(w)
    layout = layout_for(w, block_size)
    G = to_groups(w, layout)
    scale = store_scale(G.abs().amax(-1))
    s = scale.float().unsqueeze(-1)
    idx = nf4_encode(G / torch.where(s == 0, torch.ones_like(s), s))
    codes = packing.pack_int4(ungroup_codes(idx, layout))
    return QuantizedTensor(scheme or f"nf4-g{block_size}", "nf4", 4, layout, codes, scale)
