"""Checkers for chapter 10's exercises: a GPU count from requirements, and the mistakes of a plan.

* :func:`check_gpus_for_memory` — ``fn(weight_bytes, kv_bytes_per_token, context_tokens,
  concurrency, gpu_memory_bytes, reserve_fraction) -> int`` against
  :func:`llminfra.planning.gpus_for_memory` (no activations);
* :func:`check_find_mistakes` — ``fn(draft) -> set of codes`` against
  :func:`llminfra.planning.find_mistakes`.
"""

from __future__ import annotations

import math
import random

from llminfra.calc.memory import kv_bytes_per_token, weight_bytes
from llminfra.course.checking import (Case, CheckFailed, as_like, checker, describe,
                                      first_matching, run_checks, seeded)
from llminfra.planning import MISTAKES, DraftPlan, find_mistakes, gpus_for_memory
from llminfra.specs import get_gpu


def _gpus(w, k, s, c, m, r) -> int:
    return gpus_for_memory(w, k, s, c, m, r)


def _usable(m, r):
    return m * (1 - r)


#: the usual wrong GPU counts, each called like the reference: the checker names the one an
#: answer matches on every case (a rounding slip and a forgotten reserve can agree on one case)
GPU_MISTAKES = {
    "round up (math.ceil): 1.2 GPUs' worth of memory needs 2 GPUs, not 1 (you rounded down)":
        lambda w, k, s, c, m, r: max(1, math.floor((w + c * s * k) / _usable(m, r))),
    "round() can round down: a fraction of a GPU still needs a whole one (math.ceil)":
        lambda w, k, s, c, m, r: max(1, round((w + c * s * k) / _usable(m, r))),
    "you left out the runtime reserve: only (1 - reserve_fraction) of each GPU is usable":
        lambda w, k, s, c, m, r: max(1, math.ceil((w + c * s * k) / m)),
    "you multiplied by the reserve: usable = memory · (1 - reserve_fraction), not · reserve":
        lambda w, k, s, c, m, r: max(1, math.ceil((w + c * s * k) / (m * r))) if r else 0,
    "you counted only the weights: the KV cache of every sequence in flight needs room too":
        lambda w, k, s, c, m, r: max(1, math.ceil(w / _usable(m, r))),
    "you counted one sequence's KV cache: every one of the concurrency sequences has its own":
        lambda w, k, s, c, m, r: max(1, math.ceil((w + s * k) / _usable(m, r))),
    "one too many: ceil already rounds up (ceil(x) + 1, or floor(x) + 1 on a whole x)":
        lambda w, k, s, c, m, r: max(1, math.floor((w + c * s * k) / _usable(m, r)) + 1),
    "the answer is at least 1: even an empty load needs a GPU to hold the weights":
        lambda w, k, s, c, m, r: math.ceil((w + c * s * k) / _usable(m, r)),
}


def _gpus_hint(args, kwargs, expected, got) -> str:
    wrong = {why: f(*args) for why, f in GPU_MISTAKES.items()}
    return first_matching(got, wrong, expected) or (
        "expected ceil((weights + concurrency · context · KV bytes per token) / "
        "(GPU memory · (1 - reserve_fraction))), at least 1")


def _gpus_case(rng: random.Random) -> tuple:
    model = rng.choice(["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
                        "mistral-7b", "falcon-40b", "opt-13b"])
    gpu = rng.choice(["a100-40gb", "a100-80gb", "h100", "h200", "l40s", "mi300x", "rtx-4090"])
    ctx = rng.choice([512, 2048, 4096, 8192])
    return (weight_bytes(model, "bf16"), kv_bytes_per_token(model, "bf16"), ctx,
            rng.randint(0, 256), get_gpu(gpu).memory_bytes, rng.choice([0.0, 0.05, 0.1, 0.2]))


def _int_answer(expected, got):
    """The answer as an int when it holds a whole number, of any type (``2``, ``2.0``,
    ``np.int64(2)``, a 0-d tensor, ``Fraction(4, 2)``, ``Decimal("2")``); else a message."""
    value = as_like(expected, got)  # a Python number for anything that holds one
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckFailed(f"return a whole number of GPUs (an int), got {describe(got)}")
    if isinstance(value, float) and not value.is_integer():
        raise CheckFailed(f"return a whole number of GPUs, got {value!r}")
    return int(value)


