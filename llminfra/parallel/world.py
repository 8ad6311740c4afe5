"""The ``World``: who am I (``rank``), how many are we (``size``), and the collectives we use.

Every parallel layer in :mod:`llminfra.parallel` takes a ``World`` as an explicit argument: no
global process group is read inside the math. Two implementations share one interface:

* :class:`SimulatedWorld` — the ranks are threads of one process, meeting at a barrier. It
  needs no ``torch.distributed`` and is what chapter 07 uses to step through the algorithms;
  :func:`run_simulated` runs one function on every simulated rank and returns what each gave.
* :class:`~llminfra.parallel.distributed_world.DistributedWorld` — a thin wrapper over
  ``torch.distributed`` (gloo on CPU, NCCL on CUDA), started by ``torchrun`` or by
  :func:`llminfra.parallel.launch.launch`; in a module of its own.

Collectives (all return new tensors and never modify their input, so autograd stays correct):

* ``all_reduce(x)``  — every rank gets ``Σ_r x_r``;
* ``all_gather(x, dim)`` — every rank gets ``cat([x_0, …, x_{n-1}], dim)``;
* ``send(x, dst)`` / ``recv(shape, dtype, src)`` — point to point (pipeline parallelism);
* ``all_to_all([x_0, …, x_{n-1}])`` — item j goes to rank j; every rank gets what each rank
  sent it, in source order; first dimensions may differ (expert parallelism, chapter 11).

A test ties the two: the same layers give the same numbers on both
(``tests/test_parallel_dist.py``).
Taught in chapter 07.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import torch

from llminfra.validate import positive_int


class World:
    """Interface: ``rank`` in ``0..size-1``, ``size`` ranks, and the collectives above."""

    rank: int
    size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over all ranks, same shape as ``x`` (a new tensor). Every rank passes
        the same shape and dtype (``ValueError`` otherwise in the simulated world)."""
        raise NotImplementedError

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenation of every rank's ``x`` along ``dim``, in rank order (one shape and
        dtype on every rank, as for ``all_reduce``)."""
        raise NotImplementedError

    def all_to_all(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Personalised exchange: ``tensors[j]`` goes to rank ``j``; returns ``[from rank 0, …,
        from rank n-1]`` (what each rank sent to me). ``len(tensors) == size``; the first
        dimension may differ item by item (0 rows too), every other dimension and the dtype are
        one for all items on all ranks (``ValueError`` otherwise). MPI's ``MPI_Alltoallv``;
        the dispatch and combine of expert parallelism (GShard, Lepikhin et al. 2020,
        arXiv:2006.16668, §3.2). Taught in chapter 11."""
        raise NotImplementedError

    def send(self, x: torch.Tensor, dst: int) -> None:
        """Send ``x`` to rank ``dst`` (may block until ``dst`` posts the matching receive)."""
        raise NotImplementedError

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int,
             device: torch.device | str = "cpu") -> torch.Tensor:
        """Receive a tensor of ``shape`` and ``dtype`` from rank ``src``."""
        raise NotImplementedError

    def isend(self, x: torch.Tensor, dst: int) -> "Handle":
        """Start sending ``x`` to ``dst``; ``handle.wait()`` before reusing ``x``."""
        raise NotImplementedError

    def irecv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int,
              device: torch.device | str = "cpu") -> "Handle":
        """Start receiving from ``src``; ``handle.wait()`` returns the tensor."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Wait until every rank arrives here."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


class Handle:
    """A started ``isend`` / ``irecv``: ``wait()`` blocks until it is done and returns the
    received tensor (``None`` for a send)."""

    def __init__(self, wait_fn: Callable[[], torch.Tensor | None]):
        self._wait_fn, self._done, self._value = wait_fn, False, None

    def wait(self) -> torch.Tensor | None:
        if not self._done:
            self._value, self._done = self._wait_fn(), True
        return self._value


def check_rank(rank: int, size: int) -> None:
    """``ValueError`` unless ``size >= 1`` and ``0 <= rank < size``."""
    positive_int("world size", size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"rank must be an integer in 0..{size - 1}, got {rank!r}")


#: most dimensions an ``all_to_all`` item may have
A2A_MAX_DIMS = 6


def check_all_to_all(tensors, size: int) -> tuple[tuple[int, ...], torch.dtype]:
    """``(trailing shape, dtype)`` shared by the items of an ``all_to_all``; ``ValueError``
    unless ``tensors`` is a list of ``size`` tensors of ≥ 1 dimension (at most 6) that differ
    only in their first dimension."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != size \
            or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ValueError(f"all_to_all wants a list of {size} tensors (item j goes to rank j), "
                         f"got {type(tensors).__name__} of length "
                         f"{len(tensors) if hasattr(tensors, '__len__') else '?'}")
    kinds = {(tuple(t.shape[1:]), t.dtype) for t in tensors}
    if len(kinds) != 1 or not 1 <= tensors[0].dim() <= A2A_MAX_DIMS:
        got = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in tensors)
        raise ValueError(f"all_to_all items must have 1..{A2A_MAX_DIMS} dimensions and share "
                         f"the dtype and every dimension but the first; got {got}")
    return kinds.pop()


