"""Chapter 02 checkers: each passes on the package's own function and fails, with the right
diagnosis, on the usual wrong answers."""

import math

import pytest

from llminfra.calc.memory import inference_memory, kv_bytes, kv_bytes_per_token
from llminfra.course.checking import CheckFailed
from llminfra.course.checks import ch02
from llminfra.specs.formats import dtype_bytes
from llminfra.specs.gpus import get_gpu


def _kv_right(spec, kv_dtype):
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * dtype_bytes(kv_dtype)


def _largest_batch_right(model, gpu, context, dtype, kv_dtype, reserve_fraction):
    """Closed form: weights and one prefill's activations are paid once, the KV cache per
    sequence."""
    est = inference_memory(model, dtype, kv_dtype, context, batch=1)
    usable = get_gpu(gpu).memory_bytes * (1 - reserve_fraction)
    return max(0, math.floor((usable - est.weight_bytes - est.activation_bytes) / est.kv_bytes))


def test_checkers_pass_on_the_package():
    assert ch02.check_kv_bytes_per_token(kv_bytes_per_token) == 9
    assert ch02.check_kv_bytes_per_token(_kv_right) == 9
    assert ch02.check_kv_sequence_gib(lambda s, c, k: kv_bytes(s, c, 1, k) / 2**30) == 9


@pytest.mark.parametrize("attempt", range(5))
def test_largest_batch_closed_form_passes(attempt):
    """Fresh cases each time: the closed form equals the package's bisection."""
    assert ch02.check_largest_batch(_largest_batch_right) == 7


