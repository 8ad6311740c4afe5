"""Answer checkers for chapter 07 (``solutions/07_tensor_and_pipeline_parallelism.ipynb``):
shard a weight by columns and by rows, and the pipeline bubble fraction.

Notation of Megatron-LM (Shoeybi et al., 2019, arXiv:1909.08053, §3): ``Y = X A`` with ``A`` of
shape ``(in, out)``. Column parallel: rank ``r`` of ``n`` holds ``A[:, r·out/n:(r+1)·out/n]`` and
the full ``Y`` is the concatenation of the ``X A_r``. Row parallel: rank ``r`` holds
``A[r·in/n:(r+1)·in/n, :]`` and ``Y = Σ_r X_r A_r``. The references are the package's
:func:`llminfra.parallel.tensor_parallel.shard_rows` / ``shard_cols`` (which work on
``nn.Linear``'s ``W = Aᵀ``) and :func:`llminfra.parallel.pipeline.bubble_fraction` (GPipe,
Huang et al., 2019, arXiv:1811.06965, §2.2).

Every run builds its cases from one seed, the branches first: every rank of one non-square
matrix whose blocks are at least 2 wide (a stride, the other dimension or a block width taken
from it cannot pass), and for the bubble one stage (no bubble) then one micro-batch.
"""

from __future__ import annotations

import random

import torch

from llminfra.course.checking import (Case, CheckFailed, checker, compare, first_matching,
                                      run_checks, seeded)
from llminfra.course.checking import torch_generator as _gen
from llminfra.parallel.pipeline import bubble_fraction
from llminfra.parallel.tensor_parallel import shard_cols, shard_rows

__all__ = ["check_column_shard", "check_row_shard", "check_bubble", "CheckFailed"]


def _column_reference(A: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return shard_rows(A.T, rank, size).T  # output features of A = rows of W = Aᵀ


def _row_reference(A: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return shard_cols(A.T, rank, size).T  # input features of A = columns of W = Aᵀ


def _cases(rng: random.Random, n: int = 6) -> list[Case]:
    """Every rank of one non-square matrix (so together they must rebuild A), then random
    (matrix, rank) pairs with rank > 0."""
    size = 4
    rows, cols = rng.sample(range(2, 6), 2)  # not square: a transposed split shows
    A = torch.randn(size * rows, size * cols, generator=_gen(rng))
    cases = [Case(f"A {tuple(A.shape)}, rank {r} of {size}", (A, r, size)) for r in range(size)]
    while len(cases) < n:
        size = rng.choice([2, 3, 4, 8])
        A = torch.randn(size * rng.randint(1, 5), size * rng.randint(1, 5), generator=_gen(rng))
        r = rng.randrange(1, size)
        cases.append(Case(f"A {tuple(A.shape)}, rank {r} of {size}", (A, r, size)))
    return cases


def _strided(A: torch.Tensor, rank: int, size: int, other: str) -> torch.Tensor:
    """Every ``size``-th column (``other == "row"``: column shard) or row, from ``rank`` on."""
    return A[:, rank::size] if other == "row" else A[rank::size, :]


def _shard_hint(other: str):
    def hint(args, kwargs, expected, got) -> str:
        A, rank, size = args
        if not isinstance(got, torch.Tensor):
            return f"return a torch.Tensor, got {type(got).__name__}"
        if got.dtype != A.dtype:
            return (f"A is {str(A.dtype).replace('torch.', '')} but your shard is "
                    f"{str(got.dtype).replace('torch.', '')}: a shard holds A's values unchanged")
        swapped = (_row_reference if other == "row" else _column_reference)(A, rank, size)
        if compare(swapped, got, 0.0, 0.0) is None:
            return f"that is the {other}-parallel shard: you split the other dimension of A"
        if compare(_strided(A, rank, size, other), got, 0.0, 0.0) is None:
            return ("you took every size-th slice from rank on (a stride); rank r takes ONE "
                    "consecutive block: r·k … (r+1)·k - 1")
        if got.shape == expected.shape:
            return "right shape, wrong block: rank r takes block r of n consecutive equal blocks"
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    return hint


@checker
def check_column_shard(fn, seed: int | None = None) -> int:
    """``fn(A (in, out), rank, size)`` -> ``A_r``, the columns ``r·out/size … (r+1)·out/size-1``.
    Every rank of one matrix is checked, so ``cat_r(X A_r) == X A`` follows."""
    seed, rng = seeded(seed)
    return run_checks("column_shard", fn, _column_reference, _cases(rng), rel=0, abs_=0,
                      hint=_shard_hint("row"), seed=seed, replay="check_column_shard")


@checker
def check_row_shard(fn, seed: int | None = None) -> int:
    """``fn(A (in, out), rank, size)`` -> ``A_r``, the rows ``r·in/size … (r+1)·in/size-1``.
    Every rank of one matrix is checked, so ``Σ_r X_r A_r == X A`` (the all-reduce) follows."""
    seed, rng = seeded(seed)
    return run_checks("row_shard", fn, _row_reference, _cases(rng), rel=0, abs_=0,
                      hint=_shard_hint("column"), seed=seed, replay="check_row_shard")


def _bubble_hint(args, kwargs, expected, got) -> str:
    p, m = args
    wrong = {
        "(p-1)/m is the idle time relative to the busy time, not a share of the whole "
        "makespan (m+p-1) stage times": (p - 1) / m,
        "that is the busy share m/(m+p-1); the bubble is the idle share": m / (m + p - 1),
        "the makespan is m+p-1 stage times, not m+p": (p - 1) / (m + p),
        "the bubble is (p-1)/(m+p-1); you used p instead of p-1": p / (m + p - 1),
        "integer division: (p - 1) // (m + p - 1) is 0; use /": (p - 1) // (m + p - 1),
        "you swapped p and m: the bubble grows with the stages p, (p-1)/(m+p-1)":
            (m - 1) / (m + p - 1),
    }
    return first_matching(got, wrong, expected) or \
        "idle share of p stages over a makespan of (m+p-1) stage times, each stage busy m"


@checker
def check_bubble(fn, seed: int | None = None) -> int:
    """``fn(p, m)`` -> GPipe's bubble fraction ``(p-1)/(m+p-1)``; one stage (no bubble, case 1)
    and one micro-batch (case 2) in every run, then random p, m. Any number type is accepted
    (a ``Fraction`` too)."""
    seed, rng = seeded(seed)
    edges = [(1, rng.randint(2, 9)), (rng.randint(2, 8), 1)]
    pairs = edges + [(rng.randint(2, 16), rng.randint(2, 64)) for _ in range(7)]
    cases = [Case(f"p={p} stage{'s' if p > 1 else ''}, m={m} micro-batch"
                  f"{'es' if m > 1 else ''}" + (" (one stage: no bubble)" if p == 1 else
                                                " (one micro-batch)" if m == 1 else ""), (p, m))
             for p, m in pairs]
    return run_checks("bubble", fn, bubble_fraction, cases, rel=1e-9, abs_=1e-12,
                      hint=_bubble_hint, seed=seed, replay="check_bubble")
