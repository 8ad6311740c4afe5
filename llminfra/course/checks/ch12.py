"""Answer checkers for chapter 12 (``solutions/12_making_it_fast.ipynb``): the floor of a
matrix product, and one rung of the ladder — the product taken a block of W's rows at a time.

Every run builds its cases from one seed that a failure names (replay them with
``ch12.check_…(fn, seed=…)``); one case of each category the exercises name comes first, then
random ones.

* ``check_matvec_floor``: the worked example; one row of x (a decode step's matrix-vector
  product); many rows sharing one read of W (where reading W once a row is far off); a small W
  under many rows (where x and y are most of the bytes); bf16, int8 and int4 bytes per value;
  random sizes. The usual mistakes are named: W read once per row of x, x or y left out, GiB/s
  taken for GB/s, milliseconds returned, bits for bytes, FLOPs over the bandwidth.
* ``check_blocked_matvec``: the value against ``x @ W.T`` (float32's precision) and the
  blocks, which the checker watches (:func:`llminfra.runner.ladder.weight_reads`): every row of
  W read by exactly one torch product, no product reading more than ``block_rows`` rows.
  Cases: N a multiple of the block, N not one (the last block shorter), a block of one row, a
  block as large as W, many rows of x, Triton's awkward 1823 × 781, random shapes; then one
  timed case beside the floor at this machine's copy bandwidth, which fails only when the
  answer is generously off (more than :data:`SLOW_X_FLOOR` × the floor and
  :data:`SLOW_X_TORCH` × torch's own ``x @ W.T`` timed beside it: a Python loop over elements,
  not a busy machine). The answer gets copies of x and W; one that changes them is told so.

References: :func:`llminfra.runner.ladder.matvec_floor_s` and
:func:`llminfra.runner.ladder.blocked_matvec` (taught in chapter 12).
"""

from __future__ import annotations

import contextlib
import io
import numbers
import random

import torch

from llminfra.bench.timing import best_time_s, copy_bandwidth_bytes_per_s
from llminfra.course.checking import (Case, CheckFailed, checker, describe, first_matching,
                                      run_checks, seeded, torch_generator)
from llminfra.runner.ladder import matvec_floor_s, read_problem, row_blocks, weight_reads

#: a timed answer fails above this many times its floor (and :data:`SLOW_X_TORCH`)
SLOW_X_FLOOR = 100.0
#: … and above this many times torch's own product of the same shapes, timed beside it
SLOW_X_TORCH = 20.0
#: the timed case: W (N, K) in fp32 (16 MiB), one row of x, blocks of 256 rows
TIMED = (1, 2048, 2048, 256)


# --- exercise 1: the floor ------------------------------------------------------------------

def _floor_hint(args, kwargs, expected, got) -> str:
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return ""                       # the checker then says what kind of value to return
    M, N, K, b, gbs = args
    bw = gbs * 1e9
    wrong = {
        "you read W once per row of x: a product reads the weights once for all the rows "
        "(M·K + N·K + M·N values, not M·N·K)": (M * N * K + M * K + M * N) * b / bw,
        "you left out x and y: the floor counts W read, x read AND y written":
            N * K * b / bw,
        "you left out writing y (M·N values)": (N * K + M * K) * b / bw,
        "you left out reading x (M·K values)": (N * K + M * N) * b / bw,
        "GB/s is 1e9 bytes/s, not 2**30 (GiB/s)": expected * 1e9 / 2**30,
        "you returned milliseconds: the floor is in seconds": expected * 1e3,
        "bytes_per_value is bytes already: do not multiply by 8 (bits)": expected * 8,
        "you divided the FLOPs (2·M·N·K) by the bandwidth: the floor is bytes / bandwidth":
            2 * M * N * K / bw,
        "you returned bytes / s: the floor is bytes divided by the bandwidth, in seconds":
            bw / ((N * K + M * K + M * N) * b),
    }
    return first_matching(got, wrong, expected, rel=1e-6) or (
        "expected (N·K + M·K + M·N) · bytes_per_value / (gb_per_s · 1e9) seconds")


