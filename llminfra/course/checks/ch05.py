"""Answer checkers for chapter 05 (``solutions/05_serving_and_continuous_batching.ipynb``): the
continuous-batching admission step under a block budget, TTFT and time per output token from
timestamps, and the step plan of chunked prefill.

Each checker draws fresh random cases from a printed seed, always including every case category
the exercise names, compares with :mod:`llminfra.engine.scheduling_rules`, and on a mismatch
names the case, the seed, what came back and the usual mistake it matches.
"""

from __future__ import annotations

import math
import numbers
import random

from llminfra.course.checking import CheckFailed, fresh_rng, run_checks
from llminfra.engine.scheduling_rules import (admit_fcfs, blocks_needed, chunked_prefill_plan,
                                              ttft_tpot)


def _with_seed(seed: int, fn, *args, **kwargs) -> int:
    try:
        return fn(*args, **kwargs)
    except CheckFailed as e:
        raise CheckFailed(f"{e} [cases drawn with random.Random({seed})]") from None


def _safe(hint):
    """A hint never crashes on a strange answer: it then says nothing."""
    def wrapped(*args):
        try:
            return hint(*args)
        except Exception:  # noqa: BLE001 - the learner's answer can be anything
            return ""
    return wrapped


def _as_int(x):
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        if isinstance(x, numbers.Real) and float(x).is_integer():
            return int(x)
        return x
    return int(x)


# ------------------------------------------------------------------- admission
def _admission_cases(rng: random.Random) -> list:
    """One case per category: limited by blocks, by max_num_seqs, by the token budget, all
    admitted, empty queue, head-of-line (a later request would fit), a prompt one token over a
    block boundary, then random ones."""
    B = rng.choice([4, 8, 16])
    cases = [
        ([3 * B, 5 * B, 1], dict(free_blocks=4, block_size=B, num_running=0, max_num_seqs=8,
                                 max_num_batched_tokens=10 * B)),                # blocks; HoL
        ([B, B, B], dict(free_blocks=20, block_size=B, num_running=3, max_num_seqs=5,
                         max_num_batched_tokens=10 * B)),                        # max_num_seqs
        ([4 * B, 4 * B], dict(free_blocks=20, block_size=B, num_running=0, max_num_seqs=8,
                              max_num_batched_tokens=6 * B)),                    # token budget
        ([B + 1, 2, 3], dict(free_blocks=10, block_size=B, num_running=1, max_num_seqs=8,
                             max_num_batched_tokens=10 * B)),                    # all admitted
        ([], dict(free_blocks=3, block_size=B, num_running=0, max_num_seqs=4,
                  max_num_batched_tokens=64)),                                   # empty queue
        ([B + 1, B + 1], dict(free_blocks=3, block_size=B, num_running=0, max_num_seqs=4,
                              max_num_batched_tokens=10 * B)),  # one token over a boundary
    ]
    for _ in range(10):
        B = rng.choice([2, 4, 8, 16])
        waiting = [rng.randint(1, 6 * B) for _ in range(rng.randint(1, 8))]
        cases.append((waiting, dict(free_blocks=rng.randint(0, 16), block_size=B,
                                    num_running=rng.randint(0, 6),
                                    max_num_seqs=rng.randint(1, 10),
                                    max_num_batched_tokens=rng.randint(B, 20 * B))))
    return [((w,), kw) for w, kw in cases]


def _admission_hint(args, kw, expected, got) -> str:
    (w,) = args
    if not isinstance(got, numbers.Integral):
        return f"return the number admitted (an int), got {type(got).__name__}"
    skip, blocks, tokens = 0, kw["free_blocks"], 0
    for p in w:   # the overtaking variant: skip requests that do not fit instead of stopping
        n = blocks_needed(p, kw["block_size"])
        if (kw["num_running"] + skip < kw["max_num_seqs"] and n <= blocks
                and tokens + p <= kw["max_num_batched_tokens"]):
            skip, blocks, tokens = skip + 1, blocks - n, tokens + p
    if got == skip != expected:
        return ("you skipped a request that did not fit and admitted later ones; FCFS stops at "
                "the first request that does not fit")
    floor = admit_fcfs([max(0, p - p % kw["block_size"]) or 1 for p in w], **kw)
    if got == floor != expected:
        return "a prompt of P tokens needs ceil(P / block_size) blocks, not P // block_size"
    if got == admit_fcfs(w, **dict(kw, num_running=0)) != expected:
        return "the running requests count against max_num_seqs too"
    return "expected the count admitted from the head of the queue"


def check_admission(fn) -> int:
    """``fn(waiting_prompt_lens, *, free_blocks, block_size, num_running, max_num_seqs,
    max_num_batched_tokens) -> int`` against :func:`admit_fcfs`."""
    seed = fresh_rng().randrange(2**31)
    cases = _admission_cases(random.Random(seed))

    def learner(w, **kw):
        return _as_int(fn(list(w), **kw))

    return _with_seed(seed, run_checks, "admission", learner, admit_fcfs, cases,
                      hint=_safe(_admission_hint))


