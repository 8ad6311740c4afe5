"""Start ``n`` real processes, each a rank of a ``torch.distributed`` group, and collect results.

``launch(fn, n, *args)`` spawns ``n`` fresh Python processes (``spawn``, never ``fork``:
forked children that use several threads can hang), connects them over gloo (CPU) or NCCL
(CUDA) through a TCP store on a free port of 127.0.0.1, calls ``fn(world, *args)`` on each with
its :class:`~llminfra.parallel.distributed_world.DistributedWorld`, and returns the results in rank order.

Works from a notebook: ``fn`` must be importable by the children (a function of the package,
e.g. in :mod:`llminfra.parallel.workers`), because spawn pickles it by name. From a script,
call ``launch`` under ``if __name__ == "__main__":`` (spawn re-imports the main module).
Guarantees:

* every child is gone when ``launch`` returns or raises (terminated, then killed);
* an exception in any rank reaches the caller as :class:`RankError` with that rank's traceback;
  a rank that dies without one (``os._exit``, a crash) is named with its exit code, even when
  a peer's "connection reset" arrives first;
* nothing hangs: the whole run has a deadline (``timeout_s``), and so do the collectives.

Each child runs with one intra-op thread (``torch.set_num_threads(1)``) so that ``n`` ranks on
a small CPU do not fight over cores. A spawn costs a few seconds (mostly importing torch): share
one launch across several checks. Taught in chapter 07.
"""

from __future__ import annotations

import datetime
import functools
import logging
import math
import multiprocessing as mp
import pickle
import queue
import socket
import time
import traceback
from typing import Callable

from llminfra.validate import positive_int

log = logging.getLogger(__name__)


class RankError(RuntimeError):
    """A rank raised (or died); the message holds its rank and traceback."""

    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank} failed:\n{message}")
        self.rank = rank


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn: Callable, rank: int, size: int, port: int, backend: str, timeout_s: float,
           threads: int, args: tuple, kwargs: dict, out: mp.Queue) -> None:
    """Entry point of one spawned rank: init the group, run ``fn``, report, tear down."""
    import torch
    import torch.distributed as dist

    from llminfra.parallel.distributed_world import DistributedWorld
    torch.set_num_threads(threads)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=size, timeout=datetime.timedelta(seconds=timeout_s))
        result = fn(DistributedWorld(), *args, **kwargs)
        out.put((rank, "ok", pickle.dumps(result)))  # bytes: no shared-memory handles to outlive us
    except BaseException:  # noqa: BLE001 - sent to the parent
        out.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - peers may be gone already
                pass


def _stop(procs: list) -> None:
    """Terminate, then kill, every child still alive; reap them all (children that never
    started, e.g. because their arguments could not be pickled, are skipped)."""
    procs = [p for p in procs if p.pid is not None]
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)


def _died_silently(procs: list, skip: set[int], grace_s: float = 0.5) -> tuple[int, int] | None:
    """``(rank, exit code)`` of a child not in ``skip`` that exited with a non-zero code
    without reporting (``os._exit``, a crash), waiting up to ``grace_s`` for one to show; when
    a rank dies, its peers fail soon after with a bare 'connection reset' from gloo."""
    deadline = time.monotonic() + grace_s
    while True:
        for r, p in enumerate(procs):
            if r not in skip and p.exitcode not in (None, 0):
                return r, p.exitcode
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _spawn_target(fn: Callable):
    """What spawn pickles by name: ``fn`` itself, or the function inside a ``functools.partial``;
    ``ValueError`` if that cannot be imported by the children."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    module = getattr(target, "__module__", None) or getattr(type(target), "__module__", "__main__")
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    if module == "__main__" or "<locals>" in name or "<lambda>" in name:
        raise ValueError(f"{fn!r} cannot be pickled by spawn: define it in a module "
                         "(e.g. llminfra.parallel.workers), not in a notebook or a closure")
    return target


def _collect(procs: list, out, size: int, timeout_s: float) -> list:
    results: list = [None] * size
    done: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(done) < size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"launch: ranks {sorted(set(range(size)) - done)} not finished "
                               f"after {timeout_s} s")
        try:
            rank, status, payload = out.get(timeout=0.1)
        except queue.Empty:
            for r, p in enumerate(procs):  # a rank that died without a word (killed, segfault)
                if r not in done and p.exitcode is not None and out.empty():
                    time.sleep(0.2)
                    if out.empty():
                        raise RankError(r, f"process exited with code {p.exitcode} and no result")
            continue
        if status == "error":
            dead = _died_silently(procs, done | {rank})
            if dead is not None:  # the error is most likely a peer's reaction to that death
                last = payload.strip().splitlines()[-1] if payload.strip() else ""
                raise RankError(dead[0], f"process exited with code {dead[1]} and no result "
                                         f"(rank {rank} then failed too: {last})")
            raise RankError(rank, payload)
        results[rank] = pickle.loads(payload)
        done.add(rank)
    return results


def launch(fn: Callable, world_size: int, *args, backend: str = "gloo", timeout_s: float = 120.0,
           threads_per_rank: int = 1, **kwargs) -> list:
    """Run ``fn(world, *args, **kwargs)`` on ``world_size`` spawned ranks; results in rank order.

    ``backend`` is ``"gloo"`` (CPU tensors, or CUDA tensors copied through the host) or
    ``"nccl"`` (one CUDA device per rank). ``fn`` and its arguments must be picklable, and
    ``fn`` importable from a module (not defined in a notebook; a ``functools.partial`` of such a
    function is fine). ``timeout_s > 0``. Raises :class:`RankError`
    when a rank fails, ``TimeoutError`` after ``timeout_s``; every child is reaped either way.
    """
    positive_int("world_size", world_size)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
    if backend == "nccl":
        import torch
        if not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs CUDA GPUs and torch sees none; "
                             "use backend='gloo' on a CPU")
    target = _spawn_target(fn)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, daemon=True,
                         args=(fn, r, world_size, port, backend, timeout_s, threads_per_rank,
                               args, kwargs, out)) for r in range(world_size)]
    t0 = time.monotonic()
    try:
        for p in procs:
            p.start()
        results = _collect(procs, out, world_size, timeout_s)
    finally:
        _stop(procs)
        out.close()
        out.join_thread()
    log.info("launch: %d ranks of %s done in %.2f s", world_size, target.__qualname__,
             time.monotonic() - t0)
    return results