@checker
def check_matvec_floor(fn, seed: int | None = None) -> int:
    """Check ``fn(M, N, K, bytes_per_value, gb_per_s) -> seconds``: the floor of ``x (M, K) ·
    Wᵀ`` with ``W (N, K)``, every value ``bytes_per_value`` bytes, at ``gb_per_s`` GB/s (1e9
    bytes/s). 2048 × 2048 fp32, one row, 20 GB/s: 16,793,600 bytes / 2e10 = 0.8397 ms."""
    seed, rng = seeded(seed)
    gbs = lambda: rng.choice([rng.uniform(5, 60), rng.uniform(500, 5000)])  # noqa: E731
    cases = [Case("the worked example: 2048 × 2048 fp32, one row, 20 GB/s",
                  (1, 2048, 2048, 4, 20.0)),
             Case("one row of x (a decode step's product), fp32",
                  (1, rng.randint(256, 8192), rng.randint(256, 8192), 4, gbs())),
             Case("many rows of x share one read of W (a batch of 64-512), fp32",
                  (rng.randint(64, 512), rng.randint(512, 4096), rng.randint(512, 4096), 4,
                   gbs())),
             Case("a small W under many rows of x: x and y are most of the bytes",
                  (rng.randint(256, 2048), rng.randint(1, 8), rng.randint(4, 64), 4, gbs())),
             Case("bf16 values (2 bytes)", (rng.randint(1, 16), rng.randint(256, 4096),
                                            rng.randint(256, 4096), 2, gbs())),
             Case("int8 values (1 byte)", (rng.randint(1, 16), rng.randint(256, 4096),
                                           rng.randint(256, 4096), 1, gbs())),
             Case("int4 values (half a byte)", (1, 2 * rng.randint(128, 2048),
                                                2 * rng.randint(128, 2048), 0.5, gbs()))]
    for _ in range(2):
        cases.append(Case("random sizes, bytes and bandwidth",
                          (rng.randint(1, 256), rng.randint(1, 8192), rng.randint(1, 8192),
                           rng.choice([0.5, 1, 2, 4]), gbs())))
    return run_checks("matvec_floor", fn, matvec_floor_s, cases, rel=1e-9, hint=_floor_hint,
                      seed=seed, replay="ch12.check_matvec_floor")


# --- exercise 2: a block of W's rows at a time ---------------------------------------------

def _tensors(rng: random.Random, M: int, N: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch_generator(rng)
    return torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)


def _blocked_reference(x, W, block_rows):
    return x.double() @ W.double().T


def _shaped(value, shape: tuple[int, int]) -> bool:
    """Whether ``value`` holds numbers of ``shape`` (a tensor, an array, nested lists)."""
    try:
        return tuple(torch.as_tensor(value).shape) == shape
    except Exception:  # noqa: BLE001 - a dict, a string, ragged lists: not an array
        return False


def _watched(fn):
    """The learner's ``fn`` under :func:`weight_reads`: its blocks judged, its result
    returned (a :class:`CheckFailed` for blocks that are not W's rows, each read once)."""
    def call(x, W, block_rows):
        seen = weight_reads(fn, x, W, block_rows)
        if not _shaped(seen.result, (x.shape[0], W.shape[0])):
            return seen.result          # the wrong kind or shape: compare says what is due
        problem = read_problem(seen.reads, W.shape[0], block_rows)
        if problem is not None:
            extra = ""
            if seen.other:
                extra = (f" (W went through {', '.join(sorted(seen.other))}: the check follows "
                         "torch's products on views of W, so take each block as W[i:j] and "
                         "multiply it with @, torch.matmul or F.linear)")
            elif not seen.reads:
                extra = (": take each block as a view of W, W[i:j] (a copy such as "
                         ".clone() or .numpy() hides it), and multiply it with @, "
                         "torch.matmul or F.linear")
            raise CheckFailed(f"blocked_matvec: {problem}{extra}")
        return seen.result
    return call