# -------------------------------------------------------------- TTFT and TPOT
def _latency_cases(rng: random.Random) -> list:
    """Many tokens, two tokens, a late arrival, one token (TPOT undefined), then random."""
    cases = [(0.0, [0.5, 0.6, 0.8]), (1.0, [1.5, 1.75]), (10.0, [12.0, 12.01, 12.02, 12.5]),
             (0.0, [0.25])]
    for _ in range(8):
        arrival = rng.uniform(0, 5)
        t = arrival + rng.uniform(0.01, 2)
        times = [t]
        for _ in range(rng.randint(0, 30)):
            t += rng.uniform(0.001, 0.2)
            times.append(t)
        cases.append((arrival, times))
    return [((a, ts), {}) for a, ts in cases]


#: what TPOT is for a one-token request (the learner may return None or NaN)
UNDEFINED = "undefined (one token)"


def _latency_reference(arrival, times):
    ttft, tpot = ttft_tpot(arrival, times)
    return (ttft, UNDEFINED if tpot is None else tpot)


def _latency_hint(args, kw, expected, got) -> str:
    arrival, times = args
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return "return a pair (ttft_s, tpot_s)"
    n = len(times)
    if n == 1 and got[1] != UNDEFINED:
        return "with one token there is no gap: return None (or NaN) for TPOT"
    if n >= 2 and math.isclose(got[1], (times[-1] - times[0]) / n, rel_tol=1e-9):
        return "n tokens have n - 1 gaps: divide by (n - 1)"
    if n >= 2 and math.isclose(got[1], (times[-1] - arrival) / n, rel_tol=1e-9):
        return "TPOT starts at the first token, not at the arrival (TTFT is separate)"
    if math.isclose(got[0], times[0], rel_tol=1e-9) and arrival:
        return "TTFT is measured from the arrival, not from time 0"
    return "TTFT = first token - arrival; TPOT = (last - first) / (n - 1)"


def check_ttft_tpot(fn) -> int:
    """``fn(arrival_s, token_times_s) -> (ttft_s, tpot_s)``; TPOT ``None`` (or NaN) for one
    token."""
    seed = fresh_rng().randrange(2**31)
    cases = _latency_cases(random.Random(seed))

    def learner(arrival, times):
        got = fn(arrival, list(times))
        if isinstance(got, (tuple, list)) and len(got) == 2:
            ttft, tpot = got
            undefined = tpot is None or (isinstance(tpot, numbers.Real) and math.isnan(tpot))
            try:
                return (float(ttft), UNDEFINED if undefined else float(tpot))
            except (TypeError, ValueError):
                return got
        return got

    return _with_seed(seed, run_checks, "ttft_tpot", learner, _latency_reference, cases,
                      hint=_safe(_latency_hint))


# ------------------------------------------------------- chunked-prefill plan
def _plan_cases(rng: random.Random) -> list:
    """A prompt that fits one step, one cut into several chunks, two prompts sharing a step,
    decodes that grow as prompts finish, then random."""
    cases = [([5], 16, 0), ([40], 16, 0), ([10, 3], 8, 2), ([7, 7, 7], 12, 1)]
    for _ in range(8):
        prompts = [rng.randint(1, 60) for _ in range(rng.randint(1, 5))]
        decodes = rng.randint(0, 4)
        budget = rng.randint(decodes + len(prompts) + 1, 48)
        cases.append((prompts, budget, decodes))
    return [((p, b, d), {}) for p, b, d in cases]


def _frozen_plan(prompts, budget, decodes):
    """The usual mistake: finished prompts never add a decode token."""
    left, plan = list(prompts), []
    while any(left) and len(plan) < 1000:
        b, row = budget - decodes, []
        for rem in left:
            row.append(min(rem, b))
            b -= row[-1]
        left = [r - t for r, t in zip(left, row)]
        plan.append(row)
    return plan


def _plan_hint(args, kw, expected, got) -> str:
    prompts, budget, decodes = args
    if not isinstance(got, (list, tuple)):
        return "return a list of steps, each a list with one token count per prompt"
    if any(not isinstance(r, (list, tuple)) or len(r) != len(prompts) for r in got):
        return "each step is a list with one token count per prompt (0 when it has none)"
    if [list(r) for r in got] == _frozen_plan(prompts, budget, decodes):
        return ("a prompt whose prefill finished decodes from the next step on: its one token "
                "a step comes off the budget")
    return "fill each step's budget: decodes first, then prompts in arrival order"


def check_chunked_prefill_plan(fn) -> int:
    """``fn(prompt_lens, max_num_batched_tokens, num_decodes) -> list of rows`` (row s, column
    i: prefill tokens of prompt i in step s) against :func:`chunked_prefill_plan`."""
    seed = fresh_rng().randrange(2**31)
    cases = _plan_cases(random.Random(seed))

    def learner(prompts, budget, decodes):
        got = fn(list(prompts), budget, decodes)
        try:
            return [[_as_int(x) for x in row] for row in got]
        except TypeError:
            return got

    return _with_seed(seed, run_checks, "chunked_prefill_plan", learner, chunked_prefill_plan,
                      cases, hint=_safe(_plan_hint))
