"""A step-by-step record of tiled attention, for the chapter's tile stepper.

Runs :func:`~llminfra.attention.flash_attention` (Dao et al. 2022, arXiv:2205.14135,
Algorithm 1) on one head with an :class:`~.io_accounting.IOCounter` and the ``on_tile`` hook, and
keeps after every tile: which tile, the running max ``m``, running sum ``l`` and partial output
``O`` of every query row, the bytes moved to and from slow memory so far, and the bytes held in
fast memory by that tile. Chapter 06.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llminfra.attention.flash import flash_attention
from llminfra.attention.io_accounting import IOCounter
from llminfra.attention.naive import naive_attention


@dataclass(frozen=True)
class TileStep:
    """State after one tile: rows [i0, i1) x keys [j0, j1); ``m``, ``l`` ``(T,)`` and ``O``
    ``(T, d)`` for all rows (rows not reached yet hold -inf / 0 / 0)."""

    index: int
    i0: int
    i1: int
    j0: int
    j1: int
    m: torch.Tensor
    l: torch.Tensor
    O: torch.Tensor
    slow_read_bytes: int
    slow_write_bytes: int
    fast_bytes: int


@dataclass(frozen=True)
class TileTrace:
    """Every step of one tiled run, the final output, and the naive run's totals beside it."""

    steps: tuple[TileStep, ...]
    T: int
    S: int
    block_q: int
    block_k: int
    causal: bool
    output: torch.Tensor
    naive_output: torch.Tensor
    naive_slow_bytes: int
    naive_peak_scores_bytes: int


def tile_trace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
               block_q: int = 4, block_k: int = 4) -> TileTrace:
    """Trace tiled attention on ``(T, d)`` / ``(S, d)`` inputs of one head, tile by tile.

    ``fast_bytes`` of a step is what Algorithm 1 holds on chip for it: ``Q_i, O_i`` (Br·d each),
    ``K_j, V_j`` (Bc·d each), ``S_ij`` (Br·Bc) and ``l_i, m_i`` (Br each), times the element size.
    """
    if q.dim() != 2 or k.dim() != 2 or v.dim() != 2:
        raise ValueError(f"tile_trace wants one head: q (T, d), k and v (S, d); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    q4, k4, v4 = (x[None, None] for x in (q, k, v))
    T, S, d = q.shape[0], k.shape[0], q.shape[1]
    io, m_all, l_all, O_all = IOCounter(), [], [], []
    m_now = torch.full((T,), float("-inf"), dtype=torch.float64)
    l_now = torch.zeros(T, dtype=torch.float64)
    O_now = torch.zeros(T, d, dtype=torch.float64)
    steps = []

    def record(i0, i1, j0, j1, m, l, O):
        m_now[i0:i1], l_now[i0:i1], O_now[i0:i1] = m.flatten(), l.flatten(), O.reshape(-1, d)
        elem = O.element_size()
        fast = elem * (2 * (i1 - i0) * d + 2 * (j1 - j0) * d + (i1 - i0) * (j1 - j0) + 2 * (i1 - i0))
        steps.append(TileStep(len(steps), i0, i1, j0, j1, m_now.clone(), l_now.clone(),
                              O_now.clone(), io.read_bytes, io.write_bytes, fast))

    out = flash_attention(q4, k4, v4, causal, block_q=block_q, block_k=block_k, io=io,
                          on_tile=record)
    naive_io = IOCounter()
    naive_out = naive_attention(q4, k4, v4, causal, io=naive_io)
    scores_bytes = T * S * 4  # naive_attention forms the T x S scores in float32
    return TileTrace(tuple(steps), T, S, block_q, block_k, causal, out[0, 0], naive_out[0, 0],
                     naive_io.total_bytes, scores_bytes)
