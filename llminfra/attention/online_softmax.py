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
