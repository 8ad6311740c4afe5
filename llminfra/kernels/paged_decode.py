"""Decode attention through block tables in C: the CPU counterpart of the Triton paged kernel.

The engine's decode step on a CPU gathers every sequence's K/V blocks out of the paged pool
(``index_select``) and runs SDPA over the padded length: a copy of every key the step reads,
and keys of padding. ``paged_decode.c`` (in the package's C library, on its thread pool) walks
each sequence's block table up to its length and reads the keys where they lie, with an online
softmax in fp32: no gather copy, no padded keys. A work unit is a sequence with all its heads (a
K/V head of a sequence where there are fewer than 4 sequences a thread); each head's arithmetic
is the same whichever unit holds it, so any thread count gives the same bits. What it takes of
a serving step is the ``"attention: C paged kernel"`` row of the recorded profile
(``llminfra/data/profile_serving_cpu.json``, ``python -m llminfra bench serving-profile``).

The fast runner gets it from its kernel set (:class:`llminfra.runner.kernel_set.KernelSet`'s
``attention``); :class:`llminfra.runner.fused.FusedWeights` keeps it and
:func:`llminfra.runner.fast_step.decode_step` calls it, one ctypes call a layer. It brings
``rope_write_f32`` too (same file): the step's RoPE on q and k and its K/V write to the pool
slots, one call a layer where the torch path makes ten. :func:`paged_attention_c` is the checked
form of the attention, for tests and notebooks. Without the library the step runs torch's
gather and SDPA. Chapter 12.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field

import torch

from llminfra.kernels.abi import ERRORS, Library
from llminfra.kernels.library import (INT32, PooledKernel, ThreadPool, _check_threads,
                                     check_cpu, check_range, library)


@dataclass(frozen=True)
class PagedDecodeKernel(PooledKernel):
    """The library's ``paged_decode_f32`` (``fn``) on its thread pool (``owner``; ``pool`` and
    ``threads`` are read from it); ``errors``: the meaning of its codes
    (:data:`llminfra.kernels.abi.ERRORS`)."""

    #: the library's ``rope_write_f32``: a decode step's RoPE and K/V write in one call
    rope_write: ctypes._CFuncPtr | None = None
    errors: dict = field(default_factory=lambda: ERRORS["paged_decode_f32"])


def on(lib: Library, pool: ThreadPool | None = None) -> PagedDecodeKernel:
    """The attention of the loaded library ``lib`` on ``pool`` (None: one thread, no pool)."""
    return PagedDecodeKernel(lib.paged_decode_f32, pool, lib.rope_write_f32)


def kernel(threads: int | None = None, pool: ThreadPool | None = None) -> PagedDecodeKernel:
    """The kernel on ``pool`` (a matmul kernel's, shared: the calls of a step come one after
    another), else on a new :class:`~llminfra.kernels.w4a8.ThreadPool` of ``threads`` (None:
    torch's thread count). ``RuntimeError`` where the library cannot be built."""
    lib = library()
    return on(lib, ThreadPool(_check_threads(threads), lib) if pool is None else pool)


def check_tables(block_tables: torch.Tensor, lens: torch.Tensor) -> tuple[int, int]:
    """``(n, W)`` of block tables ``(n, W)`` and lengths ``(n,)`` the kernel can take: integer
    CPU tensors whose every value fits the C ``int`` it reads them as (a block id or length of
    2**32 or more would otherwise be cut to its low 32 bits: another block, silently);
    ``ValueError`` naming the tensor and the value otherwise. Which blocks lie in the pool
    and which lengths its tables reach, C checks."""
    for name, t in (("block_tables", block_tables), ("context_lens", lens)):
        check_cpu(name, t)
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
        check_range(name, t, *INT32)
    if block_tables.dim() != 2 or lens.shape != block_tables.shape[:1]:
        raise ValueError(f"need block_tables (n, W) and context_lens (n,), got "
                         f"{tuple(block_tables.shape)} and {tuple(lens.shape)}")
    return tuple(block_tables.shape)


def c_attend(kernel, block_tables: torch.Tensor, lens: torch.Tensor, K: torch.Tensor,
             heads: tuple[int, int, int], q_row: int):
    """``attend(q, pool)`` on the C paged decode kernel ``kernel``
    (:class:`llminfra.kernels.paged_decode.PagedDecodeKernel`): each sequence's blocks read in
    place up to its length (``lens`` ``(n,)``), one ctypes call a layer, into one ``(n, H·d)``
    buffer. ``K`` a K pool (its shape), ``heads`` ``(H, H_kv, d)``; q ``(n, H, d)`` with unit
    strides in a row of heads, its rows ``q_row`` floats apart. ``ValueError`` for tables or
    lengths :func:`check_tables` refuses, a head dim below 1, and (at each call) a q or pool
    that is not float32 on the CPU; ``RuntimeError`` for a kernel whose pool was closed."""
    n, W = check_tables(block_tables, lens)
    P, B = K.shape[:2]
    H, H_kv, d = heads
    check_range("d (the head dim)", d, 1, INT32[1])
    tables = block_tables.to(torch.int32).contiguous()
    lens = lens.to(torch.int32).contiguous()
    out = torch.empty(n, H * d, dtype=torch.float32)      # every layer's: wo.add reads it first
    fn = kernel.fn
    rest = (tables.data_ptr(), lens.data_ptr(), out.data_ptr(), n, H, H_kv, d, B, W, P,
            d ** -0.5, kernel.threads, kernel.pool)     # a step's: a closed pool raises here

    def attend(q, p, _alive=(tables, lens)):     # the closure holds what rest points into
        if not q.dtype == p[2].dtype == p[3].dtype == torch.float32 or not (
                q.is_cpu and p[2].is_cpu and p[3].is_cpu):
            raise ValueError(f"paged_decode_f32 reads float32 CPU q and pools, got q "
                             f"{q.dtype} on {q.device}, pools {p[2].dtype} on {p[2].device}")
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
    Returns ``(N, H, d)``. ``ValueError`` naming what the kernel cannot read (a tensor on
    another device or of another dtype, shapes that do not fit), ``RuntimeError`` where the
    library does not build."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_cpu(name, t, torch.float32)
    for name, t in (("block_tables", block_tables), ("context_lens", context_lens)):
        check_cpu(name, t)
    threads = _check_threads(threads)
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
    check_tables(block_tables, context_lens)           # before a kernel (and its pool) is made
    check_range("d (the head dim)", d, 1, INT32[1])
    attend = c_attend(_kernel_on(threads), block_tables, context_lens, k_cache, (H, H_kv, d),
                      H * d)
    return attend(q, (None, None, k_cache, v_cache)).view(N, H, d)
