"""Cross-check: the same SwiGLU MLP sharded by PyTorch's own tensor-parallel API.

``torch.distributed.tensor.parallel.parallelize_module`` with ``ColwiseParallel`` on ``w1`` and
``w3`` and ``RowwiseParallel`` on ``w2`` is the Megatron split of
:func:`llminfra.parallel.megatron.parallel_mlp` expressed with DTensors (PyTorch documentation,
"Tensor Parallelism - torch.distributed.tensor.parallel"). Running both on the same weights and
input must give the same output: ``tests/test_parallel_dist.py`` checks it over gloo.

Needs an initialised ``torch.distributed`` group (run it through
:func:`llminfra.parallel.launch.launch`). Taught in chapter 07.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from llminfra.parallel.distributed_world import DistributedWorld


@torch.no_grad()
def dtensor_mlp_forward(world: DistributedWorld, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``mlp(x)`` with ``mlp`` (``w1``, ``w2``, ``w3``) sharded by ``torch.distributed.tensor
    .parallel`` over ``world``'s ranks; ``x (..., dim)`` replicated, output ``(..., dim)``
    replicated (a plain tensor on every rank)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    device_type = x.device.type
    mesh = init_device_mesh(device_type, (world.size,))
    sharded = parallelize_module(copy.deepcopy(mlp), mesh, {
        "w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()})
    y = sharded(x)
    # the all-reduce of RowwiseParallel may still be in flight (an AsyncCollectiveTensor):
    # wait for it before the value leaves this function
    return (y.wait() if hasattr(y, "wait") else y).clone()
