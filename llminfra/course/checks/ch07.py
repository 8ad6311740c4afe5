"""Answer checkers for chapter 07 (``solutions/07_tensor_and_pipeline_parallelism.ipynb``):
shard a weight by columns and by rows, and the pipeline bubble fraction.

Notation of Megatron-LM (Shoeybi et al., 2019, arXiv:1909.08053, §3): ``Y = X A`` with ``A`` of
shape ``(in, out)``. Column parallel: rank ``r`` of ``n`` holds ``A[:, r·out/n:(r+1)·out/n]`` and
the full ``Y`` is the concatenation of the ``X A_r``. Row parallel: rank ``r`` holds
``A[r·in/n:(r+1)·in/n, :]`` and ``Y = Σ_r X_r A_r``. The references are the package's
:func:`llminfra.parallel.tensor_parallel.shard_rows` / ``shard_cols`` (which work on
``nn.Linear``'s ``W = Aᵀ``) and :func:`llminfra.parallel.pipeline.bubble_fraction` (GPipe,
Huang et al., 2019, arXiv:1811.06965, §2.2).
"""

from __future__ import annotations

import random

import torch

from llminfra.course.checking import CheckFailed, fresh_rng, run_checks
from llminfra.course.checking import torch_generator as _gen
from llminfra.parallel.pipeline import bubble_fraction
from llminfra.parallel.tensor_parallel import shard_cols, shard_rows


class Matrix(torch.Tensor):
    """A tensor whose repr in a checker message is its shape only."""

    def __repr__(self) -> str:
        return f"<tensor of shape {tuple(self.shape)}>"


def _column_reference(A: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return shard_rows(A.T, rank, size).T  # output features of A = rows of W = Aᵀ


def _row_reference(A: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return shard_cols(A.T, rank, size).T  # input features of A = columns of W = Aᵀ



def _cases(rng: random.Random, n: int = 6) -> list:
    cases = []
    for _ in range(n):
        size = rng.choice([2, 3, 4, 8])
        A = torch.randn(size * rng.randint(1, 5), size * rng.randint(1, 5),
                        generator=_gen(rng))
        cases.append(((A.as_subclass(Matrix), rng.randrange(size), size), {}))
    return cases


def _shard_hint(other: str):
    def hint(args, kwargs, expected, got) -> str:
        A, rank, size = args
        if not isinstance(got, torch.Tensor):
            return f"return a torch.Tensor, got {type(got).__name__}"
        swapped = (_row_reference if other == "row" else _column_reference)(A, rank, size)
        if got.shape == swapped.shape and torch.equal(got, swapped):
            return f"that is the {other}-parallel shard: you split the other dimension of A"
        if got.shape == expected.shape:
            return "right shape, wrong block: rank r takes block r of n consecutive equal blocks"
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    return hint


def check_column_shard(fn) -> int:
    """``fn(A (in, out), rank, size)`` -> ``A_r``, the columns ``r·out/size … (r+1)·out/size-1``;
    also checks that ``cat_r(X A_r) == X A``."""
    rng = fresh_rng()
    cases = _cases(rng)
    n = run_checks("column_shard", fn, _column_reference, cases, rel=0, abs_=0,
                   hint=_shard_hint("row"))
    A, _, size = cases[0][0]
    X = torch.randn(3, A.shape[0], generator=_gen(rng))
    Y = torch.cat([X @ fn(A, r, size) for r in range(size)], dim=1)
    if not torch.allclose(Y, X @ A, atol=1e-5):
        raise CheckFailed("column_shard: concatenating X @ A_r over the ranks does not give X @ A")
    return n


def check_row_shard(fn) -> int:
    """``fn(A (in, out), rank, size)`` -> ``A_r``, the rows ``r·in/size … (r+1)·in/size-1``;
    also checks that ``Σ_r X_r A_r == X A`` (the all-reduce of row parallelism)."""
    rng = fresh_rng()
    cases = _cases(rng)
    n = run_checks("row_shard", fn, _row_reference, cases, rel=0, abs_=0,
                   hint=_shard_hint("column"))
    A, _, size = cases[0][0]
    X = torch.randn(3, A.shape[0], generator=_gen(rng))
    k = A.shape[0] // size
    Y = sum(X[:, r * k:(r + 1) * k] @ fn(A, r, size) for r in range(size))
    if not torch.allclose(Y, X @ A, atol=1e-5):
        raise CheckFailed("row_shard: the sum over ranks of X_r @ A_r does not give X @ A")
    return n


def _bubble_hint(args, kwargs, expected, got) -> str:
    p, m = args
    wrong = {
        "(p-1)/m is the idle time relative to the busy time, not a share of the whole "
        "makespan (m+p-1) stage times": (p - 1) / m,
        "that is the busy share m/(m+p-1); the bubble is the idle share": m / (m + p - 1),
        "the makespan is m+p-1 stage times, not m+p": (p - 1) / (m + p),
        "the bubble is (p-1)/(m+p-1); you used p instead of p-1": p / (m + p - 1),
    }
    for why, value in wrong.items():
        if (isinstance(got, (int, float)) and abs(got - value) < 1e-9
                and abs(value - expected) > 1e-9):
            return why
    return "idle share of p stages over a makespan of (m+p-1) stage times, each stage busy m"


def check_bubble(fn) -> int:
    """``fn(p, m)`` -> GPipe's bubble fraction ``(p-1)/(m+p-1)`` for random p, m."""
    rng = fresh_rng()
    cases = [((rng.randint(2, 16), rng.randint(1, 64)), {}) for _ in range(8)]
    cases.append(((1, rng.randint(1, 9)), {}))  # one stage: no bubble
    return run_checks("bubble", fn, bubble_fraction, cases, rel=1e-9, abs_=1e-12,
                      hint=_bubble_hint)
