"""The package's C library, loaded: one shared library of every kernel in ``csrc/``, bound by
:mod:`llminfra.kernels.abi`, and the thread pool its kernels run on.

:func:`library` builds it for this CPU (:mod:`llminfra.kernels.build`) and loads it once per
process; :func:`available` / :func:`unavailable_reason` say whether that works here. Where it
does not (no compiler, a refused build, remembered from before) the answer is the same for the
whole process, one line on stderr says why, and the course takes its torch paths.
:class:`ThreadPool` holds the kernels' worker threads between calls (``csrc/thread_pool.c``).
Chapter 12.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import weakref
from dataclasses import dataclass

import torch

from llminfra.kernels.abi import MAX_K, MAX_THREADS, PATHS, SYMBOLS, Library, load  # noqa: F401
from llminfra.kernels.build import build

log = logging.getLogger(__name__)


@functools.cache
def _loaded() -> tuple[Library | None, str | None]:
    """``(library, None)``, or ``(None, why not)`` with one warning line: once per process."""
    try:
        return load(build()), None
    except (RuntimeError, OSError) as e:
        reason = str(e)
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    short = lines[0] if len(lines) < 2 else f"{lines[0]} {lines[1][:200]}"
    log.warning("llminfra kernels: the C library is not available here, so the pure torch "
                "paths run instead: %s (python -m llminfra kernels info)", short)
    return None, reason


def library() -> Library:
    """The library built for this CPU (:func:`~llminfra.kernels.build.build`), loaded once per
    process; ``RuntimeError`` with the reason where it cannot be (asked again, the same answer:
    nothing is compiled twice in a process)."""
    lib, reason = _loaded()
    if lib is None:
        raise RuntimeError(reason)
    return lib


def unavailable_reason() -> str | None:
    """Why the library cannot be built and loaded here (the compiler's message, a refused
    build…), or None where it can."""
    return _loaded()[1]


def available() -> bool:
    """Whether the library can be built and loaded here (:func:`unavailable_reason` says why
    not): where False, every kernel's torch path runs."""
    return _loaded()[0] is not None


def build_info(lib: Library | None = None) -> dict:
    """``{"path": "avx512-vnni" | "avx2" | "portable", "lanes": 16 | 8 | 0, "file": …}`` of the
    loaded library: which code path the compiler built for this CPU."""
    lib = library() if lib is None else lib
    return {"path": lib.isa, "lanes": lib.lanes, "file": str(lib.path)}


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


def check_cpu(name: str, t: torch.Tensor, dtype: torch.dtype | tuple | None = None, *,
              contiguous: bool = False) -> None:
    """``ValueError`` naming ``name`` where ``t`` is not a tensor on the CPU, not of ``dtype``
    (one dtype, or a tuple of those allowed) or, with ``contiguous``, not contiguous: the C
    kernels read its memory as raw CPU memory of that type, row after row. The one check of a
    tensor at every kernel's Python entry."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}: the C kernels read CPU memory only "
                         f"(move it with .cpu())")
    allowed = (dtype,) if isinstance(dtype, torch.dtype) else dtype
    if allowed is not None and t.dtype not in allowed:
        want = allowed[0] if len(allowed) == 1 else " or ".join(map(str, allowed))
        raise ValueError(f"{name} must be {want}, got {t.dtype}: the C kernels read its "
                         f"memory as {want} (convert it with .to())")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (the C kernels read its rows back to "
                         f"back), got strides {t.stride()} for shape {tuple(t.shape)}")


#: the values a C ``int`` holds: sizes, block ids and lengths the kernels take as ``int``
INT32 = (-2 ** 31, 2 ** 31 - 1)


def check_range(name: str, value, low: int, high: int) -> None:
    """``ValueError`` naming ``name``, the value outside ``low .. high`` and the limit, for an
    int or every element of an integer tensor (its smallest and largest are looked at): what a
    kernel takes as a C ``int`` must fit one before it is converted, never be truncated."""
    if isinstance(value, torch.Tensor):
        if not value.numel():
            return
        lo, hi = int(value.min()), int(value.max())
    elif isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int in {low} .. {high}, got {value!r}")
    else:
        lo = hi = value
    if lo < low or hi > high:
        bad = lo if lo < low else hi
        raise ValueError(f"{name} holds {bad}, outside {low} .. {high} (the C kernels take it "
                         f"as {'a 32-bit int' if (low, high) == INT32 else 'this range'})")


class ThreadPool:
    """``threads − 1`` worker threads of the kernels (``thread_pool.c``), kept between products
    so that a call of tens of microseconds does not pay for starting them: after each
    product they spin for 50 µs, then sleep. Freed when the pool is collected, or by
    :meth:`close`: after that :attr:`handle` raises ``RuntimeError``, so no kernel on the pool
    hands C the freed threads. ``threads=1`` holds no threads. One caller at a time: a product
    asked from a second thread while one runs, or in a forked child, starts threads of its own
    instead."""

    def __init__(self, threads: int | None = None, lib: Library | None = None):
        lib = library() if lib is None else lib
        self.threads = _check_threads(threads)
        self._handle = lib.w4a8_pool_new(self.threads) if self.threads > 1 else None
        if self.threads > 1 and not self._handle:
            raise RuntimeError(f"llminfra kernels: could not start {self.threads - 1} worker "
                               f"threads")
        #: whether :meth:`close` was called
        self.closed = False
        self._free = weakref.finalize(self, lib.w4a8_pool_free, self._handle)

    @property
    def handle(self) -> int | None:
        """What C is given: the pool's address (None for one thread). ``RuntimeError`` naming
        the pool once it is closed: its threads are freed, and a kernel still holding it
        must not run (make a new kernel, or kernel set, on a new pool)."""
        if self.closed:
            raise RuntimeError(f"llminfra kernels: this ThreadPool of {self.threads} threads "
                               f"was closed (ThreadPool.close()): a kernel on it cannot run; "
                               f"build the kernels again on a new pool")
        return self._handle

    def close(self) -> None:
        """Stop and join the worker threads now; every later call of a kernel on the pool
        raises ``RuntimeError`` (:attr:`handle`). Closing twice does nothing more."""
        self._free()
        self._handle, self.closed = None, True


@dataclass(frozen=True)
class PooledKernel:
    """A C function of the library (``fn``) and the :class:`ThreadPool` it runs on
    (``owner``; None: one thread, no pool). ``pool`` (the handle C is given) and ``threads``
    are read from the pool at each call, never copied: a pool closed since raises
    ``RuntimeError`` instead of handing C its freed threads."""

    fn: ctypes._CFuncPtr
    owner: ThreadPool | None

    @property
    def pool(self) -> int | None:
        """The pool's handle, or None (no pool, or one thread); ``RuntimeError`` for a closed
        pool (:attr:`ThreadPool.handle`)."""
        return None if self.owner is None else self.owner.handle

    @property
    def threads(self) -> int:
        """The pool's thread count (1 without one)."""
        return 1 if self.owner is None else self.owner.threads
