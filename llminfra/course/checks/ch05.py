"""Answer checkers for chapter 05 (``solutions/05_serving_and_continuous_batching.ipynb``): the
continuous-batching admission step under a block budget, TTFT and time per output token from
timestamps, and the step plan of chunked prefill; the speculative-decoding checkers
(``check_accept_greedy``, ``check_expected_tokens``) are :mod:`.ch05_spec`, re-exported here.

Each checker builds named cases from one seed (every category the exercise names first, then
random ones), compares the learner's function with :mod:`llminfra.sim.scheduling_rules`, and
on a mismatch names the case, the seed to replay it and the usual mistake the answer matches:
a later request overtaking one that does not fit, ``P // block_size`` blocks instead of the
ceiling (or ``P // block_size + 1``, one too many for whole blocks), a prompt that exactly
fills the free blocks or the token budget turned away, the running requests left out of
``max_num_seqs``, a negative count; n instead of n − 1 gaps, TPOT from the arrival, TTFT from
time 0; finished prefills that never start decoding. Each of these edges is a fixed case, so a
wrong answer fails on every run, not only when a random draw reaches it.
"""

from __future__ import annotations

import math
import numbers
import random

from llminfra.course.checking import (Case, CheckFailed, checker, first_matching, run_checks,
                                      seeded)
from llminfra.sim.scheduling_rules import (admit_fcfs, blocks_needed, chunked_prefill_plan,
                                           ttft_tpot)
from llminfra.course.checks.ch05_spec import check_accept_greedy, check_expected_tokens


# ------------------------------------------------------------------- admission
def _limits(B, free_blocks, num_running, max_num_seqs, budget_blocks) -> dict:
    return dict(free_blocks=free_blocks, block_size=B, num_running=num_running,
                max_num_seqs=max_num_seqs, max_num_batched_tokens=budget_blocks * B)


def _admission_cases(rng: random.Random) -> list[Case]:
    """One case per category: the worked example; limited by blocks with a later request that
    would fit (head of line), by max_num_seqs with requests running, by the token budget; all
    admitted, an empty queue; and the edges the instructions name — prompts one token over a
    block boundary, prompts of whole blocks (no extra block), a last prompt that takes exactly
    the free blocks, prompts that reach max_num_batched_tokens exactly, running requests
    already over max_num_seqs; then random ones."""
    B = rng.choice([4, 8, 16])
    fixed = [
        ("the worked example", [20, 40, 5], dict(free_blocks=4, block_size=16, num_running=1,
                                                max_num_seqs=4, max_num_batched_tokens=64)),
        ("limited by free blocks; a later, smaller request would fit (no overtaking)",
         [3 * B, 5 * B, 1], _limits(B, 4, 0, 8, 10)),
        ("limited by max_num_seqs, requests already running", [B, B, B], _limits(B, 20, 3, 5, 10)),
        ("limited by max_num_batched_tokens", [4 * B, 4 * B], _limits(B, 20, 0, 8, 6)),
        ("everything admitted", [B + 1, 2, 3], _limits(B, 10, 1, 8, 10)),
        ("empty queue", [], dict(_limits(B, 3, 0, 4, 1), max_num_batched_tokens=64)),
        ("prompts one token over a block boundary", [B + 1, B + 1], _limits(B, 3, 0, 4, 10)),
        ("prompts of exactly two blocks each: no extra block", [2 * B, 2 * B],
         _limits(B, 5, 0, 8, 10)),
        ("the last prompt takes exactly the blocks still free", [B - 1, B + 1],
         _limits(B, 3, 0, 8, 10)),
        ("the prompts reach max_num_batched_tokens exactly", [B, B], _limits(B, 10, 0, 8, 2)),
        ("more requests running than max_num_seqs: none admitted", [1, 1],
         _limits(B, 10, 5, 4, 10)),
    ]
    cases = [Case(name, (w,), kw) for name, w, kw in fixed]
    for _ in range(5):
        B = rng.choice([2, 4, 8, 16])
        waiting = [rng.randint(1, 6 * B) for _ in range(rng.randint(1, 8))]
        kw = dict(free_blocks=rng.randint(0, 16), block_size=B, num_running=rng.randint(0, 6),
                  max_num_seqs=rng.randint(1, 10), max_num_batched_tokens=rng.randint(B, 20 * B))
        cases.append(Case("random queue and limits", (waiting,), kw))
    return cases


