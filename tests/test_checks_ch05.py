"""Chapter 05 checkers: right answers in other types pass, each wrong answer is rejected with
its hint over several seeds, the stub reads as not attempted, a seed replays its cases."""

import math

import numpy as np
import pytest

from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch05
from llminfra.engine.spec_decode import accept_greedy, expected_tokens_per_step
from llminfra.sim.scheduling_rules import (admit_fcfs, blocks_needed, chunked_prefill_plan,
                                           ttft_tpot)


def test_rules_by_hand():
    """The docstrings' worked examples."""
    assert blocks_needed(33, 16) == 3 and blocks_needed(0, 16) == 0
    assert admit_fcfs([20, 40, 5], free_blocks=4, block_size=16, num_running=1,
                      max_num_seqs=4, max_num_batched_tokens=64) == 1
    assert admit_fcfs([20, 5], free_blocks=4, block_size=16, num_running=3,
                      max_num_seqs=4, max_num_batched_tokens=64) == 1
    ttft, tpot = ttft_tpot(0.0, [0.5, 0.6, 0.8])
    assert ttft == 0.5 and tpot == pytest.approx(0.15)
    assert ttft_tpot(1.0, [1.25]) == (0.25, None)
    assert chunked_prefill_plan([10, 3], 8, 2) == [[6, 0], [4, 2], [0, 1]]
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        chunked_prefill_plan([10, 3], 4, 2)


def test_plan_conserves_tokens_and_budget():
    for prompts, budget, d in [([37, 5, 90], 16, 3), ([1], 2, 0), ([64] * 4, 20, 0)]:
        plan = chunked_prefill_plan(prompts, budget, d)
        assert [sum(col) for col in zip(*plan)] == prompts
        assert all(sum(row) <= budget - d for row in plan)


SEEDS = [1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_right_answers_in_other_types_pass(seed):
    assert ch05.check_admission(admit_fcfs, seed=seed) == 16
    assert ch05.check_admission(lambda w, **kw: np.int64(admit_fcfs(w, **kw)), seed=seed) == 16
    assert ch05.check_admission(lambda w, **kw: float(admit_fcfs(w, **kw)), seed=seed) == 16
    assert ch05.check_ttft_tpot(ttft_tpot, seed=seed) == 12
    ch05.check_ttft_tpot(lambda a, t: [np.float64(t[0] - a), math.nan if len(t) < 2
                                       else (t[-1] - t[0]) / (len(t) - 1)], seed=seed)
    assert ch05.check_chunked_prefill_plan(chunked_prefill_plan, seed=seed) == 12
    ch05.check_chunked_prefill_plan(lambda p, b, d: np.array(chunked_prefill_plan(p, b, d)),
                                    seed=seed)
    ch05.check_chunked_prefill_plan(
        lambda p, b, d: tuple(tuple(r) for r in chunked_prefill_plan(p, b, d)), seed=seed)


def _overtaking(w, *, free_blocks, block_size, num_running, max_num_seqs,
                max_num_batched_tokens):
    n, blocks, tokens = 0, free_blocks, 0
    for p in w:
        need = -(-p // block_size)
        if (num_running + n < max_num_seqs and need <= blocks
                and tokens + p <= max_num_batched_tokens):
            n, blocks, tokens = n + 1, blocks - need, tokens + p
    return n


def _floor_blocks(w, *, free_blocks, block_size, num_running, max_num_seqs,
                  max_num_batched_tokens):
    n, blocks, tokens = 0, free_blocks, 0
    for p in w:
        need = p // block_size
        if num_running + n >= max_num_seqs or need > blocks or tokens + p > max_num_batched_tokens:
            break
        n, blocks, tokens = n + 1, blocks - need, tokens + p
    return n


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong,message", [
    (_overtaking, "FCFS stops at the first"),
    (_floor_blocks, "ceil"),
    (lambda w, **kw: admit_fcfs(w, **dict(kw, num_running=0)), "running requests"),
    (lambda w, **kw: "three", "an int"),
])
def test_admission_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message) as e:
        ch05.check_admission(wrong, seed=seed)
    assert f"replay: ch05.check_admission(your_function, seed={seed})" in str(e.value)