@pytest.mark.parametrize("wrong, message", [
    (lambda s, k: s.num_layers * s.num_kv_heads * s.head_dim * dtype_bytes(k), "factor 2"),
    (lambda s, k: 2 * s.num_layers * s.num_heads * s.head_dim * dtype_bytes(k),
     r"num_heads \(query heads\) instead of num_kv_heads"),
    (lambda s, k: 2 * s.num_layers * s.num_kv_heads * s.head_dim, "not bytes"),
    (lambda s, k: 16 * s.num_layers * s.num_kv_heads * s.head_dim * dtype_bytes(k), "bits"),
])
def test_kv_bytes_per_token_diagnoses(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ch02.check_kv_bytes_per_token(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda s, c, k: kv_bytes(s, c, 1, k) / 1e9, "GiB vs GB"),
    (lambda s, c, k: kv_bytes(s, c, 1, k), "returned bytes"),
    (lambda s, c, k: kv_bytes_per_token(s, k) / 2**30, "context length"),
    (lambda s, c, k: kv_bytes(s, c, 1, k) / 2 / 2**30, "factor 2"),
])
def test_kv_sequence_gib_diagnoses(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ch02.check_kv_sequence_gib(wrong)


def _no_reserve(model, gpu, context, dtype, kv_dtype, reserve_fraction):
    return _largest_batch_right(model, gpu, context, dtype, kv_dtype, 0.0)


def _gb_card(model, gpu, context, dtype, kv_dtype, reserve_fraction):
    est = inference_memory(model, dtype, kv_dtype, context, batch=1)
    usable = get_gpu(gpu).memory_gb * 1e9 * (1 - reserve_fraction)
    return max(0, math.floor((usable - est.weight_bytes - est.activation_bytes) / est.kv_bytes))


def _no_activations(model, gpu, context, dtype, kv_dtype, reserve_fraction):
    est = inference_memory(model, dtype, kv_dtype, context, batch=1)
    usable = get_gpu(gpu).memory_bytes * (1 - reserve_fraction)
    return max(0, math.floor((usable - est.weight_bytes) / est.kv_bytes))


def _per_sequence_activations(model, gpu, context, dtype, kv_dtype, reserve_fraction):
    est = inference_memory(model, dtype, kv_dtype, context, batch=1)
    usable = get_gpu(gpu).memory_bytes * (1 - reserve_fraction)
    return max(0, math.floor((usable - est.weight_bytes) / (est.kv_bytes + est.activation_bytes)))


_BATCH_MISTAKES = [(_no_reserve, "runtime reserve"), (_gb_card, "GB vs GiB"),
                   (_no_activations, "left out the activations"),
                   (_per_sequence_activations, "once per sequence")]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("wrong, message", _BATCH_MISTAKES)
def test_largest_batch_diagnoses(wrong, message, seed):
    """One run each: the fourth fixed case is drawn where every usual mistake changes the count
    (leaving out the activations passed about 1 run in 100 when only draws could catch it)."""
    with pytest.raises(CheckFailed, match=message):
        ch02.check_largest_batch(wrong, seed=seed)


@pytest.mark.parametrize("seed", range(10))
def test_largest_batch_fourth_case_tells_every_mistake_apart(seed):
    seen = []

    def spy(*args):
        seen.append(args)
        return _largest_batch_right(*args)

    ch02.check_largest_batch(spy, seed=seed)
    fourth = seen[3]
    counts = [f(*fourth) for f in [_largest_batch_right] + [w for w, _ in _BATCH_MISTAKES]]
    assert len(set(counts)) == len(counts), (fourth, counts)


def test_largest_batch_one_too_many():
    with pytest.raises(CheckFailed, match="one too many"):
        ch02.check_largest_batch(lambda *args: _largest_batch_right(*args) + 1)


def test_stub_fails_with_not_implemented():
    def stub(*args):
        raise NotImplementedError("your code here")

    for check in (ch02.check_kv_bytes_per_token, ch02.check_kv_sequence_gib,
                  ch02.check_largest_batch):
        with pytest.raises(CheckFailed, match="not implemented yet"):
            check(stub)


def test_case_spec_is_a_model_spec_with_a_short_repr():
    """The package functions accept the checker's cases; Llama-2-7B: 2·32·32·128·2 = 524,288."""
    spec = ch02._case(ch02.get_model("llama-2-7b"))
    assert kv_bytes_per_token(spec, "bf16") == 524_288
    assert repr(spec) == "<llama-2-7b: num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128>"


@pytest.mark.parametrize("check", [ch02.check_kv_bytes_per_token, ch02.check_kv_sequence_gib,
                                   ch02.check_largest_batch])
def test_forgotten_return_is_a_check_failure(check):
    """A body without ``return`` gives None: the checker must say so, not crash in a hint."""
    with pytest.raises(CheckFailed, match="returned None"):
        check(lambda *args: None)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rounding, message", [
    (math.floor, "cannot be negative"),   # no clip at 0
    (int, "cannot be negative"),          # int() truncates toward 0, no clip
    (round, "cannot be negative"),        # round(), no clip
    (lambda x: max(0, round(x)), "round\\(\\) rounds up"),
])
def test_largest_batch_clip_and_floor_in_every_run(seed, rounding, message):
    """Passed about 1 run in 5 before: a model that does not fit and a quotient with a
    fraction above .5 are now cases 1 and 2 of every run."""
    def wrong(model, gpu, context, dtype, kv_dtype, reserve_fraction):
        x = ch02._per_sequence_quotient(model, gpu, context, dtype, kv_dtype, reserve_fraction)
        return rounding(x)
    with pytest.raises(CheckFailed, match=message):
        ch02.check_largest_batch(wrong, seed=seed)


def test_largest_batch_accepts_numpy_and_float():
    import numpy as np
    assert ch02.check_largest_batch(lambda *a: np.int64(_largest_batch_right(*a))) == 7
    assert ch02.check_largest_batch(lambda *a: float(_largest_batch_right(*a))) == 7


@pytest.mark.parametrize("seed", range(4))
def test_ignored_kv_dtype_is_named_not_factor_2(seed):
    """A 1-byte, a 4-byte and a 2-byte dtype come in that order, so ignoring kv_dtype fails on
    the 1-byte case (×2) before a 4-byte one could be mistaken for a missing factor 2."""
    def ignores_dtype(s, k):
        return 2 * s.num_layers * s.num_kv_heads * s.head_dim * 2
    with pytest.raises(CheckFailed, match="you ignored kv_dtype") as e:
        ch02.check_kv_bytes_per_token(ignores_dtype, seed=seed)
    assert "factor 2" not in str(e.value)