def _variant(w, *, free_blocks, block_size, num_running, max_num_seqs,
             max_num_batched_tokens, overtake=False, floor_blocks=False, plus_one=False,
             strict_blocks=False, strict_tokens=False) -> int:
    """The usual mistakes: ``overtake`` skips a request that does not fit and admits later
    ones; ``floor_blocks`` counts ``P // block_size`` blocks, ``plus_one`` ``P // block_size +
    1``; ``strict_blocks`` / ``strict_tokens`` turn away a prompt that exactly fills the free
    blocks / the token budget."""
    n, blocks, tokens = 0, free_blocks, 0
    for p in w:
        need = (p // block_size if floor_blocks else p // block_size + 1 if plus_one
                else blocks_needed(p, block_size))
        fits_blocks = need < blocks if strict_blocks else need <= blocks
        left = max_num_batched_tokens - tokens
        fits_tokens = p < left if strict_tokens else p <= left
        if num_running + n < max_num_seqs and fits_blocks and fits_tokens:
            n, blocks, tokens = n + 1, blocks - need, tokens + p
        elif not overtake:
            break
    return n


def _admission_hint(args, kw, expected, got) -> str:
    (w,) = args
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return f"return the number admitted (an int), got {type(got).__name__}"
    if got < 0:
        return ("never a negative count: when the running requests already fill (or exceed) "
                "max_num_seqs, admit none")
    wrong = {
        "you skipped a request that did not fit and admitted later ones; FCFS stops at the "
        "first request that does not fit": _variant(w, **kw, overtake=True),
        "a prompt of P tokens needs ceil(P / block_size) blocks, not P // block_size":
            _variant(w, **kw, floor_blocks=True),
        "a prompt of P tokens needs ceil(P / block_size) blocks: a whole number of blocks "
        "needs no extra one (P // block_size + 1 is one too many)":
            _variant(w, **kw, plus_one=True),
        "a prompt that needs exactly the blocks still free fits (need <= free, not <)":
            _variant(w, **kw, strict_blocks=True),
        "prompt tokens that reach max_num_batched_tokens exactly fit (<=, not <)":
            _variant(w, **kw, strict_tokens=True),
        "the running requests count against max_num_seqs too":
            admit_fcfs(w, **dict(kw, num_running=0)),
    }
    return first_matching(got, wrong, expected) or \
        "expected the count admitted from the head of the queue"


@checker
def check_admission(fn, seed: int | None = None) -> int:
    """Check ``fn(waiting_prompt_lens, *, free_blocks, block_size, num_running, max_num_seqs,
    max_num_batched_tokens) -> int`` against :func:`admit_fcfs`. Waiting [20, 40, 5], block 16,
    4 free blocks, 1 running, max_num_seqs 4, budget 64: 1 (2 blocks, then 3 > 2 left)."""
    seed, rng = seeded(seed)
    return run_checks("admission", fn, admit_fcfs, _admission_cases(rng), hint=_admission_hint,
                      seed=seed, replay="ch05.check_admission")


# -------------------------------------------------------------- TTFT and TPOT
#: what TPOT is for a one-token request (the learner may return None or NaN)
UNDEFINED = "undefined (one token)"


def _latency_cases(rng: random.Random) -> list[Case]:
    """Tokens from arrival 0, two tokens after a late arrival, a long wait for the first
    token, one token (TPOT undefined); then random."""
    cases = [Case("several tokens, arrival at time 0", (0.0, [0.5, 0.6, 0.8])),
             Case("two tokens, late arrival", (1.0, [1.5, 1.75])),
             Case("several tokens, long wait for the first", (10.0, [12.0, 12.01, 12.02, 12.5])),
             Case("one token: TPOT undefined", (0.0, [0.25]))]
    for _ in range(8):
        arrival = rng.uniform(0, 5)
        t = arrival + rng.uniform(0.01, 2)
        times = [t]
        for _ in range(rng.randint(0, 30)):
            t += rng.uniform(0.001, 0.2)
            times.append(t)
        cases.append(Case("random arrival and token times", (arrival, times)))
    return cases


def _latency_reference(arrival, times):
    ttft, tpot = ttft_tpot(arrival, times)
    return (ttft, UNDEFINED if tpot is None else tpot)


def _latency_answer(expected, got):
    """A pair of numbers; ``None`` or NaN for TPOT reads as undefined."""
    if isinstance(got, str) or not hasattr(got, "__len__") or len(got) != 2:
        raise CheckFailed(f"ttft_tpot: return a pair (ttft_s, tpot_s), got {got!r:.80}")
    ttft, tpot = got
    try:
        undefined = tpot is None or math.isnan(float(tpot))
    except (TypeError, ValueError):
        return (ttft, tpot)
    return (ttft, UNDEFINED if undefined else tpot)


def _latency_hint(args, kw, expected, got) -> str:
    arrival, times = args
    n = len(times)
    if n == 1:
        return "with one token there is no gap: return None (or NaN) for TPOT"
    if got[1] == UNDEFINED:
        return f"with {n} tokens there are {n - 1} gaps: TPOT is defined"
    wrong = {
        "n tokens have n - 1 gaps: divide by (n - 1)":
            (expected[0], (times[-1] - times[0]) / n),
        "TPOT starts at the first token, not at the arrival (TTFT is separate)":
            (expected[0], (times[-1] - arrival) / n),
        "TPOT starts at the first token, not at the arrival (TTFT is separate); divide by n - 1":
            (expected[0], (times[-1] - arrival) / (n - 1)),
        "TTFT is measured from the arrival, not from time 0": (times[0], expected[1]),
    }
    return first_matching(got, wrong, expected) or \
        "TTFT = first token - arrival; TPOT = (last - first) / (n - 1)"


