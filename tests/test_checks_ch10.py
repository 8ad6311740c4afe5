"""Chapter 10's checkers: right answers in other types pass, each wrong answer is rejected with
its hint, the stub reads as not attempted."""

import math

import numpy as np
import pytest

from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch10
from llminfra.planning import find_mistakes, gpus_for_memory


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
