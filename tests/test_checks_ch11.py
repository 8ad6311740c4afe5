"""Chapter 11 checkers: right answers in other types pass, each wrong answer is rejected with
its hint over several seeds, the stub reads as not attempted, a seed replays its cases; and
``dispatch_counts`` equals what the expert-parallel layer actually sends."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch11
from llminfra.parallel.expert_parallel import (ExpertParallelMoE, MoECase, dispatch_counts)
from llminfra.parallel.world import run_simulated
from llminfra.sim.goodput import goodput

SEEDS = [1, 2, 3]


# ------------------------------------------------------------- dispatch counts
def _ep_rows_sent(world, case):
    layer, x = case.build()
    x_r = case.rank_tokens(x, world.rank, world.size)
    with torch.no_grad():
        _, stats = ExpertParallelMoE(layer, world).forward_with_stats(x_r)
        expert_ids = layer.route(x_r).expert_ids
    return stats["rows_sent"], expert_ids


@pytest.mark.parametrize("size,case", [
    (4, MoECase(num_experts=8, top_k=2, tokens=37, seed=1)),
    (2, MoECase(num_experts=4, top_k=1, tokens=9, gating="sigmoid", seed=2)),
    (3, MoECase(num_experts=6, top_k=3, tokens=20, seed=3))])
def test_dispatch_counts_equal_the_rows_the_layer_sends(size, case):
    for rows_sent, expert_ids in run_simulated(_ep_rows_sent, size, case):
        assert dispatch_counts(expert_ids, case.num_experts, size) == rows_sent
        assert sum(rows_sent) == expert_ids.numel()


def test_dispatch_counts_by_hand_and_bad_input():
    assert dispatch_counts([[0, 5], [2, 3], [7, 6]], 8, 4) == [1, 2, 1, 2]
    assert dispatch_counts(torch.tensor([[2, 3]]), 8, 4) == [0, 2, 0, 0]
    assert dispatch_counts(np.array([[3], [4]]), 8, 2) == [1, 1]
    assert dispatch_counts([], 8, 2) == [0, 0]
    for args, message in [(([[8]], 8, 2), "expert id 8"), (([[0]], 8, 3), "evenly over 3"),
                          (([0, 1], 8, 2), r"shape \(N, k\)"), (([[0]], 8, 0), "world_size")]:
        with pytest.raises(ValueError, match=message):
            dispatch_counts(*args)


@pytest.mark.parametrize("seed", SEEDS)
def test_dispatch_right_answers_in_other_types_pass(seed):
    assert ch11.check_dispatch_counts(dispatch_counts, seed=seed) == 14
    ch11.check_dispatch_counts(lambda ids, E, n: tuple(dispatch_counts(ids, E, n)), seed=seed)
    ch11.check_dispatch_counts(lambda ids, E, n: torch.tensor(dispatch_counts(ids, E, n)),
                               seed=seed)
    ch11.check_dispatch_counts(lambda ids, E, n: np.array(dispatch_counts(ids, E, n)),
                               seed=seed)


def _counts(expert_ids, E, n, rank_of=lambda e, per, n: e // per, per_token=False):
    """Dispatch counts written by hand, with one of the usual mistakes switched on."""
    per, counts = E // n, [0] * n
    for row in (expert_ids.tolist() if torch.is_tensor(expert_ids) else expert_ids):
        ranks = [rank_of(e, per, n) for e in row]
        for r in (set(ranks) if per_token else ranks):
            counts[r] += 1
    return counts


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong,message,case", [
    (lambda i, E, n: _counts(i, E, n, per_token=True), "not one per token", "case 1 of"),
    (lambda i, E, n: _counts(i, E, n, rank_of=lambda e, per, n: e % n), r"not e % n",
     "case 1 of"),
    (lambda i, E, n: _counts(i, E, n, rank_of=lambda e, per, n: max(0, e - 1) // per),
     "rank 1's first", "case 1 of"),
    (lambda i, E, n: _counts(i, E, n, rank_of=lambda e, per, n: min(n - 1, (e + 1) // per)),
     r"not \(e \+ 1\) // \(E/n\)", "case 1 of"),
    (lambda i, E, n: [0] * n, "add up to N·k", "case 1 of"),
    (lambda i, E, n: [1, 2], "one count per rank", "case 1 of"),
    (lambda i, E, n: 3, "a list of", "case 1 of"),
])
def test_dispatch_diagnoses(wrong, message, case, seed):
    assert ch11.check_dispatch_counts(_counts, seed=seed) == 14
    with pytest.raises(CheckFailed, match=message) as e:
        ch11.check_dispatch_counts(wrong, seed=seed)
    assert case in str(e.value)
    assert f"replay: ch11.check_dispatch_counts(your_function, seed={seed})" in str(e.value)


def test_dispatch_same_token_same_rank_fails_at_its_fixed_case():
    """A count per token (not per assignment) fails at the worked example already; with k = 1
    it is right, so the fixed k = 1 case alone would not catch it."""
    with pytest.raises(CheckFailed, match="sent there twice") as e:
        ch11.check_dispatch_counts(lambda i, E, n: _counts(i, E, n, per_token=True), seed=0)
    assert "the worked example" in str(e.value)


# ------------------------------------------------------------------ the merge
def merge_right(o_a, lse_a, o_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    l = w_a + w_b
    return (o_a * w_a[..., None] + o_b * w_b[..., None]) / l[..., None], m + torch.log(l)


def merge_logaddexp(o_a, lse_a, o_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return [o_a * torch.exp(lse_a - lse)[..., None] + o_b * torch.exp(lse_b - lse)[..., None],
            lse]


def test_merge_worked_example():
    o, lse = merge_right(torch.tensor([[1.0]]), torch.tensor([0.0]), torch.tensor([[3.0]]),
                         torch.tensor([math.log(2.0)]))
    assert float(o) == pytest.approx(7 / 3) and float(lse) == pytest.approx(math.log(3))


@pytest.mark.parametrize("seed", SEEDS)
def test_merge_right_answers_pass(seed):
    assert ch11.check_merge(merge_right, seed=seed) == 11
    ch11.check_merge(merge_logaddexp, seed=seed)
    ch11.check_merge(lambda *a: tuple(t.float() for t in merge_right(*a)), seed=seed)


def _naive(o_a, lse_a, o_b, lse_b):
    w_a, w_b = torch.exp(lse_a), torch.exp(lse_b)
    return ((o_a * w_a[..., None] + o_b * w_b[..., None]) / (w_a + w_b)[..., None],
            torch.log(w_a + w_b))


def _unnormalised(o_a, lse_a, o_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    return o_a * w_a[..., None] + o_b * w_b[..., None], m + torch.log(w_a + w_b)


def _in_place(o_a, lse_a, o_b, lse_b):
    o, lse = merge_right(o_a, lse_a, o_b, lse_b)
    o_a.copy_(o)
    return o_a, lse


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong,message", [
    (lambda o_a, lse_a, o_b, lse_b: ((o_a + o_b) / 2, torch.logaddexp(lse_a, lse_b)),
     "plain average"),
    (_naive, "overflows"),
    (lambda *a: (merge_right(*a)[0], torch.maximum(a[1], a[3])), "not the max m"),
    (lambda *a: (merge_right(*a)[0], torch.log(torch.exp(a[1] - torch.maximum(a[1], a[3]))
                                               + torch.exp(a[3] - torch.maximum(a[1], a[3])))),
     "add back the max"),
    (_unnormalised, "sum of the weights"),
    (lambda *a: (merge_right(*a)[0], merge_right(*a)[1][..., None]), r"lse has shape"),
    (lambda *a: merge_right(*a)[0], "pair"),
    (_in_place, "in place"),
])
def test_merge_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message) as e:
        ch11.check_merge(wrong, seed=seed)
    assert f"replay: ch11.check_merge(your_function, seed={seed})" in str(e.value)


def test_merge_overflow_fails_at_the_large_scores_case():
    with pytest.raises(CheckFailed, match="subtract the max") as e:
        ch11.check_merge(_naive, seed=4)
    assert "very large scores" in str(e.value)


# ------------------------------------------------------------------- goodput
def goodput_by_hand(requests, ttft_slo_s, tpot_slo_s, tpot_gaps=lambda n: n - 1,
                    ttft_from=lambda arrival: arrival, per="duration", strict_ttft=False,
                    strict_tpot=False, start=None, everyone=False):
    """Goodput written by hand, with one of the usual mistakes switched on."""
    good = 0
    for arrival, first, finish, n in requests:
        ttft = first - ttft_from(arrival)
        tpot = (finish - first) / tpot_gaps(n) if n > 1 else 0.0
        ok_ttft = ttft < ttft_slo_s if strict_ttft else ttft <= ttft_slo_s
        ok_tpot = tpot < tpot_slo_s if strict_tpot else tpot <= tpot_slo_s
        good += (ok_ttft and ok_tpot) or everyone
    t0 = min(r[0] for r in requests) if start is None else start
    return good / len(requests) if per == "request" else good / (max(r[2] for r in requests) - t0)


def test_goodput_worked_example():
    worked = [(0.5, 0.7, 1.7, 11), (1.0, 2.0, 2.5, 6), (1.5, 1.75, 2.75, 11),
              (2.0, 2.25, 3.55, 9), (2.5, 2.75, 4.5, 8)]
    assert goodput(worked, 0.5, 0.15) == 0.5 == goodput_by_hand(worked, 0.5, 0.15)


@pytest.mark.parametrize("seed", SEEDS)
def test_goodput_right_answers_in_other_types_pass(seed):
    assert ch11.check_goodput(goodput, seed=seed) == 12
    assert ch11.check_goodput(goodput_by_hand, seed=seed) == 12
    ch11.check_goodput(lambda *a: np.float64(goodput(*a)), seed=seed)
    ch11.check_goodput(lambda *a: torch.tensor(goodput(*a), dtype=torch.float64), seed=seed)


def _one_token_divides(requests, ttft_slo_s, tpot_slo_s):
    good = sum(first - a <= ttft_slo_s and (fin - first) / (n - 1) <= tpot_slo_s
               for a, first, fin, n in requests)
    return good / (max(r[2] for r in requests) - min(r[0] for r in requests))


def _one_token_nan(requests, ttft_slo_s, tpot_slo_s):
    good = sum(first - a <= ttft_slo_s
               and (float("nan") if n == 1 else (fin - first) / (n - 1)) <= tpot_slo_s
               for a, first, fin, n in requests)
    return good / (max(r[2] for r in requests) - min(r[0] for r in requests))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong,message,case", [
    (lambda *a: goodput_by_hand(*a, tpot_gaps=lambda n: n), "n − 1 gaps", "worked example"),
    (lambda *a: goodput_by_hand(*a, ttft_from=lambda arrival: 0.0), "not from time 0",
     "worked example"),
    (lambda *a: goodput_by_hand(*a, per="request"), "attainment", "worked example"),
    (lambda *a: goodput_by_hand(*a, everyone=True), "throughput of all", "worked example"),
    (lambda *a: goodput_by_hand(*a, start=0.0), "first arrival to the last finish",
     "worked example"),
    (lambda *a: goodput_by_hand(*a, strict_ttft=True, strict_tpot=True),
     "compare TTFT and TPOT with <=", "exactly at the TTFT target"),
    (lambda *a: goodput_by_hand(*a, strict_ttft=True), "exactly at its TTFT target",
     "exactly at the TTFT target"),
    (lambda *a: goodput_by_hand(*a, strict_tpot=True), "exactly at its TPOT target",
     "exactly at the TTFT target"),
    (_one_token_divides, "one-token answer has no gap", "a one-token answer"),
    (_one_token_nan, "meets any TPOT target", "a one-token answer"),
    (lambda *a: "fast", "one number", "worked example"),
])
def test_goodput_diagnoses(wrong, message, case, seed):
    with pytest.raises(CheckFailed, match=message) as e:
        ch11.check_goodput(wrong, seed=seed)
    assert case in str(e.value)
    assert f"replay: ch11.check_goodput(your_function, seed={seed})" in str(e.value)


def test_goodput_fixed_cases_are_there():
    seen = []

    def spy(*args):
        seen.append(args)
        return goodput(*args)

    ch11.check_goodput(spy, seed=5)
    assert any(r[3] == 1 for r in seen[1][0]), "a one-token answer"
    assert seen[3][0] and goodput(*seen[3]) == 0.0, "every request missing"
    assert min(r[0] for r in seen[4][0]) >= 100, "a run that starts late"
    assert Fraction(goodput(*seen[2])) > 0 and goodput_by_hand(*seen[2], strict_ttft=True,
                                                              strict_tpot=True) < goodput(*seen[2])


# ---------------------------------------------------------------------- all three
def test_same_seed_same_cases():
    seen = []

    def spy(*args):
        seen.append(args)
        return goodput(*args)

    ch11.check_goodput(spy, seed=11)
    first, seen[:] = list(seen), []
    ch11.check_goodput(spy, seed=11)
    assert seen == first


def test_stub_reads_as_not_attempted():
    def stub(*a, **k):
        raise NotImplementedError("your code here")
    for check in (ch11.check_dispatch_counts, ch11.check_merge, ch11.check_goodput):
        with pytest.raises(NotAttempted, match="not implemented"):
            check(stub)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        ch11.check_goodput(lambda *a: 1 / 0)
    with pytest.raises(CheckFailed, match="expected a function"):
        ch11.check_merge(42)
