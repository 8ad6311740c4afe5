"""Bytes moved between slow and fast memory by naive and tiled attention, counted and predicted.

Theorem 2 of Dao et al. 2022 (FlashAttention, arXiv:2205.14135): with sequence length N, head
dimension d and a fast memory (SRAM) of M elements, d ≤ M ≤ N·d,

* standard attention (their Algorithm 0) makes Θ(N·d + N²) accesses to slow memory (HBM),
* FlashAttention (their Algorithm 1) makes Θ(N²·d²/M).

The PyTorch versions report every load and store of those algorithms to an :class:`IOCounter`
(``naive_attention(..., io=counter)``, ``flash_attention(..., io=counter)``); the block sizes of
Algorithm 1 line 1 come from M (:func:`flash_block_sizes`). :func:`io_table` sets the counts
against the two formulas. Taught in chapter 06.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llminfra.attention.flash import flash_attention
from llminfra.attention.naive import naive_attention


@dataclass
class IOCounter:
    """Running totals of bytes read from and written to slow memory (one per measured call)."""

    read_bytes: int = 0
    write_bytes: int = 0

    def load(self, *tensors: torch.Tensor) -> None:
        """Record reading ``tensors`` from slow into fast memory."""
        self.read_bytes += sum(t.numel() * t.element_size() for t in tensors)

    def store(self, *tensors: torch.Tensor) -> None:
        """Record writing ``tensors`` from fast back to slow memory."""
        self.write_bytes += sum(t.numel() * t.element_size() for t in tensors)

    @property
    def total_bytes(self) -> int:
        """Bytes read plus bytes written."""
        return self.read_bytes + self.write_bytes


def flash_block_sizes(d: int, sram_elements: int) -> tuple[int, int]:
    """Line 1 of Algorithm 1 (arXiv:2205.14135): ``Bc = ceil(M / 4d)``, ``Br = min(Bc, d)``.

    Returns ``(Br, Bc)`` = (query rows, key columns) per tile. Example: d = 64, M = 16384
    elements (64 KiB of fp32) → Bc = 64, Br = 64.
    """
    if d < 1 or sram_elements < d:
        raise ValueError(f"need d >= 1 and M >= d (Theorem 2 assumes d <= M), "
                         f"got d={d}, M={sram_elements}")
    Bc = math.ceil(sram_elements / (4 * d))
    return min(Bc, d), Bc


def theorem2_naive_elements(N: int, d: int) -> int:
    """The Θ term of standard attention, ``N·d + N²`` elements (Theorem 2, no constant)."""
    return N * d + N * N


def theorem2_flash_elements(N: int, d: int, sram_elements: int) -> float:
    """The Θ term of FlashAttention, ``N²·d² / M`` elements (Theorem 2, no constant)."""
    return N * N * d * d / sram_elements


def measure_io(N: int, d: int, sram_elements: int, causal: bool = False,
               generator: torch.Generator | None = None) -> dict:
    """Run both PyTorch versions once on random fp32 ``(1, 1, N, d)`` inputs with counters on.

    Returns bytes read+written by each, the two Theorem 2 terms (in bytes, 4 per element) and
    the ratio count / formula, which Theorem 2 says stays bounded as N, d, M vary.
    """
    q, k, v = (torch.randn(1, 1, N, d, generator=generator) for _ in range(3))
    Br, Bc = flash_block_sizes(d, sram_elements)
    naive_io, flash_io = IOCounter(), IOCounter()
    naive_attention(q, k, v, causal, io=naive_io)
    flash_attention(q, k, v, causal, block_q=Br, block_k=Bc, io=flash_io)
    naive_formula = 4 * theorem2_naive_elements(N, d)
    flash_formula = 4 * theorem2_flash_elements(N, d, sram_elements)
    return {"N": N, "d": d, "sram_elements": sram_elements, "causal": causal,
            "block_q": Br, "block_k": Bc,
            "naive_bytes": naive_io.total_bytes, "flash_bytes": flash_io.total_bytes,
            "naive_formula_bytes": naive_formula, "flash_formula_bytes": flash_formula,
            "naive_ratio": naive_io.total_bytes / naive_formula,
            "flash_ratio": flash_io.total_bytes / flash_formula}


def io_table(Ns: list[int], d: int, sram_elements: list[int], causal: bool = False,
             generator: torch.Generator | None = None) -> list[dict]:
    """:func:`measure_io` for every N and every fast-memory size M (one row each)."""
    return [measure_io(N, d, M, causal, generator) for N in Ns for M in sram_elements]
