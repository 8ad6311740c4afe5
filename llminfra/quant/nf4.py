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

from llminfra.quant import packing
from llminfra.quant.nf4_levels import (NF4_OFFSET, NF4_REFERENCE, nf4_code, nf4_decode,  # noqa: F401
                                       nf4_encode)
from llminfra.quant.tensor import (QuantizedTensor, check_weight, layout_for, store_scale,
                                   to_groups, ungroup_codes)

def quantize_nf4(w: torch.Tensor, block_size: int = 64, scheme: str | None = None):
    """NF4 with one absmax scale per block of ``block_size`` weights along the last axis.

    ``w (..., C)`` -> :class:`~llminfra.quant.tensor.QuantizedTensor` of kind ``"nf4"``:
    4 bits per weight packed two per byte + one fp16 scale per block
    (``0.5 + 2/64 = 0.53125`` bytes per weight at the QLoRA block size of 64).
    """
    check_weight(w)
    layout = layout_for(w, block_size)
    G = to_groups(w, layout)
    scale = store_scale(G.abs().amax(-1))
    s = scale.float().unsqueeze(-1)
    idx = nf4_encode(G / torch.where(s == 0, torch.ones_like(s), s))
    codes = packing.pack_int4(ungroup_codes(idx, layout))
    return QuantizedTensor(scheme or f"nf4-g{block_size}", "nf4", 4, layout, codes, scale)
