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
from llminfra.kernels.library import (INT32, PooledKernel, ThreadPool, _check_threads,
                                     check_cpu, check_range, library)

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


def check_weight(weight: torch.Tensor) -> tuple[int, int]:
    """``(N, K)`` of a weight the fp32 kernels can read: a 2-D float32 CPU tensor with
    ``1 <= K`` and ``0 <= N``, both below 2**31 (C ``int``); ``ValueError`` naming the dtype
    (and what is allowed), the device or the size otherwise (K = 0 was a ZeroDivisionError). A bf16 or fp16 weight is refused, not converted: the kernels'
    activations, residuals and K/V pools are fp32 too, and a copy in fp32 would double the
    memory of a model kept in 16 bits to halve it (run such a model on ``F.linear``)."""
    if isinstance(weight, torch.Tensor) and weight.dtype != torch.float32 and \
            weight.is_floating_point():
        raise ValueError(f"the fp32 C kernels take float32 weights, got {weight.dtype}: load "
                         f"the model in float32 (model.float()), or run it on matmul='plain' "
                         f"or 'onednn'")
    check_cpu("weight", weight, torch.float32)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
    N, K = weight.shape
    check_range("K (the weight's input width)", K, 1, INT32[1])
    check_range("N (the weight's output rows)", N, 0, INT32[1])
    return N, K


def pack_panels(kernel: SkinnyKernel, weight: torch.Tensor,
                panels: torch.Tensor | None = None) -> torch.Tensor:
    """``weight`` ``(N, K)`` packed by ``f32_panel_pack`` into ``panels`` (``ceil(N/16)·16·K``
    float32, made where None) for ``f32_panel_gemm``: the checked entry of the packing, which
    reads ``weight`` raw (:func:`check_weight`; contiguous)."""
    N, K = check_weight(weight)
    check_cpu("weight", weight, torch.float32, contiguous=True)
    numel = -(-N // 16) * 16 * K
    panels = torch.empty(numel) if panels is None else panels
    check_cpu("panels", panels, torch.float32, contiguous=True)
    if panels.numel() != numel:
        raise ValueError(f"panels must hold {numel} floats (ceil(N/16)·16·K for W "
                         f"{(N, K)}), got {panels.numel()}")
    status = kernel.panel_pack(weight.data_ptr(), panels.data_ptr(), N, K)
    if status:
        raise ValueError(f"{refusal('f32_panel_pack', status)}: W {(N, K)}")
    return panels


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
    N, K2 = check_weight(weight)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K), got shape {tuple(x.shape)}")
    M, K = x.shape
    check_range("M (x's rows)", M, 0, INT32[1])
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
