"""fp32 products of a few rows on the package's C library: a decode step read as one stream of W.

At batch 1 a decode step multiplies one row by every weight matrix, so it is a stream of the
weights through the core: its time is the weights' bytes over the bandwidth the kernel draws.
oneDNN and MKL block their loops for big products, and for one row they draw less of the
bandwidth than a plain sum over the same bytes. ``f32_skinny.c`` (in the library, on its thread
pool) reads each thread's run of ``W``'s rows front to back against the rows of ``x`` held in
L1, as llama.cpp does for F32 weights, four rows of ``W`` at a time (four forward streams, and
each load of ``x`` meets four rows: a register block of 4 × 6 accumulators where the CPU has
AVX-512). Past two rows its arithmetic (a dot product per output, summed across its lanes at
the end) costs more than a blocked loop's, so :func:`kernel` hands it products of at most
:data:`MAX_ROWS` rows. Products of more rows (a decode step of many sequences, a prompt chunk;
up to :data:`PANEL_MAX_ROWS`, no limit unless a caller sets one) go to ``f32_panels.c``: ``W``
packed once in panels of 16 columns, each x value broadcast against 16 columns into a tile of 8
rows' accumulators, no per-output sums — as fast as oneDNN's prepacked weights there and faster
than ``F.linear`` where MKL takes a slower path (AMD's CPUs), so no oneDNN copy of the weights
is kept. :class:`llminfra.runner.fused.SkinnyMatmul` routes the rows. What serving on these
kernels gives is recorded in ``llminfra/data/compare_engines_cpu.json`` and
``profile_serving_cpu.json`` (``settings.matmul == "skinny"``; chapter 12 measures the products
on the machine running it). Each output is a sum over ``K`` in order in either kernel, whatever
the block, the row count or the thread: the same bits for any thread count and any batch in
each kernel's range. RMSNorm and SwiGLU are formed inside the call (SiLU's exp the w4a8 kernel's
own), on the threads where the rows are many. ``W`` lives on 2 MB pages (:mod:`.huge_pages`), as
its panels do. Chapters 08 and 12.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from llminfra.kernels.abi import refusal
from llminfra.kernels.huge_pages import Arena
from llminfra.kernels.library import (PooledKernel, ThreadPool, _check_threads, check_cpu,
                                     library)

#: products of at most this many rows go to ``f32_skinny.c`` (see the module)
MAX_ROWS = 2
#: products of more rows, up to this many (no limit: a decode step of many sequences, a prompt
#: chunk), go to ``f32_panels.c``; more, where a caller sets a lower limit, to ``F.linear``
PANEL_MAX_ROWS = 2 ** 31 - 1


@dataclass(frozen=True)
class SkinnyKernel(PooledKernel):
    """The library's ``f32_skinny_gemm`` (``fn``) on its thread pool (``owner``; ``pool`` and
    ``threads`` are read from it) and the most rows a product may have to be sent to it."""

    max_rows: int = MAX_ROWS
    #: the library's ``f32_panel_gemm`` and ``f32_panel_pack``: products of more
    #: than ``max_rows`` and at most ``panel_max_rows`` rows on W packed in panels of 16 columns
    panel: ctypes._CFuncPtr | None = None
    panel_pack: ctypes._CFuncPtr | None = None
    panel_max_rows: int = 0
    #: where the weights and their panels live: 2 MB pages (:mod:`.huge_pages`)
    arena: Arena | None = None


def _check_rows(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def kernel(threads: int | None = None, max_rows: int = MAX_ROWS,
           panel_max_rows: int = PANEL_MAX_ROWS) -> SkinnyKernel:
    """The kernel on a :class:`~llminfra.kernels.w4a8.ThreadPool` of ``threads`` (None: torch's
    thread count); products of more than ``max_rows`` rows up to ``panel_max_rows`` (0: none)
    on ``f32_panels.c``. ``RuntimeError`` where the library cannot be built (no C compiler),
    ``ValueError`` for a thread count outside 1..64 or a row count below 0."""
    _check_rows("max_rows", max_rows)
    _check_rows("panel_max_rows", panel_max_rows)
    lib = library()
    pool = ThreadPool(_check_threads(threads), lib)
    return SkinnyKernel(lib.f32_skinny_gemm, pool, max_rows, lib.f32_panel_gemm,
                        lib.f32_panel_pack, panel_max_rows, Arena())


def f32_mm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
           threads: int | None = None) -> torch.Tensor:
    """``residual + x · Wᵀ`` (``x`` ``(M, K)``, ``W`` ``(N, K)``, ``residual`` ``(M, N)`` or None)
    on ``f32_skinny.c`` for any M, on ``threads`` threads started for the call: for checking
    it. ``ValueError`` naming a tensor that is not float32 on the CPU (the C code reads its
    memory raw) or shapes that do not fit."""
    threads = _check_threads(threads)
    for name, t in (("x", x), ("weight", weight), ("residual", residual)):
        if t is not None:
            check_cpu(name, t, torch.float32)
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"x and weight must be 2-D, got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    (M, K), (N, K2) = x.shape, weight.shape
    if K != K2:
        raise ValueError(f"x has {K} features, the weight {K2}: x (M, K) · W (N, K)ᵀ")
    if residual is not None and tuple(residual.shape) != (M, N):
        raise ValueError(f"residual must have shape {(M, N)}, got {tuple(residual.shape)}")
    x, weight = x.contiguous(), weight.contiguous()
    residual = None if residual is None else residual.contiguous()
    y = torch.empty(M, N)
    status = library().f32_skinny_gemm(x.data_ptr(), weight.data_ptr(),
                                       None if residual is None else residual.data_ptr(),
                                       y.data_ptr(), M, N, K, K, 0, None, 0.0, threads, None)
    if status:
        raise ValueError(f"{refusal('f32_skinny_gemm', status)}: M = {M}, N = {N}, K = {K}")
    return y
