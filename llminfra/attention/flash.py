"""Tiled attention in PyTorch: FlashAttention's forward pass, Algorithm 1 of Dao et al. 2022.

Dao, Fu, Ermon, Rudra, Ré 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness", arXiv:2205.14135, Algorithm 1. K and V are cut into column blocks of ``Bc`` keys
(outer loop, index j) and Q into row blocks of ``Br`` queries (inner loop, index i). Each tile
``S_ij = Q_i K_jᵀ`` lives only in fast memory; the softmax is assembled with the online
recurrence of Milakov & Gimelshein 2018 (arXiv:1805.02867) — see :mod:`.online_softmax` — by
keeping, per query row, the running max ``m_i``, the running sum ``l_i`` and the normalised
partial output ``O_i``. Memory is O(N·d) instead of O(N²); the FLOPs stay O(N²·d).

With ``causal`` a tile whose every key lies after every query of the block is skipped, and only
tiles that straddle the diagonal are masked. Taught in chapter 06.
"""

from __future__ import annotations

from typing import Callable

import torch

from llminfra.attention.shapes import (causal_keep, check_attention_call, check_block, check_qkv,
                                       compute_dtype, default_scale, group_queries)

#: on_tile(i0, i1, j0, j1, m_i, l_i, O_i): called after each tile with views of the new state
TileHook = Callable[[int, int, int, int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    *, block_q: int = 512, block_k: int = 256,
                    softmax_scale: float | None = None, io=None,
                    on_tile: TileHook | None = None) -> torch.Tensor:
    """Exact attention, tile by tile, never forming the T x S score matrix.

    Algorithm 1 of Dao et al. 2022 (arXiv:2205.14135): for each key block j (``block_k`` = Bc
    keys), for each query block i (``block_q`` = Br queries)::

        S_ij = Q_i K_jᵀ · scale                        (line 9)
        m~ = rowmax(S_ij); P~ = exp(S_ij - m~); l~ = rowsum(P~)   (line 10)
        m_new = max(m_i, m~); l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~   (line 11)
        O_i = (l_i e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j) / l_new   (line 12)

    Shapes: q ``(B, H, T, d)``, k and v ``(B, H_kv, S, d)`` with ``H_kv | H`` (grouped-query /
    multi-query attention); returns ``(B, H, T, d)`` in q's dtype. Any T, S (not only multiples
    of the blocks); 16-bit inputs are computed in float32.

    ``causal``: the T queries are the LAST T of the S positions (decoding with a KV cache):
    query i may see keys ``j <= S - T + i``; tiles entirely above that diagonal are skipped. A
    query that sees no key at all (T > S) gets a zero output row, as in :func:`naive_attention`.
    ``causal`` must be a bool. Forward only (Algorithm 1; the backward pass is the paper's
    Algorithm 4): inputs that require grad are refused while autograd records.

    Default blocks (512 queries x 256 keys, a 512 KB fp32 score tile) suit a CPU, where each
    tile costs a dozen PyTorch calls and bigger tiles amortise them; the paper sizes tiles to a
    GPU's SRAM instead (:func:`~llminfra.attention.io_accounting.flash_block_sizes`).

    ``io`` (an :class:`~llminfra.attention.io_accounting.IOCounter`) is told every load from and
    store to slow memory of Algorithm 1; ``on_tile`` is called after every tile (the chapter's
    tile stepper uses it).
    """
    B, H, H_kv, T, S, d = check_qkv(q, k, v)
    causal = check_attention_call("flash_attention", causal, q, k, v)
    Br, Bc = check_block("block_q", block_q), check_block("block_k", block_k)
    work = compute_dtype(q.dtype)
    scale = default_scale(d, softmax_scale)
    Q = group_queries(q, H_kv).to(work) * scale  # scale folded into Q once (B, H_kv, G, T, d)
    K, V = k.to(work).unsqueeze(2), v.to(work).unsqueeze(2)  # (B, H_kv, 1, S, d)
    O = torch.zeros_like(Q)                                  # (B, H_kv, G, T, d)   line 2
    l = Q.new_zeros(Q.shape[:-1] + (1,))                     # (B, H_kv, G, T, 1)
    m = torch.full_like(l, float("-inf"))                    # (B, H_kv, G, T, 1)
    offset = S - T  # query i sits at position offset + i
    for j0 in range(0, S, Bc):                                             # line 5
        j1 = min(j0 + Bc, S)
        K_j, V_j = K[..., j0:j1, :], V[..., j0:j1, :]                      # line 6
        if io is not None:
            io.load(K_j, V_j)
        first_i = max(0, j0 - offset) // Br * Br if causal else 0  # earlier blocks: all masked
        for i0 in range(first_i, T, Br):                                   # line 7
            i1 = min(i0 + Br, T)
            _tile(Q, O, l, m, K_j, V_j, i0, i1, j0, j1, causal, T, S, io)
            if on_tile is not None:
                on_tile(i0, i1, j0, j1, m[..., i0:i1, :], l[..., i0:i1, :], O[..., i0:i1, :])
    return O.reshape(B, H, T, d).to(q.dtype)


def _tile(Q, O, l, m, K_j, V_j, i0, i1, j0, j1, causal, T, S, io) -> None:
    """Lines 8-13 of Algorithm 1 for query block [i0, i1) and key block [j0, j1), in place."""
    Q_i, O_i, l_i, m_i = Q[..., i0:i1, :], O[..., i0:i1, :], l[..., i0:i1, :], m[..., i0:i1, :]
    if io is not None:
        io.load(Q_i, O_i, l_i, m_i)                                        # line 8
    S_ij = torch.matmul(Q_i, K_j.transpose(-2, -1))  # (..., Br, Bc), Q carries the scale  line 9
    if causal and (S - T) + i0 < j1 - 1:  # the tile crosses the diagonal: mask part of it
        S_ij.masked_fill_(~causal_keep(T, S, slice(i0, i1), slice(j0, j1), S_ij.device),
                          float("-inf"))
    m_t = S_ij.amax(dim=-1, keepdim=True)                                  # line 10
    P_t = S_ij.sub_(_finite(m_t)).exp_()                       # P~_ij, reusing S_ij's memory
    l_t = P_t.sum(dim=-1, keepdim=True)
    m_new = torch.maximum(m_i, m_t)                                        # line 11
    m_use = _finite(m_new)
    a, b = torch.exp(m_i - m_use), torch.exp(m_t - m_use)  # e^(m_i - m_new), e^(m~ - m_new)
    l_new = a * l_i + b * l_t  # >= 1 once the row has seen a key (its max adds e^0 = 1), else 0
    l_div = l_new.clamp(min=1.0)  # so a row that has seen no key keeps O_i = 0
    O_i.mul_(l_i * a / l_div).add_(torch.matmul(P_t, V_j).mul_(b / l_div))  # line 12
    l_i.copy_(l_new)                                                       # line 13
    m_i.copy_(m_new)
    if io is not None:
        io.store(O_i, l_i, m_i)


def _finite(m: torch.Tensor) -> torch.Tensor:
    """Row maxima with -inf (a row that has seen no unmasked key yet) replaced by 0, so that
    ``exp(x - m)`` gives 0 for masked x instead of ``exp(-inf + inf) = nan``."""
    return m.nan_to_num(neginf=0.0)
