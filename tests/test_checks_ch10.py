"""Chapter 10's checkers: right answers in other types pass, each wrong answer is rejected with
its hint, the stub reads as not attempted."""

import math

import numpy as np
import pytest

from llminfra.calc.memory import DEFAULT_RESERVE_FRACTION, kv_bytes_per_token, weight_bytes
from llminfra.calc.roofline import decode_time_per_token_s, ttft_s
from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch10
from llminfra.parallel.pipeline import bubble_fraction
from llminfra.planning import find_mistakes, gpus_for_memory
from llminfra.specs import get_gpu


def right(w, k, s, c, m, r):
    return gpus_for_memory(w, k, s, c, m, r)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gpu_count_accepts_right_answers_in_other_types(seed):
    assert ch10.check_gpus_for_memory(right, seed=seed) > 5
    ch10.check_gpus_for_memory(lambda *a: float(right(*a)), seed=seed)
    ch10.check_gpus_for_memory(lambda *a: np.int64(right(*a)), seed=seed)


@pytest.mark.parametrize("wrong,hint", [
    (lambda w, k, s, c, m, r: max(1, math.ceil((w + c * s * k) / m)), "reserve"),
    (lambda w, k, s, c, m, r: max(1, math.ceil(w / (m * (1 - r)))), "only the weights"),
    (lambda w, k, s, c, m, r: max(1, math.floor((w + c * s * k) / (m * (1 - r)))), "round up"),
    (lambda w, k, s, c, m, r: math.ceil((w + c * s * k) / (m * (1 - r))) + 1, "expected ceil"),
])
@pytest.mark.parametrize("seed", [4, 5])
def test_gpu_count_rejects_wrong_answers_with_a_hint(wrong, hint, seed):
    with pytest.raises(CheckFailed, match=hint):
        ch10.check_gpus_for_memory(wrong, seed=seed)


def test_gpu_count_rejects_non_integers_and_names_the_seed():
    with pytest.raises(CheckFailed, match="whole number"):
        ch10.check_gpus_for_memory(lambda *a: right(*a) + 0.5, seed=7)
    with pytest.raises(CheckFailed, match=r"seed 7; replay: ch10.check_gpus_for_memory"):
        ch10.check_gpus_for_memory(lambda *a: 0, seed=7)


def test_stubs_read_as_not_attempted():
    def stub(*args):
        raise NotImplementedError("write gpus_for_memory")
    with pytest.raises(NotAttempted):
        ch10.check_gpus_for_memory(stub)
    with pytest.raises(NotAttempted):
        ch10.check_find_mistakes(stub)


@pytest.mark.parametrize("seed", [1, 2])
def test_mistakes_accept_any_collection(seed):
    ch10.check_find_mistakes(find_mistakes, seed=seed)
    ch10.check_find_mistakes(lambda d: sorted(find_mistakes(d)), seed=seed)
    ch10.check_find_mistakes(lambda d: tuple(find_mistakes(d)), seed=seed)


@pytest.mark.parametrize("wrong,hint", [
    (lambda d: find_mistakes(d) - {"headline_factor"}, "missed \\['headline_factor'\\]"),
    (lambda d: find_mistakes(d) | ({"low_utilization"} if d.utilization <= 0.3 else set()),
     "0.3 itself is fine"),
    (lambda d: find_mistakes(d) - ({"naive_pipeline"} if d.pipeline_stages == 2 else set()),
     "naive_pipeline"),
    (lambda d: find_mistakes(d) | ({"weights_only"} if d.model == "llama-2-70b" else set()),
     "flagged \\['weights_only'\\]"),
    (lambda d: "weights_only", "not the string"),
    (lambda d: {"bogus"}, "unknown codes"),
])
def test_mistakes_reject_wrong_answers_with_a_hint(wrong, hint):
    with pytest.raises(CheckFailed, match=hint):
        ch10.check_find_mistakes(wrong, seed=3)


def plan_mistakes(d, *, decimal_gb=False, one_gpu=False, weights_in_bf16=False,
                  kv_in_dtype=False, tensor_parallel_1=False, tpot=True):
    """The five rules written by hand, with one of the usual slips switched on: memory read as
    ``memory_gb · 1e9``, the GPU count left out of the memory or of the latency rule, the
    weights always in bf16, the KV cache in the weights' dtype, the TPOT target never tested."""
    g = get_gpu(d.gpu)
    memory = g.memory_gb * 1e9 if decimal_gb else g.memory_bytes
    usable = memory * (1 if one_gpu else d.n_gpus) * (1 - DEFAULT_RESERVE_FRACTION)
    w = weight_bytes(d.model, "bf16" if weights_in_bf16 else d.dtype)
    kv = d.concurrency * d.context_tokens * kv_bytes_per_token(
        d.model, d.dtype if kv_in_dtype else "bf16")
    found = {"weights_only"} if w <= usable < w + kv else set()
    if d.expected_speedup > (1.0 if d.measured_speedup is None else d.measured_speedup):
        found.add("headline_factor")
    kw = {"dtype": d.dtype, "tensor_parallel": 1 if tensor_parallel_1 else d.n_gpus}
    if (ttft_s(d.model, d.gpu, d.prompt_tokens, d.batch, **kw) > d.ttft_target_s
            or tpot and decode_time_per_token_s(d.model, d.gpu, d.batch, d.context_tokens,
                                                **kw) > d.tpot_target_s):
        found.add("throughput_over_ttft")
    if d.pipeline_stages > 1 and bubble_fraction(d.pipeline_stages, d.micro_batches) >= 0.5:
        found.add("naive_pipeline")
    if d.utilization < 0.3:
        found.add("low_utilization")
    return found


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("slip,case,hint", [
    (dict(tpot=False), "the time per output token misses a 15 ms TPOT target",
     r"missed \['throughput_over_ttft'\]"),
    (dict(decimal_gb=True), "fit 90 % of 80 GiB, not 90 % of 80 GB",
     r"flagged \['weights_only'\].*GiB, not 1e9-byte GB"),
    (dict(one_gpu=True), "two GPUs hold weights + KV cache that one GPU cannot",
     r"flagged \['weights_only'\].*n_gpus"),
    (dict(tensor_parallel_1=True), "meet a 15 ms TPOT target that one GPU misses",
     r"flagged \['throughput_over_ttft'\].*tensor_parallel=d.n_gpus"),
    (dict(weights_in_bf16=True), "int4 weights fit where bf16 ones would not",
     r"missed \['weights_only'\].*weights in d.dtype"),
    (dict(kv_in_dtype=True), "int4 weights fit where bf16 ones would not",
     r"missed \['weights_only'\].*KV cache in bf16"),
])
def test_mistakes_reject_each_slip_at_its_fixed_case(slip, case, hint, seed):
    """Every branch of the rules has a fixed case: a slip that only random drafts could reach
    (none of them did: the TPOT target, the GPU count and the dtype were never varied) fails
    on every run, at the case that names it."""
    assert ch10.check_find_mistakes(plan_mistakes, seed=seed) == 18
    with pytest.raises(CheckFailed, match=hint) as e:
        ch10.check_find_mistakes(lambda d: plan_mistakes(d, **slip), seed=seed)
    assert case in str(e.value)
