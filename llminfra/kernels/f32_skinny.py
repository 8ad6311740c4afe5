"""fp32 products of a few rows on the package's C kernel: a decode step read as one stream of W.

At batch 1 a decode step multiplies one row by every weight matrix, so it is a stream of the
weights through the core: its time is the weights' bytes over the bandwidth the kernel draws.
oneDNN and MKL block their loops for big products; for one row on this 2-core AMD EPYC they drew
about 12–15 GB/s from SmolLM2-135M's layers on one thread, where a plain sum over the same bytes
draws 27 GB/s. ``f32_skinny.c`` (beside this file, in the w4a8 library, on its thread pool)
reads each thread's run of ``W``'s rows front to back against the rows of ``x`` held in L1, as
llama.cpp does for F32 weights, four rows of ``W`` at a time (four forward streams, and each
load of ``x`` meets four rows: a register block of 4 × 6 accumulators where the CPU has AVX-512).
SmolLM2-135M's 30 layers (425 MB) from memory, ms per pass, the fastest of three:

=====  =======  ==============================  ==============================
rows   threads  AMD EPYC, 2026-12-05 (one row    Intel Xeon, 2026-12-05 (4-row
                a time): f32_skinny / oneDNN    blocks): f32_skinny / oneDNN
                prepacked / F.linear (MKL)      prepacked / F.linear (MKL)
=====  =======  ==============================  ==============================
1      1        16.9 / 28.6 / 32.2              28.9 / 33.6 / 30.8
2      1        19.6 / 34.4 / 52.0              35.0 / 36.0 / 33.2
4      1        30.1 / 22.3 / 43.9              43.6 / 36.4 / 54.5
1      2        14.0 / 20.2 / 35.0              15.3 / 19.6 / 15.6
2      2        13.8 / 20.4 / 52.3              18.4 / 21.0 / 17.3
4      2        16.7 / 16.3 / 45.9              22.6 / 22.5 / 32.3
=====  =======  ==============================  ==============================

On the Xeon, Intel's MKL keeps up with the kernel for one or two rows (on the EPYC it does not);
oneDNN's blocked loops win from four rows on both: past two rows the kernel's arithmetic (a
dot product per output, summed across its 16 lanes at the end) costs more than oneDNN's, so
:func:`skinny_linear` hands it products of at most :data:`MAX_ROWS` rows. Products of more rows
(a decode step of many sequences, a prompt chunk; up to :data:`PANEL_MAX_ROWS`, no limit unless
a caller sets one) go to ``f32_panels.c``: ``W`` packed once in panels of 16 columns, each x
value broadcast against 16 columns into a tile of 8 rows' accumulators, no per-output sums. One
layer's product on one Xeon thread against oneDNN's prepacked one (2026-12-06): 1.2–1.75× as
fast at 8 and 16 rows, about even from 65 to 512. On the AMD EPYC (2026-12-06, two threads, 30
layers' weights from memory) the panels and oneDNN's prepacked weights are even from 4 to 512
rows (118 rows: 63.9 against 63.5 ms), where ``F.linear`` (MKL, which takes a slower path on
AMD's CPUs) took 154 ms: a 100-token prompt's forward 198 → 100 ms. So no oneDNN copy of the
weights is kept, and no prompt goes to ``F.linear``. The engine's decode step of SmolLM2-135M on
two threads: 4 sequences 32.0 → 25.6–26.4 ms, 16 sequences 48–49 → 43–45 ms (Xeon;
:class:`llminfra.runner.fused.SkinnyMatmul` routes the rows). Each output is a sum over ``K`` in
order in either kernel, whatever the block, the row count or the thread: the same bits for any
thread count and any batch in each kernel's range. RMSNorm and SwiGLU are formed inside the
call (SiLU's exp the w4a8 kernel's own), on the threads where the rows are many. ``W`` lives on
2 MB pages (:mod:`.huge_pages`), as its panels do. Chapter 08 (where a decode step's time goes).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from llminfra.kernels.huge_pages import Arena
from llminfra.kernels.library import ThreadPool, _check_threads, library

#: products of at most this many rows go to the C kernel (see the table above)
MAX_ROWS = 2
#: products of more rows, up to this many (no limit: a decode step of many sequences, a prompt
#: chunk), go to ``f32_panels.c``; more, where a caller sets a lower limit, to ``F.linear``
PANEL_MAX_ROWS = 2 ** 31 - 1


@dataclass(frozen=True)
class SkinnyKernel:
    """The C function ``f32_skinny_gemm``, the thread pool it runs on (its handle), its thread
    count and the most rows a product may have to be sent to it."""

    fn: ctypes._CFuncPtr
    pool: int | None
    threads: int
    max_rows: int
    owner: ThreadPool           # keeps the pool's workers alive while the kernel is in use
    #: ``f32_panel_gemm`` and ``f32_panel_pack`` (:func:`_panel_functions`): products of more
    #: than ``max_rows`` and at most ``panel_max_rows`` rows on W packed in panels of 16 columns
    panel: ctypes._CFuncPtr | None = None
    panel_pack: ctypes._CFuncPtr | None = None
    panel_max_rows: int = 0
    #: where the weights and their panels live: 2 MB pages (:mod:`.huge_pages`)
    arena: Arena | None = None


def _function(lib: ctypes.CDLL):
    fn = lib.f32_skinny_gemm
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, p, p, p, i, i, i, i, i, p, ctypes.c_float, i, p]
    fn.restype = i
    return fn


def _panel_functions(lib: ctypes.CDLL):
    gemm, pack = lib.f32_panel_gemm, lib.f32_panel_pack
    p, i = ctypes.c_void_p, ctypes.c_int
    gemm.argtypes = [p, p, p, p, i, i, i, i, i, p, ctypes.c_float, i, p]
    pack.argtypes = [p, p, i, i]
    gemm.restype = pack.restype = i
    return gemm, pack


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
    gemm, pack = _panel_functions(lib)
    return SkinnyKernel(_function(lib), pool.handle, pool.threads, max_rows, pool, gemm, pack,
                        panel_max_rows, Arena())


def f32_mm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
           threads: int | None = None) -> torch.Tensor:
    """``residual + x · Wᵀ`` (``x`` ``(M, K)``, ``W`` ``(N, K)``, ``residual`` ``(M, N)`` or None)
    on the C kernel for any M, on ``threads`` threads started for the call: for checking it.
    ``ValueError`` for shapes that do not fit or a dtype other than float32."""
    threads = _check_threads(threads)
    for name, t in (("x", x), ("weight", weight)):
        if t.dim() != 2 or t.dtype != torch.float32 or t.device.type != "cpu":
            raise ValueError(f"{name} must be a 2-D float32 CPU tensor, got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")
    (M, K), (N, K2) = x.shape, weight.shape
    if K != K2:
        raise ValueError(f"x has {K} features, the weight {K2}: x (M, K) · W (N, K)ᵀ")
    if residual is not None and (tuple(residual.shape) != (M, N) or
                                 residual.dtype != torch.float32):
        raise ValueError(f"residual must be float32 of shape {(M, N)}, got {residual.dtype} "
                         f"{tuple(residual.shape)}")
    x, weight = x.contiguous(), weight.contiguous()
    residual = None if residual is None else residual.contiguous()
    y = torch.empty(M, N)
    status = _function(library())(x.data_ptr(), weight.data_ptr(),
                                  None if residual is None else residual.data_ptr(),
                                  y.data_ptr(), M, N, K, K, 0, None, 0.0, threads, None)
    if status:
        raise ValueError(f"f32_skinny_gemm refused M = {M}, N = {N}, K = {K}")
    return y