def _blocked_hint(args, kwargs, expected, got) -> str:
    x, W, b = args
    N = W.shape[0]
    if not torch.is_tensor(got):
        return ""
    if tuple(got.shape) == (N, x.shape[0]) and x.shape[0] != N:
        return "you returned (N, M): y is (M, N), one row per row of x (x @ W.T, not W @ x.T)"
    last = row_blocks(N, b)[-1]
    cut = expected.clone()
    cut[:, last[0]:] = 0
    wrong = {"the last block's columns are missing (N is not a multiple of block_rows: the "
             "last block is shorter, range(0, N, block_rows) with min(i + block_rows, N))": cut}
    if W.shape[0] == W.shape[1]:
        wrong["you multiplied by W, not its transpose: y = x @ W.T"] = x.double() @ W.double()
    return first_matching(got, wrong, expected, rel=1e-4, abs_=1e-3) or ""


def _timed(fn, rng: random.Random, seed: int) -> None:
    """Time ``fn`` on :data:`TIMED` beside its floor and torch's own product; fail only when
    it is generously off."""
    M, N, K, b = TIMED
    x, W = _tensors(rng, M, N, K)
    with torch.no_grad():
        got = fn(x, W, b)
        mine = best_time_s(lambda: fn(x, W, b), repeats=3)
        theirs = best_time_s(lambda: x @ W.T, repeats=3)
    if got is None:
        raise CheckFailed("blocked_matvec returned None on the timed case")
    if mine <= SLOW_X_TORCH * theirs:  # fast enough: the floor (a bandwidth run) is not needed
        return
    floor = matvec_floor_s(M, N, K, 4, copy_bandwidth_bytes_per_s(2**26, 3) / 1e9)
    if mine > SLOW_X_FLOOR * floor:
        raise CheckFailed(
            f"blocked_matvec: right values, but {mine * 1e3:.4g} ms for one row of x against a "
            f"2048 × 2048 fp32 W, {mine / floor:.4g}× its floor of {floor * 1e3:.4g} ms and "
            f"{mine / theirs:.4g}× torch's x @ W.T ({theirs * 1e3:.4g} ms): each block should "
            f"be one product, not a Python loop over its rows or values\n  the timed case "
            f"(seed {seed}; replay: ch12.check_blocked_matvec(your_function, seed={seed}))")


@checker
def check_blocked_matvec(fn, seed: int | None = None) -> int:
    """Check ``fn(x, W, block_rows) -> y``: ``x (M, K) @ W.T`` for ``W (N, K)``, computed one
    block of ``block_rows`` rows of W at a time, each row of W read by exactly one torch
    product (the checker watches them), the inputs left unchanged; then one timed case."""
    if not callable(fn):
        raise CheckFailed(f"blocked_matvec: expected a function, got {describe(fn)}")
    seed, rng = seeded(seed)
    named = [("one row of x, N a multiple of block_rows", 1, 8 * rng.randint(8, 32), None, 8),
             ("N not a multiple of block_rows: the last block is shorter", 1,
              rng.randint(2, 30) * 16 + rng.randint(1, 15), None, 16),
             ("block_rows = 1: a row of W at a time", rng.randint(1, 4), rng.randint(5, 40),
              None, 1),
             ("block_rows >= N: all of W in one block", rng.randint(1, 4), rng.randint(2, 64),
              None, "N"),
             ("many rows of x (M = 8-32) share each block", rng.randint(8, 32),
              rng.randint(40, 300), None, rng.randint(4, 64)),
             ("awkward shapes: N = 1823, K = 781", 1, 1823, 781, 128)]
    for _ in range(2):
        named.append(("random shapes and block", rng.randint(1, 16), rng.randint(1, 500),
                      None, rng.randint(1, 96)))
    cases = []
    for name, M, N, K, b in named:
        K = K or rng.randint(1, 256)
        b = N + rng.randint(0, 8) if b == "N" else b
        cases.append(Case(f"{name} (M={M}, N={N}, K={K}, block_rows={b})",
                          (*_tensors(rng, M, N, K), b)))
    line = io.StringIO()
    with contextlib.redirect_stdout(line):     # its ✓ line only once the timed case passed
        n = run_checks("blocked_matvec", _watched(fn), _blocked_reference, cases, rel=1e-4,
                       abs_=1e-3, hint=_blocked_hint, seed=seed,
                       replay="ch12.check_blocked_matvec", pure=True, owner=fn)
    _timed(fn, rng, seed)
    print(line.getvalue(), end="")
    return n


__all__ = ["check_blocked_matvec", "check_matvec_floor", "SLOW_X_FLOOR", "SLOW_X_TORCH", "TIMED"]
