"""The 16 levels of NF4 (QLoRA's 4-bit NormalFloat) and the index <-> level maps: what both the
quantizer (:mod:`llminfra.quant.nf4`) and the dequantizer (:mod:`llminfra.quant.tensor`) need.
How the levels are chosen: :mod:`llminfra.quant.nf4`."""

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
