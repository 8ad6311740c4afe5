"""Chapter 05 checkers: right answers in other types pass, each wrong answer is rejected with
its hint over several seeds, the stub reads as not attempted, a seed replays its cases."""

import math

import numpy as np
import pytest

from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch05
from llminfra.engine.scheduling_rules import (admit_fcfs, blocks_needed, chunked_prefill_plan,
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
