"""Softmax in one pass over the data: the online normaliser of Milakov & Gimelshein 2018.

Milakov & Gimelshein 2018, "Online normalizer calculation for softmax", arXiv:1805.02867,
Algorithm 3. The safe softmax ``exp(x - max x) / Σ exp(x - max x)`` needs the max before the sum
(two passes over x, then a third to normalise). The online version keeps a running max ``m`` and
a running sum ``l`` of ``exp(x - m)``, and rescales the sum whenever the max grows::

    m_new = max(m, x_j)
    l_new = l · e^(m - m_new) + e^(x_j - m_new)

Processing a block of values at a time, and merging two partial ``(m, l)`` pairs, follow the same
rule (:func:`merge_stats`); FlashAttention (:mod:`.flash`) applies it tile by tile. Chapter 06.
"""

from __future__ import annotations

import torch

from llminfra.attention.shapes import check_block


def safe_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The three-pass safe softmax ``exp(x - max x) / Σ exp(x - max x)`` along ``dim``.

    Worked example: x = [1, 2, 3] → max 3, exps [e^-2, e^-1, 1] = [0.1353, 0.3679, 1], sum
    1.5032 → [0.0900, 0.2447, 0.6652]. A row of all ``-inf`` gives zeros (no mass to spread).
    """
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(x - m)
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


def merge_stats(m_a: torch.Tensor, l_a: torch.Tensor, m_b: torch.Tensor,
                l_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial softmax statistics ``(m, l)`` into the pair for the union of their values.

    ``m = max(m_a, m_b)``, ``l = l_a e^(m_a - m) + l_b e^(m_b - m)`` (Milakov & Gimelshein 2018,
    arXiv:1805.02867, section 3.1). ``m = -inf`` with ``l = 0`` is the empty set, and merging with
    it changes nothing. Example: ([1], [1]) merged with ([3], [1]) → (3, 1 + e^-2 = 1.1353).
    """
    m = torch.maximum(m_a, m_b)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    l = l_a * torch.exp(m_a - m_safe) + l_b * torch.exp(m_b - m_safe)
    return m, l


def online_softmax_stats(x: torch.Tensor, block_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Running max ``m`` and running sum ``l = Σ exp(x - m)`` over the last dim, in ONE pass that
    reads ``block_size`` values at a time (Algorithm 3 of arXiv:1805.02867 with blocks).

    Shapes: x ``(..., n)`` → m, l each ``(..., 1)``.
    """
    check_block("block_size", block_size)
    m = x.new_full(x.shape[:-1] + (1,), float("-inf"))
    l = x.new_zeros(x.shape[:-1] + (1,))
    for j0 in range(0, x.shape[-1], block_size):
        x_j = x[..., j0:j0 + block_size]
        m_j = x_j.amax(dim=-1, keepdim=True)
        m_j_safe = torch.where(torch.isinf(m_j), torch.zeros_like(m_j), m_j)
        l_j = torch.exp(x_j - m_j_safe).sum(dim=-1, keepdim=True)
        m, l = merge_stats(m, l, m_j, l_j)
    return m, l


def online_softmax(x: torch.Tensor, block_size: int = 1) -> torch.Tensor:
    """Softmax over the last dim from the one-pass statistics: ``exp(x - m) / l``.

    Equals :func:`safe_softmax` (a test ties them). Shapes: x ``(..., n)`` → ``(..., n)``.
    Rows of all ``-inf`` give zeros.
    """
    m, l = online_softmax_stats(x, block_size)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return torch.exp(x - m) / torch.where(l == 0, torch.ones_like(l), l)


def merge_partials(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
                   lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results over disjoint key sets into the result over their union.

    A partial result is the normalised output ``o = Σ_j e^(s_j - lse) v_j`` over its keys and its
    log-sum-exp ``lse = log Σ_j e^(s_j)``. Read as softmax statistics it is ``(m, l) = (lse, 1)``,
    so :func:`merge_stats` gives ``(m, l)`` for the union and::

        lse = m + log l,    o = (o_a e^(lse_a - m) + o_b e^(lse_b - m)) / l

    This is line 12 of FlashAttention's Algorithm 1 (Dao et al. 2022, arXiv:2205.14135) applied
    to two whole blocks: how ring attention (Liu, Zaharia, Abbeel 2023, arXiv:2310.01889) merges
    the block that just arrived, and how Flash-Decoding (Dao et al. 2023, "Flash-Decoding for
    long-context inference", blog, Oct 2023) reduces its split-KV partials. A row with no keys
    (``lse = -inf``, ``o = 0``) is the empty set: merging with it changes nothing, and two empty
    rows stay empty.

    Shapes: o ``(..., T, d)``, lse ``(..., T, 1)``; returns ``(o, lse)`` of the same shapes.
    Worked example (d = 1): a row with keys scores [0] and values [1] (o = 1, lse = 0) merged with
    scores [0], values [3] (o = 3, lse = 0) → o = 2, lse = log 2 = 0.6931. Taught in chapters 06
    and 11.
    """
    l_a = (lse_a > float("-inf")).to(lse_a.dtype)  # 1 for a non-empty partial, 0 for empty
    l_b = (lse_b > float("-inf")).to(lse_b.dtype)
    m, l = merge_stats(lse_a, l_a, lse_b, l_b)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(lse_a - m_safe), torch.exp(lse_b - m_safe)
    o = (o_a * w_a + o_b * w_b) / torch.where(l == 0, torch.ones_like(l), l)
    return o, m + torch.log(l)
