"""Answer checkers for chapter 11 (``solutions/11_beyond_one_engine.ipynb``): the row counts of
expert parallelism's dispatch all-to-all, the merge of two partial attention results that ring
attention repeats on every hop (:mod:`.ch11_merge`, re-exported here), and goodput from request
timestamps.

Each checker builds named cases from one seed (every edge the exercise names first, then random
ones), compares the learner's function with the package
(:func:`llminfra.parallel.expert_parallel.dispatch_counts`,
:func:`llminfra.attention.merge_partials`, :func:`llminfra.sim.goodput.goodput`) and on a
mismatch names the case, the seed to replay it and the usual mistake the answer matches:
tokens counted instead of (token, expert) assignments, ``expert % n`` instead of
``expert // (E/n)``, an expert at a rank boundary given to the neighbour; a plain average of the
outputs, ``exp(lse)`` without the max subtracted (overflow), the max instead of the log-sum-exp,
weights that do not sum to one; TPOT over n instead of n − 1 gaps, TTFT from time 0, the share of
requests (attainment) or the throughput of all requests instead of goodput, a duration from
time 0, a request exactly at its SLO turned away.

Sources: Lepikhin et al. 2020 (GShard, arXiv:2006.16668, §3.2); Liu, Zaharia, Abbeel 2023 (Ring
Attention, arXiv:2310.01889); Dao et al. 2022 (FlashAttention, arXiv:2205.14135, Algorithm 1);
Zhong et al. 2024 (DistServe, arXiv:2401.09670, §2). Taught in chapter 11.
"""

from __future__ import annotations

import math
import random

import torch

from llminfra.course.checking import (Case, CheckFailed, checker, first_matching, run_checks,
                                      seeded)
from llminfra.course.checks.ch11_merge import check_merge
from llminfra.sim.goodput import goodput
from llminfra.parallel.expert_parallel import dispatch_counts

__all__ = ["check_dispatch_counts", "check_merge", "check_goodput", "CheckFailed"]


# ------------------------------------------------------------- dispatch counts
def _dispatch_cases(rng: random.Random) -> list[Case]:
    """The worked example, every assignment to one rank, experts either side of the rank
    boundaries, one rank, k = 1 (as a tensor), a token whose two experts share a rank; then
    random routings, as lists and as tensors."""
    cases = [
        Case("the worked example: E=8, n=4, k=2", ([[0, 5], [2, 3], [7, 6]], 8, 4)),
        Case("every assignment goes to one rank: E=8, n=4, k=2",
             ([[4, 5], [5, 4], [4, 5], [5, 4], [4, 5]], 8, 4)),
        Case("experts E/n - 1 and E/n at the rank boundaries: E=12, n=3, k=2",
             ([[3, 4], [8, 7], [4, 11], [0, 3], [7, 5]], 12, 3)),
        Case("world_size 1: E=4, n=1, k=2", ([[0, 3], [2, 1], [3, 1]], 4, 1)),
        Case("k = 1, an (N, 1) tensor: E=8, n=2",
             (torch.tensor([[1], [6], [3], [4], [0]]), 8, 2)),
        Case("a token whose two experts sit on the same rank: E=8, n=4, k=2",
             ([[2, 3], [0, 7], [6, 1]], 8, 4)),
    ]
    for i in range(8):
        n = rng.choice([1, 2, 3, 4, 8])
        E = n * rng.choice([1, 2, 3, 4])
        k = rng.randint(1, min(4, E))
        N = rng.randint(1, 24)
        ids = [rng.sample(range(E), k) for _ in range(N)]
        kind = "list" if i % 2 == 0 else "tensor"
        cases.append(Case(f"random routing as a {kind}: E={E}, n={n}, k={k}, N={N}",
                          (ids if kind == "list" else torch.tensor(ids), E, n)))
    return cases