class _Meeting:
    """State the simulated ranks share: one slot per rank, a barrier, mailboxes for send/recv."""

    def __init__(self, size: int, timeout_s: float):
        self.size = size
        self.timeout_s = timeout_s
        self.slots: list = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout_s)
        self.mail: dict[tuple[int, int], list] = {}
        self.cond = threading.Condition()
        self.aborted = False  # set by abort(): receivers stop waiting

    def exchange(self, rank: int, value) -> list:
        """Every rank posts ``value``; every rank gets the list of all values, in rank order."""
        self.slots[rank] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return values


class SimulatedWorld(World):
    """One rank of ``size`` ranks simulated by threads of this process.

    Build all ranks at once with :meth:`group` (they share one meeting point) and run a
    function on each with :func:`run_simulated`. The sum in ``all_reduce`` is taken in rank
    order, so every rank gets bit-identical results.
    """

    def __init__(self, rank: int, size: int, meeting: _Meeting):
        check_rank(rank, size)
        self.rank, self.size, self._m = rank, size, meeting

    @classmethod
    def group(cls, size: int, timeout_s: float = 60.0) -> list["SimulatedWorld"]:
        """``size`` worlds, one per rank, sharing one meeting point."""
        check_rank(0, size)
        meeting = _Meeting(size, timeout_s)
        return [cls(r, size, meeting) for r in range(size)]

    def _exchange_alike(self, op: str, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``x``, in rank order; ``ValueError`` (on every rank) unless all share
        one shape and dtype, as ``torch.distributed`` requires (no silent broadcasting)."""
        values = self._m.exchange(self.rank, x.detach())
        if any(v.shape != values[0].shape or v.dtype != values[0].dtype for v in values):
            got = ", ".join(f"rank {r}: {tuple(v.shape)} {v.dtype}" for r, v in enumerate(values))
            raise ValueError(f"{op} needs the same shape and dtype on every rank, got {got}")
        return values

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        values = self._exchange_alike("all_reduce", x)
        out = values[0].clone()
        for v in values[1:]:
            out = out + v
        return out

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        values = self._exchange_alike("all_gather", x)
        return torch.cat([v.clone() for v in values], dim=dim)

    def all_to_all(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        kind = check_all_to_all(tensors, self.size)
        values = self._m.exchange(self.rank, (kind, [t.detach() for t in tensors]))
        if any(v[0] != kind for v in values):
            got = ", ".join(f"rank {r}: (*, {', '.join(map(str, v[0][0]))}) {v[0][1]}"
                            for r, v in enumerate(values))
            raise ValueError(f"all_to_all needs one trailing shape and dtype on every rank, "
                             f"got {got}")
        return [values[src][1][self.rank].clone() for src in range(self.size)]

    def send(self, x: torch.Tensor, dst: int) -> None:
        check_rank(dst, self.size)
        with self._m.cond:
            self._m.mail.setdefault((self.rank, dst), []).append(x.detach().clone())
            self._m.cond.notify_all()

    def recv(self, shape, dtype, src, device="cpu") -> torch.Tensor:
        check_rank(src, self.size)
        key = (src, self.rank)
        with self._m.cond:
            ok = self._m.cond.wait_for(lambda: self._m.mail.get(key) or self._m.aborted,
                                       timeout=self._m.timeout_s)
            if ok and not self._m.mail.get(key):  # another rank failed: do not wait for it
                raise threading.BrokenBarrierError(f"rank {self.rank}: the group was aborted "
                                                   f"while waiting for rank {src}")
            if not ok:
                raise TimeoutError(f"rank {self.rank}: nothing from rank {src} after "
                                   f"{self._m.timeout_s} s")
            x = self._m.mail[key].pop(0)
        if tuple(x.shape) != tuple(shape) or x.dtype != dtype:
            raise ValueError(f"rank {self.rank} expected {tuple(shape)} {dtype} from rank {src}, "
                             f"got {tuple(x.shape)} {x.dtype}")
        return x.to(device)

    def isend(self, x: torch.Tensor, dst: int) -> Handle:
        self.send(x, dst)  # the mailbox never blocks
        return Handle(lambda: None)

    def irecv(self, shape, dtype, src, device="cpu") -> Handle:
        return Handle(lambda: self.recv(shape, dtype, src, device))

    def barrier(self) -> None:
        self._m.barrier.wait()

    def abort(self) -> None:
        """Break the barrier and wake receivers, so ranks waiting in a collective or a
        ``recv`` raise instead of hanging."""
        self._m.barrier.abort()
        with self._m.cond:
            self._m.aborted = True
            self._m.cond.notify_all()


def run_simulated(fn: Callable, size: int, *args, timeout_s: float = 60.0, **kwargs) -> list:
    """Run ``fn(world, *args, **kwargs)`` on ``size`` simulated ranks (threads); return the
    results in rank order. If a rank raises, the others are released and the first error is
    re-raised here (with its rank in the message)."""
    worlds = SimulatedWorld.group(size, timeout_s)
    results: list = [None] * size
    errors: list = [None] * size

    def target(r: int) -> None:
        try:
            results[r] = fn(worlds[r], *args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            errors[r] = e
            worlds[r].abort()

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s  # one deadline for all ranks, not one each
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        worlds[0].abort()
        raise TimeoutError(f"simulated ranks still running after {timeout_s} s")
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    first = real[0] if real else next((e for e in errors if e is not None), None)
    if first is not None:
        rank = errors.index(first)
        raise RuntimeError(f"simulated rank {rank} raised {type(first).__name__}: "
                           f"{first}") from first
    return results
