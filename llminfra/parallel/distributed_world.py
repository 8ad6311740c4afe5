"""The ``World`` of ranks in separate processes: a thin wrapper over ``torch.distributed``
(gloo on CPU, NCCL on CUDA), started by ``torchrun`` or by
:func:`llminfra.parallel.launch.launch`. The interface, the argument checks and the in-process
:class:`~llminfra.parallel.world.SimulatedWorld` are :mod:`llminfra.parallel.world`; a test ties
the two (``tests/test_parallel_dist.py``). Taught in chapter 07.
"""

from __future__ import annotations

import torch

from llminfra.parallel.world import A2A_MAX_DIMS, Handle, World, check_all_to_all, check_rank

#: dtypes :meth:`DistributedWorld.all_to_all` can describe to its peers (by index)
_A2A_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


class DistributedWorld(World):
    """This process's rank in a ``torch.distributed`` process group (gloo or NCCL).

    ``group=None`` uses the default group that the launcher (or ``torchrun``) initialised; the
    group is stored here and passed to every call, never looked up inside the layers.
    """

    def __init__(self, group=None):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("torch.distributed is not initialised: start the ranks with "
                             "llminfra.parallel.launch.launch(...) or torchrun")
        self._dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.backend = dist.get_backend(group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        out = x.detach().clone().contiguous()
        self._dist.all_reduce(out, group=self.group)
        return out

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        x = x.detach().contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=dim)

    def all_to_all(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Two ``all_to_all_single`` calls (gloo's list ``all_to_all`` wants equal sizes, torch
        2.13): first each item's row count and shape/dtype code, then the rows with uneven
        splits."""
        trailing, dtype = check_all_to_all(tensors, self.size)
        device = tensors[0].device
        code = [_A2A_DTYPES.index(dtype) if dtype in _A2A_DTYPES else -1, len(trailing),
                *trailing, *[-1] * (A2A_MAX_DIMS - 1 - len(trailing))]
        meta = torch.tensor([[t.shape[0], *code] for t in tensors], dtype=torch.int64,
                            device=device)  # (size, 1 + 2 + 5): rows, dtype, ndim-1, dims
        got = torch.empty_like(meta)
        self._dist.all_to_all_single(got, meta, group=self.group)
        if code[0] < 0 or any(row[1:].tolist() != code for row in got):
            raise ValueError(f"all_to_all needs one trailing shape and dtype on every rank "
                             f"(dtype one of {[str(d) for d in _A2A_DTYPES]}); this rank has "
                             f"(*, {trailing}) {dtype}, peers sent codes {got[:, 1:].tolist()}")
        out_rows = got[:, 0].tolist()
        x = torch.cat([t.detach() for t in tensors]).contiguous()
        out = torch.empty((sum(out_rows), *trailing), dtype=dtype, device=device)
        self._dist.all_to_all_single(out, x, output_split_sizes=out_rows,
                                     input_split_sizes=[t.shape[0] for t in tensors],
                                     group=self.group)
        return list(out.split(out_rows))

    def send(self, x: torch.Tensor, dst: int) -> None:
        check_rank(dst, self.size)
        self._dist.send(x.detach().contiguous(), dst=dst, group=self.group)

    def recv(self, shape, dtype, src, device="cpu") -> torch.Tensor:
        check_rank(src, self.size)
        out = torch.empty(tuple(shape), dtype=dtype, device=device)
        self._dist.recv(out, src=src, group=self.group)
        return out

    def isend(self, x: torch.Tensor, dst: int) -> Handle:
        check_rank(dst, self.size)
        x = x.detach().contiguous()
        work = self._dist.isend(x, dst=dst, group=self.group)

        def wait(x=x) -> None:  # the closure keeps x alive until the send is done
            work.wait()
        return Handle(wait)

    def irecv(self, shape, dtype, src, device="cpu") -> Handle:
        check_rank(src, self.size)
        out = torch.empty(tuple(shape), dtype=dtype, device=device)
        work = self._dist.irecv(out, src=src, group=self.group)

        def wait() -> torch.Tensor:
            work.wait()
            return out
        return Handle(wait)

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)