@checker
def check_ttft_tpot(fn, seed: int | None = None) -> int:
    """Check ``fn(arrival_s, token_times_s) -> (ttft_s, tpot_s)``; TPOT ``None`` (or NaN) for
    one token. Arrival 0.0, tokens at [0.5, 0.6, 0.8]: (0.5, 0.15)."""
    seed, rng = seeded(seed)
    return run_checks("ttft_tpot", fn, _latency_reference, _latency_cases(rng),
                      hint=_latency_hint, seed=seed, replay="ch05.check_ttft_tpot",
                      normalize=_latency_answer)


# ------------------------------------------------------- chunked-prefill plan
def _plan_cases(rng: random.Random) -> list[Case]:
    """A prompt that fits one step, one cut into several chunks, two prompts sharing a step
    beside running decodes, decodes that grow as prompts finish, two prompts that finish in
    the same step and decode through several later ones; then random."""
    cases = [Case("one prompt that fits one step, no decodes", ([5], 16, 0)),
             Case("one prompt cut into chunks, no decodes", ([40], 16, 0)),
             Case("two prompts sharing steps, decodes running", ([10, 3], 8, 2)),
             Case("three prompts whose finished prefills start decoding", ([7, 7, 7], 12, 1)),
             Case("two short prompts finish in step 1, then decode through the later steps",
                  ([2, 3, 11], 8, 1))]
    for _ in range(7):
        prompts = [rng.randint(1, 60) for _ in range(rng.randint(1, 5))]
        decodes = rng.randint(0, 4)
        budget = rng.randint(decodes + len(prompts) + 1, 48)
        cases.append(Case("random prompts, budget and decodes", (prompts, budget, decodes)))
    return cases


def _plan_variant(prompts, budget, decodes, *, frozen=False, recount=False,
                  one_per_step=False):
    """The usual mistakes: ``frozen``, finished prompts never add a decode token;
    ``recount``, every finished prompt adds one again in each later step; ``one_per_step``,
    prompts finishing together add a single decode."""
    left, plan = list(prompts), []
    while any(left) and len(plan) < 1000:
        b, row = budget - decodes, []
        for rem in left:
            row.append(max(0, min(rem, b)))
            b -= row[-1]
        done = [rem > 0 and rem == take for rem, take in zip(left, row)]
        left = [r - t for r, t in zip(left, row)]
        plan.append(row)
        if recount:
            decodes += sum(1 for r in left if r == 0)
        elif one_per_step:
            decodes += any(done)
        elif not frozen:
            decodes += sum(done)
    return plan


def _plan_answer(expected, got):
    """Rows as lists (a NumPy array or tensor of rows is fine)."""
    if hasattr(got, "tolist") and not isinstance(got, (list, tuple)):
        got = got.tolist()
    return got


def _plan_hint(args, kw, expected, got) -> str:
    prompts, budget, decodes = args
    if not isinstance(got, (list, tuple)):
        return "return a list of steps, each a list with one token count per prompt"
    if any(not isinstance(r, (list, tuple)) or len(r) != len(prompts) for r in got):
        return "each step is a list with one token count per prompt (0 when it has none)"
    wrong = {"a prompt whose prefill finished decodes from the next step on: its one token "
             "a step comes off the budget": _plan_variant(prompts, budget, decodes, frozen=True),
             "a finished prompt adds ONE decode, when its prefill completes — not one more in "
             "every later step": _plan_variant(prompts, budget, decodes, recount=True),
             "every prompt that finishes in a step starts decoding: two finishing together add "
             "two decodes": _plan_variant(prompts, budget, decodes, one_per_step=True)}
    return first_matching(got, wrong, expected) or \
        "fill each step's budget: decodes first, then prompts in arrival order"


@checker
def check_chunked_prefill_plan(fn, seed: int | None = None) -> int:
    """Check ``fn(prompt_lens, max_num_batched_tokens, num_decodes) -> list of rows`` (row s,
    column i: prefill tokens of prompt i in step s) against :func:`chunked_prefill_plan`.
    Prompts [10, 3], budget 8, 2 decodes: [[6, 0], [4, 2], [0, 1]]."""
    seed, rng = seeded(seed)
    return run_checks("chunked_prefill_plan", fn, chunked_prefill_plan, _plan_cases(rng),
                      hint=_plan_hint, seed=seed, replay="ch05.check_chunked_prefill_plan",
                      normalize=_plan_answer)


__all__ = ["check_accept_greedy", "check_admission", "check_chunked_prefill_plan",
           "check_expected_tokens", "check_ttft_tpot"]