def test_numpy_int32_kv_bytes_do_not_crash_a_hint():
    """np.int32 arithmetic inside a hint overflowed; answers are converted to Python ints."""
    import numpy as np
    with pytest.raises(CheckFailed, match="num_heads"):
        ch02.check_kv_bytes_per_token(
            lambda s, k: np.int32(2 * s.num_layers * s.num_heads * s.head_dim * dtype_bytes(k)))
    assert ch02.check_kv_bytes_per_token(lambda s, k: np.int64(_kv_right(s, k))) == 9


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("wrong, message, not_message", [
    (lambda s, k: s.num_layers * s.num_kv_heads * s.head_dim * dtype_bytes(k), "factor 2", "elements"),
    (lambda s, k: 2 * s.num_layers * s.num_kv_heads * s.head_dim, "counted elements", "factor 2"),
])
def test_factor_2_and_elements_are_told_apart(seed, wrong, message, not_message):
    with pytest.raises(CheckFailed, match=message) as e:
        ch02.check_kv_bytes_per_token(wrong, seed=seed)
    assert not_message not in str(e.value).split("hint:")[1]


def _kv_in(kv_of):
    """The closed form with the KV cache counted in ``kv_of(dtype, kv_dtype)``."""
    def largest_batch(model, gpu, context, dtype, kv_dtype, reserve_fraction):
        return _largest_batch_right(model, gpu, context, dtype, kv_of(dtype, kv_dtype),
                                    reserve_fraction)
    return largest_batch


def _kv_by_hand_in_weight_bytes(model, gpu, context, dtype, kv_dtype, reserve_fraction):
    """KV bytes per token in the weights' dtype, times the context."""
    est = inference_memory(model, dtype, kv_dtype, context, batch=1)
    kv = kv_bytes_per_token(model, dtype) * context      # MLA's latent cache too
    usable = get_gpu(gpu).memory_bytes * (1 - reserve_fraction)
    return max(0, math.floor((usable - est.weight_bytes - est.activation_bytes) / kv))


@pytest.mark.parametrize("wrong, message", [
    (_kv_in(lambda dtype, kv: dtype), "not the weights' dtype"),
    (_kv_in(lambda dtype, kv: None), "not 16 bits"),
    (_kv_in(lambda dtype, kv: "bf16"), "not 16 bits"),
])
@pytest.mark.parametrize("seed", range(12))
def test_largest_batch_ignoring_the_kv_dtype_fails_every_run_at_case_1(wrong, message, seed):
    """A capacity with the KV cache in the weights' dtype (or in inference_memory's default
    16 bits) passed every seed whose fixed cases had a bf16 cache beside bf16 weights; case 1
    is now an fp8 cache beside 16-bit or int4 weights where the count changes."""
    assert ch02.check_largest_batch(_largest_batch_right, seed=seed) == 7
    with pytest.raises(CheckFailed, match="the KV cache has its own dtype") as e:
        ch02.check_largest_batch(wrong, seed=seed)
    text = str(e.value)
    assert message in text and "case 1 of 7: " in text and "fp8 KV cache beside" in text
    assert " / fp8 KV" in text


@pytest.mark.parametrize("seed", range(4))
def test_largest_batch_kv_in_weight_bytes_by_hand_fails_at_case_1(seed):
    """kv_bytes_per_token(model, dtype) for the cache (with the weights in int4 it would be
    half a byte per element): case 1 names the KV dtype."""
    with pytest.raises(CheckFailed, match=r"case 1 of 7: .*fp8 KV cache beside") as e:
        ch02.check_largest_batch(_kv_by_hand_in_weight_bytes, seed=seed)
    assert "own dtype" in str(e.value)