def _dispatch_variant(expert_ids, E: int, n: int, *, tokens=False, modulo=False,
                      inclusive=False, shifted=False) -> list[int]:
    """The usual mistakes: ``tokens`` counts a token once per rank however many of its experts
    sit there; ``modulo`` puts expert e on rank ``e % n``; ``inclusive`` reads rank j's range
    as ``j·E/n … (j+1)·E/n`` (expert E/n goes to rank 0); ``shifted`` uses ``(e + 1) // (E/n)``
    (expert E/n − 1 goes to rank 1)."""
    per = E // n
    rows = expert_ids.tolist() if hasattr(expert_ids, "tolist") else expert_ids
    counts = [0] * n
    for row in rows:
        ranks = []
        for e in row:
            if modulo:
                r = e % n
            elif inclusive:
                r = max(0, e - 1) // per
            elif shifted:
                r = min(n - 1, (e + 1) // per)
            else:
                r = e // per
            ranks.append(r)
        for r in (set(ranks) if tokens else ranks):
            counts[r] += 1
    return counts


def _dispatch_hint(args, kw, expected, got) -> str:
    expert_ids, E, n = args
    if not isinstance(got, (list, tuple)) or isinstance(got, str):
        return f"return a list of {n} ints, one count per destination rank"
    if len(got) != n:
        return f"return one count per rank: {n} of them (world_size), got {len(got)}"
    assignments = sum(expected)
    wrong = {
        "count one row per (token, expert) assignment, not one per token: a token whose two "
        "experts sit on the same rank is sent there twice":
            _dispatch_variant(expert_ids, E, n, tokens=True),
        f"rank j holds a contiguous block of E/n = {E // n} experts: expert e is on rank "
        "e // (E/n), not e % n": _dispatch_variant(expert_ids, E, n, modulo=True),
        f"off by one at a rank boundary: rank j holds experts j·E/n … (j+1)·E/n − 1, so "
        f"expert {E // n} is rank 1's first (not rank 0's last)":
            _dispatch_variant(expert_ids, E, n, inclusive=True),
        f"off by one at a rank boundary: expert E/n − 1 = {E // n - 1} is still on rank 0; "
        "the rank is e // (E/n), not (e + 1) // (E/n)":
            _dispatch_variant(expert_ids, E, n, shifted=True),
    }
    found = first_matching(got, wrong, expected)
    if found:
        return found
    try:
        total = sum(got)
    except TypeError:
        total = None
    if total is not None and total != assignments:
        return (f"the counts must add up to N·k = {assignments}: every (token, expert) "
                f"assignment is one row sent somewhere (yours add up to {total})")
    return "expert e lives on rank e // (E/n); count every (token, expert) pair there"


@checker
def check_dispatch_counts(fn, seed: int | None = None) -> int:
    """Check ``fn(expert_ids, num_experts, world_size) -> list of n row counts`` against
    :func:`~llminfra.parallel.expert_parallel.dispatch_counts`. E = 8, n = 4,
    ``[[0, 5], [2, 3], [7, 6]]`` → ``[1, 2, 1, 2]``."""
    seed, rng = seeded(seed)
    return run_checks("dispatch_counts", fn, dispatch_counts, _dispatch_cases(rng), rel=0.0,
                      hint=_dispatch_hint, seed=seed, replay="ch11.check_dispatch_counts")


# ------------------------------------------------------------------- goodput
def _request(rng: random.Random, arrival: float, ttft_slo: float, tpot_slo: float) -> tuple:
    """One random request whose TTFT and TPOT fall either side of the targets."""
    n = rng.choice([1, 2, rng.randint(3, 40)])
    first = arrival + ttft_slo * rng.uniform(0.2, 1.6)
    finish = first + (n - 1) * tpot_slo * rng.uniform(0.5, 1.4)
    return (round(arrival, 6), round(first, 6), round(finish, 6), n)


def _goodput_cases(rng: random.Random) -> list[Case]:
    """The worked example, a one-token answer, requests exactly at the TTFT and the TPOT
    target, every request missing, a run that starts long after time 0; then random runs."""
    worked = [(0.5, 0.7, 1.7, 11), (1.0, 2.0, 2.5, 6), (1.5, 1.75, 2.75, 11),
              (2.0, 2.25, 3.55, 9), (2.5, 2.75, 4.5, 8)]
    one_token = [(0.0, 0.25, 0.25, 1), (0.5, 0.75, 2.75, 9), (1.0, 1.25, 1.25, 1)]
    at_slo = [(0.0, 0.25, 0.5, 5), (0.0, 0.125, 0.625, 5), (0.0, 0.125, 1.125, 9),
              (0.0, 0.0625, 0.3125, 5)]
    missing = [(0.0, 1.0, 2.0, 5), (0.5, 0.625, 4.625, 5), (1.0, 2.5, 2.5, 1)]
    late = [(100.0, 100.25, 101.25, 11), (100.5, 100.625, 102.0, 12), (101.0, 102.5, 104.0, 4)]
    cases = [Case("the worked example: 5 requests", (worked, 0.5, 0.15)),
             Case("a one-token answer (no gap: it meets any TPOT target)", (one_token, 0.5, 0.2)),
             Case("one request exactly at the TTFT target, two exactly at the TPOT target "
                  "(<= counts as met)", (at_slo, 0.25, 0.125)),
             Case("every request misses a target", (missing, 0.25, 0.5)),
             Case("the run starts at t = 100 s, not at 0", (late, 0.5, 0.15))]
    for _ in range(7):
        ttft_slo, tpot_slo = rng.choice([0.2, 0.5, 1.0, 2.0]), rng.choice([0.02, 0.05, 0.1])
        t, reqs = rng.uniform(0, 50), []
        for _ in range(rng.randint(1, 25)):
            reqs.append(_request(rng, t, ttft_slo, tpot_slo))
            t += rng.expovariate(2.0)
        cases.append(Case(f"random run of {len(reqs)} requests", (reqs, ttft_slo, tpot_slo)))
    return cases


def _goodput_variant(requests, ttft_slo, tpot_slo, *, tpot_over_n=False, ttft_from_zero=False,
                     attainment=False, everyone=False, from_zero=False, strict_ttft=False,
                     strict_tpot=False, one_token_misses=False) -> float:
    """The usual mistakes (see the module docstring), one flag each."""
    good = 0
    for arrival, first, finish, n in requests:
        ttft = first - (0.0 if ttft_from_zero else arrival)
        if n == 1:
            tpot = math.inf if one_token_misses else 0.0
        else:
            tpot = (finish - first) / (n if tpot_over_n else n - 1)
        ok_ttft = ttft < ttft_slo if strict_ttft else ttft <= ttft_slo
        good += ok_ttft and (tpot < tpot_slo if strict_tpot else tpot <= tpot_slo)
    if everyone:
        good = len(requests)
    if attainment:
        return good / len(requests)
    start = 0.0 if from_zero else min(r[0] for r in requests)
    return good / (max(r[2] for r in requests) - start)


def _goodput_hint(args, kw, expected, got) -> str:
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return f"return one number, requests per second, got {type(got).__name__}"
    wrong = {
        "n tokens have n − 1 gaps: TPOT = (finish − first token) / (n − 1)":
            dict(tpot_over_n=True),
        "TTFT is measured from the request's arrival, not from time 0": dict(ttft_from_zero=True),
        "goodput is good requests per SECOND of the run (first arrival to last finish), not "
        "the share of requests that met the targets (that is attainment)": dict(attainment=True),
        "count only the requests that meet BOTH targets: this is the throughput of all "
        "requests": dict(everyone=True),
        "the run lasts from the first arrival to the last finish, not from time 0":
            dict(from_zero=True),
        "a request exactly at its TTFT target meets it: compare with <=, not <":
            dict(strict_ttft=True),
        "a request exactly at its TPOT target meets it: compare with <=, not <":
            dict(strict_tpot=True),
        "a request exactly at a target meets it: compare TTFT and TPOT with <=, not <":
            dict(strict_ttft=True, strict_tpot=True),
        "a one-token answer has no gap between tokens: it meets any TPOT target":
            dict(one_token_misses=True),
    }
    wrong = {k: _goodput_variant(*args, **v) for k, v in wrong.items()}
    return first_matching(got, wrong, expected) or \
        ("good = TTFT <= ttft_slo_s and TPOT <= tpot_slo_s; goodput = good requests / "
         "(last finish − first arrival)")


def _goodput_error_hint(args, kw, error) -> str:
    if isinstance(error, ZeroDivisionError) and any(r[3] == 1 for r in args[0]):
        return ("a one-token answer has no gap between tokens (n − 1 = 0): it meets any TPOT "
                "target, so do not divide for it")
    return ""


@checker
def check_goodput(fn, seed: int | None = None) -> int:
    """Check ``fn(requests, ttft_slo_s, tpot_slo_s) -> requests per second`` (requests:
    ``(arrival_s, first_token_s, finish_s, output_tokens)`` tuples) against
    :func:`llminfra.sim.goodput.goodput`. The worked example: 2 of 5 requests good over
    4 s (0.5 s … 4.5 s) → 0.5."""
    seed, rng = seeded(seed)
    return run_checks("goodput", fn, goodput, _goodput_cases(rng), rel=1e-9, abs_=1e-12,
                      hint=_goodput_hint, seed=seed, replay="ch11.check_goodput",
                      on_error=_goodput_error_hint)