@checker
def check_gpus_for_memory(fn, seed: int | None = None) -> int:
    """Check ``fn(weight_bytes, kv_bytes_per_token, context_tokens, concurrency,
    gpu_memory_bytes, reserve_fraction) -> int``. Fixed cases first: weights alone on one GPU
    (concurrency 0), need exactly two GPUs' usable memory (no third), one byte over, exactly
    five at a reserve of 0.2 (a forgotten reserve and a rounding slip part there), no reserve,
    a 70B model across GPUs; then random presets. The hint is the usual mistake the answer
    matches on every case (:data:`GPU_MISTAKES`)."""
    seed, rng = seeded(seed)
    m = 100 * 2**30
    cases = [
        Case("no requests in flight: the weights alone, on one GPU", (10e9, 2**17, 4096, 0, m, 0.1)),
        Case("exactly two GPUs' usable memory (not three)", (2 * 0.9 * m - 10 * 4096 * 2**10,
                                                            2**10, 4096, 10, m, 0.1)),
        Case("one byte more than two GPUs' usable memory", (2 * 0.9 * m + 1, 2**10, 1, 0, m, 0.1)),
        Case("exactly five GPUs' usable memory at a reserve of 0.2 (four without the reserve)",
             (5 * (m * (1 - 0.2)), 2**10, 4096, 0, m, 0.2)),
        Case("no runtime reserve", (50e9, 2**19, 2048, 40, m, 0.0)),
        Case("llama-2-70b, 32 sequences of 4096 tokens, h100",
             (weight_bytes("llama-2-70b", "bf16"), kv_bytes_per_token("llama-2-70b", "bf16"),
              4096, 32, get_gpu("h100").memory_bytes, 0.1)),
    ]
    cases += [Case("random preset, GPU, context and load", _gpus_case(rng)) for _ in range(6)]
    return run_checks("gpus_for_memory", fn, _gpus, cases, rel=0, hint=_gpus_hint, seed=seed,
                      replay="ch10.check_gpus_for_memory", normalize=_int_answer,
                      mistakes=GPU_MISTAKES)


def _codes(expected, got):
    if isinstance(got, str):
        raise CheckFailed(f"return a set of codes such as {{'weights_only'}}, not the string {got!r}")
    try:
        codes = set(got)
    except TypeError:
        raise CheckFailed(f"return a set of mistake codes, got {type(got).__name__}") from None
    unknown = sorted(str(c) for c in codes if c not in MISTAKES)
    if unknown:
        raise CheckFailed(f"unknown codes {unknown}; the codes are {sorted(MISTAKES)}")
    return codes


BASE = dict(model="llama-2-13b", gpu="a100-80gb", context_tokens=2048, concurrency=4,
            expected_speedup=1.0, batch=8, utilization=0.6)

#: name -> changes to BASE; every rule alone, each branch and edge of it, none and all. The
#: memory rule also in GiB that 1e9-byte GB would misjudge, on two GPUs and with int4 weights;
#: the latency rule through its TPOT target alone, and on two GPUs (tensor parallel).
_FIXED = {
    "a sound plan (no mistake)": {},
    "weights fit, the KV cache of 64 × 4096 tokens does not":
        dict(concurrency=64, context_tokens=4096),
    "the weights alone do not fit (not a weights-only mistake)":
        dict(model="llama-2-70b", n_gpus=1, concurrency=1),
    "weights + KV cache (74.7e9 bytes) fit 90 % of 80 GiB, not 90 % of 80 GB (80e9 bytes)":
        dict(concurrency=29),
    "two GPUs hold weights + KV cache that one GPU cannot, and meet a 15 ms TPOT target that "
    "one GPU misses": dict(n_gpus=2, concurrency=64, tpot_target_s=0.015),
    "int4 weights fit where bf16 ones would not; with the KV cache (bf16) they do not":
        dict(model="llama-2-70b", dtype="int4", concurrency=32, context_tokens=4096, batch=1),
    "expects 24× where 2.5× was measured": dict(expected_speedup=24.0, measured_speedup=2.5),
    "expects 2× with nothing measured": dict(expected_speedup=2.0),
    "expects what was measured (not a mistake)": dict(expected_speedup=2.5, measured_speedup=2.5),
    "a batch of 256 prompts of 4096 tokens against a 0.2 s TTFT target":
        dict(batch=256, prompt_tokens=4096, ttft_target_s=0.2),
    "TTFT meets its target, the time per output token misses a 15 ms TPOT target":
        dict(tpot_target_s=0.015),
    "4 stages, 1 micro-batch (bubble 75 %)": dict(pipeline_stages=4, micro_batches=1),
    "2 stages, 1 micro-batch (bubble exactly 50 %)": dict(pipeline_stages=2, micro_batches=1),
    "4 stages, 4 micro-batches (bubble 43 %, fine)": dict(pipeline_stages=4, micro_batches=4),
    "utilisation 5 %": dict(utilization=0.05),
    "utilisation exactly 30 % (fine)": dict(utilization=0.3),
    "every mistake at once": dict(concurrency=64, context_tokens=4096, expected_speedup=24.0,
                                  batch=256, prompt_tokens=4096, ttft_target_s=0.2,
                                  pipeline_stages=4, micro_batches=1, utilization=0.05),
}