def _admit(w, *, free_blocks, block_size, num_running, max_num_seqs, max_num_batched_tokens,
           blocks_of=lambda p, b: -(-p // b), strict_blocks=False, strict_tokens=False):
    """FCFS admission written by hand, with one of the usual edge mistakes switched on."""
    n, blocks, tokens = 0, free_blocks, 0
    for p in w:
        need = blocks_of(p, block_size)
        fits_blocks = need < blocks if strict_blocks else need <= blocks
        fits_tokens = (tokens + p < max_num_batched_tokens if strict_tokens
                       else tokens + p <= max_num_batched_tokens)
        if num_running + n >= max_num_seqs or not fits_blocks or not fits_tokens:
            break
        n, blocks, tokens = n + 1, blocks - need, tokens + p
    return n


def _slots_left(w, **kw):
    """The batch limit applied afterwards as max_num_seqs - num_running: negative when more
    requests run than max_num_seqs allows."""
    n = _admit(w, **dict(kw, num_running=0, max_num_seqs=len(w) + 1))
    return min(n, kw["max_num_seqs"] - kw["num_running"])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("wrong,case,message", [
    (lambda w, **kw: _admit(w, **kw, blocks_of=lambda p, b: p // b + 1),
     "prompts of exactly two blocks each", r"P // block_size \+ 1 is one too many"),
    (lambda w, **kw: _admit(w, **kw, strict_blocks=True),
     "the last prompt takes exactly the blocks still free", r"need <= free, not <"),
    (lambda w, **kw: _admit(w, **kw, strict_tokens=True),
     "the prompts reach max_num_batched_tokens exactly", r"\(<=, not <\)"),
    (_slots_left, "more requests running than max_num_seqs", "never a negative count"),
])
def test_admission_edges_fail_on_every_run(wrong, case, message, seed):
    """Each edge the instructions name is a fixed case: these wrong answers passed a random
    share of runs (up to 86 %) when only random draws could reach their edge."""
    assert ch05.check_admission(_admit, seed=seed) == 16
    with pytest.raises(CheckFailed, match=message) as e:
        ch05.check_admission(wrong, seed=seed)
    assert case in str(e.value)


def test_admission_checks_the_worked_example():
    seen = []

    def spy(w, **kw):
        seen.append((w, kw))
        return admit_fcfs(w, **kw)

    ch05.check_admission(spy, seed=5)
    assert ([20, 40, 5], dict(free_blocks=4, block_size=16, num_running=1, max_num_seqs=4,
                              max_num_batched_tokens=64)) in seen


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong,message", [
    (lambda a, t: (t[0] - a, (t[-1] - t[0]) / len(t)), "n - 1"),
    (lambda a, t: (t[0] - a, (t[-1] - a) / len(t)), "first token"),
    (lambda a, t: (t[0], ttft_tpot(a, t)[1]), "from the arrival"),
    (lambda a, t: (t[0] - a, 0.0 if len(t) < 2 else ttft_tpot(a, t)[1]), "no gap"),
    (lambda a, t: (t[0] - a, None), "gaps: TPOT is defined"),
    (lambda a, t: 3, "pair"),
])
def test_latency_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message):
        ch05.check_ttft_tpot(wrong, seed=seed)


def _frozen_decodes(prompts, budget, decodes):
    left, plan = list(prompts), []
    while any(left):
        b, row = budget - decodes, []
        for rem in left:
            take = min(rem, b)
            row.append(take)
            b -= take
        left = [r - t for r, t in zip(left, row)]
        plan.append(row)
    return plan


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong,message", [
    (_frozen_decodes, "next step"),
    (lambda p, b, d: [[x] for x in p], "step|budget"),
    (lambda p, b, d: 7, "list of steps"),
    (lambda p, b, d: [1, 2, 3], "one token count per prompt"),
])
def test_plan_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message):
        ch05.check_chunked_prefill_plan(wrong, seed=seed)


