"""Column- and row-parallel linear layers with Megatron-LM's *f* and *g* operators.

Shoeybi et al., 2019, "Megatron-LM" (arXiv:1909.08053), §3 and Fig. 3. For ``Y = X A`` with
``A`` of shape ``(in, out)`` (``nn.Linear`` stores ``W = Aᵀ``, shape ``(out, in)``)::

    column parallel: A = [A_1 | A_2 | … | A_n]        each rank r computes Y_r = X A_r
                     (split the OUTPUT features)       -> Y = [Y_1 | … | Y_n]  (no communication)

          in ┌────┬────┐                    W (out, in):  ┌──────────┐ rank 0 rows
             │ A_1│ A_2│                                   ├──────────┤ rank 1 rows
             └────┴────┘ out                               └──────────┘

    row parallel:    A = [A_1; A_2; …; A_n]            each rank r holds X_r (its slice of the
                     (split the INPUT features)        input features) and computes X_r A_r;
                                                       Y = Σ_r X_r A_r   (one all-reduce)

          in ┌──────┐ rank 0                W (out, in):  ┌─────┬─────┐
             ├──────┤ rank 1                              │ r 0 │ r 1 │
             └──────┘ out                                 └─────┴─────┘

Megatron's two conjugate operators make the backward pass right:

* ``f`` — identity in the forward pass, all-reduce of the gradient in the backward pass
  (placed before a column-parallel layer: every rank used the same X, so dL/dX sums);
* ``g`` — all-reduce in the forward pass, identity in the backward pass
  (placed after a row-parallel layer: the partial sums X_r A_r become Y).

Shapes: inputs ``(..., in_features)``; bias, if any, is split with the output features
(column) or added once after the sum (row). Taught in chapter 07.
"""

from __future__ import annotations

import torch
from torch import nn

from llminfra.parallel.world import World


def shard_size(total: int, size: int, what: str = "dimension") -> int:
    """``total // size``, or ``ValueError`` if ``size`` does not divide ``total``."""
    if total % size:
        raise ValueError(f"{what} of {total} cannot be split evenly over {size} ranks "
                         f"(allowed world sizes divide {total})")
    return total // size


def shard_rows(weight: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rows ``rank·out/size … (rank+1)·out/size`` of ``weight (out, in)``: the column-parallel
    shard (Megatron's ``A_r`` of ``A = Wᵀ``), shape ``(out/size, in)``."""
    n = shard_size(weight.shape[0], size, "output features")
    return weight[rank * n:(rank + 1) * n]


def shard_cols(weight: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Columns ``rank·in/size … (rank+1)·in/size`` of ``weight (out, in)``: the row-parallel
    shard (Megatron's ``A_r`` split along the input), shape ``(out, in/size)``."""
    n = shard_size(weight.shape[-1], size, "input features")
    return weight[:, rank * n:(rank + 1) * n]


class CopyToParallel(torch.autograd.Function):
    """Megatron's ``f``: forward ``Y = X`` (identity); backward ``dX = Σ_r dY_r`` (all-reduce)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, world: World) -> torch.Tensor:
        ctx.world = world
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.world.all_reduce(grad), None


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's ``g``: forward ``Y = Σ_r X_r`` (all-reduce); backward ``dX_r = dY`` (identity)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, world: World) -> torch.Tensor:
        return world.all_reduce(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class GatherFromParallel(torch.autograd.Function):
    """Forward: concatenate every rank's last-dim slice (all-gather); backward: keep this
    rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, world: World) -> torch.Tensor:
        ctx.world, ctx.n = world, x.shape[-1]
        return world.all_gather(x, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        r, n = ctx.world.rank, ctx.n
        return grad[..., r * n:(r + 1) * n].contiguous(), None


def copy_to_parallel(x: torch.Tensor, world: World) -> torch.Tensor:
    """Apply ``f`` (see :class:`CopyToParallel`)."""
    return CopyToParallel.apply(x, world)


def reduce_from_parallel(x: torch.Tensor, world: World) -> torch.Tensor:
    """Apply ``g`` (see :class:`ReduceFromParallel`)."""
    return ReduceFromParallel.apply(x, world)


def gather_from_parallel(x: torch.Tensor, world: World) -> torch.Tensor:
    """All-gather the last dimension (see :class:`GatherFromParallel`)."""
    return GatherFromParallel.apply(x, world)


class ColumnParallelLinear(nn.Module):
    """``Y_r = f(X) A_r (+ b_r)``: this rank's ``out/size`` output features.

    ``weight`` has shape ``(out/size, in)``. With ``gather_output=True`` the slices are
    all-gathered so every rank returns the full ``(..., out)``; otherwise ``(..., out/size)``
    (what a following row-parallel layer wants).
    """

    def __init__(self, in_features: int, out_features: int, world: World, bias: bool = False,
                 gather_output: bool = False, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None):
        super().__init__()
        self.world, self.gather_output = world, gather_output
        self.in_features, self.out_features = in_features, out_features
        local = shard_size(out_features, world.size, "output features")
        self.weight = nn.Parameter(torch.empty(local, in_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(local, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, world: World, gather_output: bool = False):
        """The shard of an existing full ``nn.Linear`` that belongs to ``world.rank``."""
        layer = cls(linear.in_features, linear.out_features, world, linear.bias is not None,
                    gather_output, linear.weight.dtype, linear.weight.device)
        with torch.no_grad():
            layer.weight.copy_(shard_rows(linear.weight, world.rank, world.size))
            if linear.bias is not None:
                layer.bias.copy_(shard_rows(linear.bias[:, None], world.rank, world.size)[:, 0])
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(copy_to_parallel(x, self.world), self.weight, self.bias)
        return gather_from_parallel(y, self.world) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features} (local {self.weight.shape[0]}), "
                f"rank={self.world.rank}/{self.world.size}")


class RowParallelLinear(nn.Module):
    """``Y = g(Σ_r X_r A_r) (+ b)``: this rank holds ``in/size`` input features.

    ``weight`` has shape ``(out, in/size)``; the input is this rank's slice ``(..., in/size)``
    (``input_is_parallel=True``, the output of a column-parallel layer) or the full
    ``(..., in)``, which is then sliced here. Every rank returns the full ``(..., out)``.
    """

    def __init__(self, in_features: int, out_features: int, world: World, bias: bool = False,
                 input_is_parallel: bool = True, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None):
        super().__init__()
        self.world, self.input_is_parallel = world, input_is_parallel
        self.in_features, self.out_features = in_features, out_features
        local = shard_size(in_features, world.size, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, local, dtype=dtype, device=device))
        self.bias = (nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device))
                     if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, world: World, input_is_parallel: bool = True):
        """The shard of an existing full ``nn.Linear`` that belongs to ``world.rank``."""
        layer = cls(linear.in_features, linear.out_features, world, linear.bias is not None,
                    input_is_parallel, linear.weight.dtype, linear.weight.device)
        with torch.no_grad():
            layer.weight.copy_(shard_cols(linear.weight, world.rank, world.size))
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            n = self.weight.shape[1]  # f, then slice: the backward all-reduce rebuilds dX
            x = copy_to_parallel(x, self.world)[..., self.world.rank * n:(self.world.rank + 1) * n]
        y = reduce_from_parallel(nn.functional.linear(x, self.weight), self.world)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in={self.in_features} (local {self.weight.shape[1]}), out={self.out_features}, "
                f"rank={self.world.rank}/{self.world.size}")