def _mistakes_hint(args, kwargs, expected, got) -> str:
    missing, extra = sorted(expected - got), sorted(got - expected)
    parts = []
    if missing:
        parts.append(f"missed {missing}")
    if extra:
        parts.append(f"flagged {extra} although the plan does not make it")
    rules = {"weights_only": "weights <= usable < weights + concurrency · context · KV "
                             "bytes/token, usable = n_gpus · memory_bytes · (1 - reserve) in "
                             "bytes (GiB, not 1e9-byte GB); weights in d.dtype, KV cache in bf16",
             "headline_factor": "expected_speedup > measured_speedup (or > 1 when not measured)",
             "throughput_over_ttft": "ttft_s(model, gpu, prompt_tokens, batch) > ttft_target_s, "
                                     "or decode_time_per_token_s(model, gpu, batch, context) > "
                                     "tpot_target_s, both with dtype=d.dtype and "
                                     "tensor_parallel=d.n_gpus",
             "naive_pipeline": "stages > 1 and (p - 1) / (m + p - 1) >= 0.5",
             "low_utilization": "utilization < 0.3 (0.3 itself is fine)"}
    return "; ".join(parts) + " — the rule" + ("s: " if len(missing + extra) > 1 else ": ") + \
        "; ".join(f"{c}: {rules[c]}" for c in missing + extra)


@checker
def check_find_mistakes(fn, seed: int | None = None) -> int:
    """Check ``fn(draft: DraftPlan) -> set[str]``: every rule alone, its edges (measured =
    expected, a bubble of exactly 50 %, utilisation exactly 0.3, weights that do not fit at
    all), each branch of a rule (the TTFT and the TPOT target, one and two GPUs, int4 weights,
    memory in GiB that GB would misjudge), a sound plan and all mistakes at once; then a
    random draft."""
    seed, rng = seeded(seed)
    cases = [Case(name, (DraftPlan(**{**BASE, **change}),)) for name, change in _FIXED.items()]
    change = {"concurrency": rng.choice([1, 8, 32, 96]), "expected_speedup": rng.choice([1.0, 3.0]),
              "measured_speedup": rng.choice([None, 2.0]), "n_gpus": rng.choice([1, 2]),
              "dtype": rng.choice(["bf16", "int8"]), "batch": rng.choice([1, 16, 128]),
              "tpot_target_s": rng.choice([0.015, 0.05, 0.1]),
              "pipeline_stages": rng.choice([1, 2, 4]), "micro_batches": rng.choice([1, 2, 8]),
              "utilization": rng.choice([0.1, 0.5, 0.9])}
    cases.append(Case("random draft", (DraftPlan(**{**BASE, **change}),)))
    return run_checks("find_mistakes", fn, find_mistakes, cases, hint=_mistakes_hint, seed=seed,
                      replay="ch10.check_find_mistakes", normalize=_codes)


__all__ = ["check_find_mistakes", "check_gpus_for_memory"]
