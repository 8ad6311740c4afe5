"""The package's C library, loaded: one shared library of every kernel in ``csrc/``, its
symbols checked, and the thread pool its kernels run on.

:func:`library` builds it for this CPU (:mod:`llminfra.kernels.build`) and loads it once per
process; :func:`available` / :func:`unavailable_reason` say whether that works here (no
compiler, a refused build: the course then takes its torch paths). :class:`ThreadPool` holds the
kernels' worker threads between calls (``csrc/thread_pool.c``). Chapter 12.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from pathlib import Path

import torch

from llminfra.kernels.build import build, cached_build_problem

#: the widest K every code path's block table holds (``MAX_K`` in w4a8.c: 1000 blocks of 8
#: groups of 32 on the AVX2 path); the C code refuses a wider one too
MAX_K = 32 * 8 * 1000
PATHS = {16: "avx512-vnni", 8: "avx2", 0: "portable"}
#: the most threads one product is split over (``w4a8_gemm`` refuses more)
MAX_THREADS = 64
#: what a build must export (and ``w4a8_max_k()`` must equal :data:`MAX_K`)
SYMBOLS = ("w4a8_gemm", "w4a8_pack", "w4a8_lanes", "w4a8_max_k", "w4a8_pool_new",
           "w4a8_pool_free")


def load(path: Path) -> ctypes.CDLL:
    """The built library at ``path`` with its functions' argument types set. ``RuntimeError``
    with the reason, before anything is loaded, for a file :func:`cached_build_problem`
    refuses, and after, for a library without the :data:`SYMBOLS` of w4a8.c or built from
    another version of it (``w4a8_max_k() != MAX_K``)."""
    problem = cached_build_problem(path)
    if problem is not None:
        raise RuntimeError(f"w4a8: not loading {path}: {problem}")
    lib = ctypes.CDLL(str(path))
    missing = [name for name in SYMBOLS if not hasattr(lib, name)]
    if missing:
        raise RuntimeError(f"w4a8: {path} is not a build of w4a8.c: it lacks "
                           f"{', '.join(missing)}")
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.w4a8_gemm.argtypes = [p, p, p, p, p, i, i, i, i, i, p, ctypes.c_float, i, i, p]
    lib.w4a8_gemm.restype = i
    lib.w4a8_pool_new.argtypes = [i]
    lib.w4a8_pool_new.restype = p
    lib.w4a8_pool_free.argtypes = [p]
    lib.w4a8_pool_free.restype = None
    lib.w4a8_pack.argtypes = [p, p, i, i]
    lib.w4a8_pack.restype = i
    lib.w4a8_lanes.argtypes = []
    lib.w4a8_lanes.restype = i
    lib.w4a8_max_k.argtypes = []
    lib.w4a8_max_k.restype = i
    if lib.w4a8_max_k() != MAX_K or lib.w4a8_lanes() not in PATHS:
        raise RuntimeError(f"w4a8: {path} was built from another version of w4a8.c "
                           f"(its widest K is {lib.w4a8_max_k()}, this module's {MAX_K})")
    return lib


@functools.cache
def library() -> ctypes.CDLL:
    """The kernel built for this CPU (:func:`build`), loaded once per process."""
    return load(build())


def unavailable_reason() -> str | None:
    """Why the kernel cannot be built and loaded here (the compiler's message, a refused
    build…), or None where it can."""
    try:
        library()
    except (RuntimeError, OSError) as e:
        return str(e)
    return None


def available() -> bool:
    """Whether the kernel can be built and loaded here (:func:`unavailable_reason` says why
    not)."""
    return unavailable_reason() is None


def build_info(lib: ctypes.CDLL | None = None) -> dict:
    """``{"path": "avx512-vnni" | "avx2" | "portable", "lanes": 16 | 8 | 0, "file": …}`` of the
    loaded kernel: which code path the compiler built for this CPU."""
    lib = library() if lib is None else lib
    lanes = lib.w4a8_lanes()
    return {"path": PATHS[lanes], "lanes": lanes, "file": lib._name}


def default_threads() -> int:
    """torch's thread count (``torch.get_num_threads()``: every core unless
    ``OMP_NUM_THREADS`` or ``torch.set_num_threads`` says otherwise), at most
    :data:`MAX_THREADS`: one setting for the kernel and torch's own matmuls."""
    return max(1, min(MAX_THREADS, torch.get_num_threads()))


def _check_threads(threads) -> int:
    """``threads``, or :func:`default_threads` for None; ``ValueError`` outside 1..64."""
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or not (
            1 <= threads <= MAX_THREADS):
        raise ValueError(f"threads must be an int in 1..{MAX_THREADS} (None: torch's thread "
                         f"count), got {threads!r}")
    return threads


class ThreadPool:
    """``threads − 1`` worker threads of the kernel (``thread_pool.c``), kept between products
    so that a call of tens of microseconds does not pay for starting them: after each
    product they spin for 50 µs, then sleep. Freed when the pool is collected (or by
    :meth:`close`). ``threads=1`` holds no threads. One caller at a time: a product asked from a
    second thread while one runs, or in a forked child, starts threads of its own instead."""

    def __init__(self, threads: int | None = None, lib: ctypes.CDLL | None = None):
        lib = library() if lib is None else lib
        self.threads = _check_threads(threads)
        self.handle = lib.w4a8_pool_new(self.threads) if self.threads > 1 else None
        if self.threads > 1 and not self.handle:
            raise RuntimeError(f"w4a8: could not start {self.threads - 1} worker threads")
        self._free = weakref.finalize(self, lib.w4a8_pool_free, self.handle)

    def close(self) -> None:
        """Stop and join the worker threads now (later products start threads per call)."""
        self._free()
        self.handle = None