def _plan_by_hand(prompts, budget, decodes, *, recount=False, one_per_step=False):
    """The chunked-prefill plan, with one of two slips in the decodes a finished prompt adds:
    ``recount`` adds every finished prompt again after each step, ``one_per_step`` adds one
    decode for a step however many prompts finished in it."""
    left, plan, decoding = list(prompts), [], decodes
    while any(left) and len(plan) < 100:
        b, row = budget - decoding, []
        for rem in left:
            row.append(max(0, min(rem, b)))
            b -= row[-1]
        finished = [rem > 0 and rem == take for rem, take in zip(left, row)]
        left = [r - t for r, t in zip(left, row)]
        plan.append(row)
        if recount:
            decoding += left.count(0)
        else:
            decoding += min(1, sum(finished)) if one_per_step else sum(finished)
    return plan


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("slip,message", [
    (dict(recount=True), "not one more in every later step"),
    (dict(one_per_step=True), "two finishing together add two decodes"),
])
def test_plan_decode_slips_fail_at_their_fixed_case(slip, message, seed):
    """Two prompts that finish in the same step and decode through later steps are a fixed
    case: these slips failed only when a random draw had such prompts."""
    assert ch05.check_chunked_prefill_plan(_plan_by_hand, seed=seed) == 12
    with pytest.raises(CheckFailed, match=message) as e:
        ch05.check_chunked_prefill_plan(lambda p, b, d: _plan_by_hand(p, b, d, **slip),
                                        seed=seed)
    assert "case 5 of 12: two short prompts finish in step 1" in str(e.value)


def test_same_seed_same_cases():
    seen = []

    def spy(*args):
        seen.append(args)
        return chunked_prefill_plan(*args)

    ch05.check_chunked_prefill_plan(spy, seed=11)
    first, seen[:] = list(seen), []
    ch05.check_chunked_prefill_plan(spy, seed=11)
    assert seen == first


def test_stub_reads_as_not_attempted():
    def stub(*a, **k):
        raise NotImplementedError("your code here")
    for check in (ch05.check_admission, ch05.check_ttft_tpot, ch05.check_chunked_prefill_plan):
        with pytest.raises(NotAttempted, match="not implemented"):
            check(stub)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        ch05.check_admission(lambda w, **kw: 1 / 0)
    with pytest.raises(CheckFailed, match="expected a function"):
        ch05.check_ttft_tpot(42)


# ---------------------------------------------------------------- speculative decoding
def _all_matches(t, d):
    m = [x for x, y in zip(t, d) if x == y]
    return m + [t[len(m)]]


@pytest.mark.parametrize("seed", SEEDS)
def test_speculative_checkers_pass_the_reference(seed):
    assert ch05.check_accept_greedy(accept_greedy, seed=seed) == 13
    assert ch05.check_expected_tokens(expected_tokens_per_step, seed=seed) == 12
    assert ch05.check_accept_greedy(lambda t, d: tuple(accept_greedy(t, d)), seed=seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong,message", [
    (_all_matches, "FIRST mismatch"),
    (lambda t, d: accept_greedy(t, d)[:-1], "target's"),
    (lambda t, d: accept_greedy(t, d)[:-1] if len(accept_greedy(t, d)) == len(d) + 1
     else accept_greedy(t, d), "gamma \\+ 1 tokens"),
    (lambda t, d: accept_greedy(t, d) if len(accept_greedy(t, d)) == len(d) + 1
     else d[:len(accept_greedy(t, d))], "replaces the draft"),
])
def test_accept_greedy_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message):
        ch05.check_accept_greedy(wrong, seed=seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong,message", [
    (lambda a, g: (1 - a ** g) / (1 - a) if a < 1 else g, "gamma \\+ 1"),
    (lambda a, g: a * (1 - a ** g) / (1 - a) if a < 1 else g, "at least one"),
    (lambda a, g: 1 + g * a, "prefix"),
    (lambda a, g: (1 - a ** (g + 1)) / (1 - a), "0 / 0"),
])
def test_expected_tokens_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message):
        ch05.check_expected_tokens(wrong, seed=seed)
