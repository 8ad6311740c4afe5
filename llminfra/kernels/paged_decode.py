"""Decode attention through block tables in C: the CPU counterpart of the Triton paged kernel.

The engine's decode step on a CPU gathered every sequence's K/V blocks out of the paged pool
(``index_select``) and ran SDPA over the padded length: at 16 sequences of SmolLM2-135M that was
a third of the step. ``paged_decode.c`` beside this file (built into the w4a8 library, on its
thread pool) walks each sequence's block table up to its length and reads the keys where they
lie, with an online softmax in fp32: no gather copy, no padded keys. A work unit is a sequence
with all its heads (a K/V head of a sequence where there are fewer than 4 sequences a thread);
each head's arithmetic is the same whichever unit holds it, so any thread count gives the same
bits. Measured 2026-12-05 on the 2-core EPYC, 16 sequences of 100–450 tokens, 30 layers:
60.5 → 25.1 ms on one thread, 29.0 → 13.9 ms on two.

The engine gets it the way it gets its matmul kernels: from the ``linear`` that ``serve``
hands it (:class:`llminfra.kernels.f32_skinny.skinny_linear` carries one, and ``serve`` gives the
w4a8 linear one), as its ``paged_decode``; :class:`llminfra.runner.fused.FusedWeights` keeps it
and :func:`llminfra.runner.fast_step.decode_step` calls it, one ctypes call a layer.
It brings ``rope_write_f32`` too (same file): the step's RoPE on q and k and its K/V write to
the pool slots, one call a layer where the torch path makes ten. :func:`paged_attention_c` is
the checked form of the attention, for tests and notebooks. Chapter 05.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from llminfra.kernels.library import ThreadPool, _check_threads, library

#: what ``paged_decode_f32`` returns for input it refuses
C_KERNEL_ERRORS = {-2: "a size or thread count out of range",
                   -3: "a context length outside 1 .. W·B (the block table's keys)",
                   -4: "a block id of a table outside the pool",
                   -5: "no memory for a thread's state"}


@dataclass(frozen=True)
class PagedDecodeKernel:
    """``paged_decode_f32`` with its argument types, the thread pool it runs on (its handle and
    thread count) and the meaning of its error codes."""

    fn: ctypes._CFuncPtr
    pool: int | None
    threads: int
    errors: dict
    owner: ThreadPool              # keeps the pool's workers alive while the kernel is in use
    #: ``rope_write_f32``: a decode step's RoPE and K/V write in one call (:func:`rope_function`)
    rope_write: ctypes._CFuncPtr | None = None


def c_function(lib: ctypes.CDLL):
    """``paged_decode_f32`` of a build of the w4a8 library with its argument types."""
    fn = lib.paged_decode_f32
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, ctypes.c_long, p, p, p, p, p, i, i, i, i, i, i, i, ctypes.c_float, i, p]
    fn.restype = i
    return fn


def rope_function(lib: ctypes.CDLL):
    """``rope_write_f32`` of a build of the w4a8 library with its argument types: RoPE on the
    query and key heads of a step's ``qkv`` rows in place, and their keys and values copied to
    their pool slots (``paged_decode.c``)."""
    fn = lib.rope_write_f32
    p, i, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    fn.argtypes = [p, i, L, p, p, L, i, i, i, p, L, p, p]
    fn.restype = i
    return fn


def kernel(threads: int | None = None, pool: ThreadPool | None = None) -> PagedDecodeKernel:
    """The kernel on ``pool`` (a matmul kernel's, shared: the calls of a step come one after
    another), else on a new :class:`~llminfra.kernels.w4a8.ThreadPool` of ``threads`` (None:
    torch's thread count). ``RuntimeError`` where the library cannot be built."""
    lib = library()
    pool = ThreadPool(_check_threads(threads), lib) if pool is None else pool
    return PagedDecodeKernel(c_function(lib), pool.handle, pool.threads, C_KERNEL_ERRORS, pool,
                             rope_function(lib))


def c_attend(kernel, block_tables: torch.Tensor, lens: torch.Tensor, K: torch.Tensor,
             heads: tuple[int, int, int], q_row: int):
    """``attend(q, pool)`` on the C paged decode kernel ``kernel``
    (:class:`llminfra.kernels.paged_decode.PagedDecodeKernel`): each sequence's blocks read in
    place up to its length (``lens`` ``(n,)``), one ctypes call a layer, into one ``(n, H·d)``
    buffer. ``K`` a K pool (its shape), ``heads`` ``(H, H_kv, d)``; q ``(n, H, d)`` with unit
    strides in a row of heads, its rows ``q_row`` floats apart."""
    n, W = block_tables.shape
    P, B = K.shape[:2]
    H, H_kv, d = heads
    tables = block_tables.to(torch.int32).contiguous()
    lens = lens.to(torch.int32).contiguous()
    out = torch.empty(n, H * d, dtype=torch.float32)      # every layer's: wo.add reads it first
    fn = kernel.fn
    rest = (tables.data_ptr(), lens.data_ptr(), out.data_ptr(), n, H, H_kv, d, B, W, P,
            d ** -0.5, kernel.threads, kernel.pool)

    def attend(q, p, _alive=(tables, lens)):     # the closure holds what rest points into
        rc = fn(q.data_ptr(), q_row, p[2].data_ptr(), p[3].data_ptr(), *rest)
        if rc:
            raise ValueError(f"paged_decode_f32 refused its input: "
                             f"{kernel.errors.get(rc, rc)}")
        return out
    return attend


@functools.cache
def _kernel_on(threads: int) -> PagedDecodeKernel:
    """One kernel (and thread pool) per thread count for :func:`paged_attention_c`."""
    return kernel(threads)


def paged_attention_c(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, context_lens: torch.Tensor,
                      threads: int | None = None) -> torch.Tensor:
    """Decode attention through block tables on the C kernel, checked: the contract of
    :func:`llminfra.attention.paged_triton.paged_attention_triton` on CPU fp32 tensors. q
    ``(N, H, d)``; K and V pools ``(num_blocks, B, H_kv, d)``; ``block_tables`` ``(N, W)``;
    ``context_lens`` ``(N,)`` in 1 .. W·B; ``threads`` 1 .. 64 (None: torch's thread count).
    Returns ``(N, H, d)``. ``ValueError`` for what the kernel cannot read, ``RuntimeError``
    where the w4a8 library does not build."""
    k = _kernel_on(_check_threads(threads))
    tensors = (q, k_cache, v_cache, block_tables, context_lens)
    if any(not isinstance(t, torch.Tensor) or t.device.type != "cpu" for t in tensors) or \
            any(t.dtype != torch.float32 for t in tensors[:3]) or \
            any(t.is_floating_point() for t in tensors[3:]):
        raise ValueError("q, k_cache and v_cache must be fp32 CPU tensors, block_tables and "
                         "context_lens integer CPU tensors")
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape or \
            k_cache.shape[3] != q.shape[2] or q.shape[1] % k_cache.shape[2] or \
            block_tables.dim() != 2 or block_tables.shape[0] != q.shape[0] or \
            context_lens.shape != (q.shape[0],):
        raise ValueError(f"need q (N, H, d), pools (num_blocks, B, H_kv, d) with H a multiple "
                         f"of H_kv, block_tables (N, W), context_lens (N,); got q "
                         f"{tuple(q.shape)}, pools {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)}, {tuple(block_tables.shape)}, "
                         f"{tuple(context_lens.shape)}")
    (N, H, d), H_kv = q.shape, k_cache.shape[2]
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    attend = c_attend(k, block_tables, context_lens, k_cache, (H, H_kv, d), H * d)
    return attend(q, (None, None, k_cache, v_cache)).view(N, H, d)
