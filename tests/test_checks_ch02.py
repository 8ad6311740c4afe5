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


def test_largest_batch_diagnoses():
    def no_reserve(model, gpu, context, dtype, kv_dtype, reserve_fraction):
        return _largest_batch_right(model, gpu, context, dtype, kv_dtype, 0.0)

    def plus_one(*args):
        return _largest_batch_right(*args) + 1

    def gb_card(model, gpu, context, dtype, kv_dtype, reserve_fraction):
        est = inference_memory(model, dtype, kv_dtype, context, batch=1)
        usable = get_gpu(gpu).memory_gb * 1e9 * (1 - reserve_fraction)
        return max(0, math.floor((usable - est.weight_bytes - est.activation_bytes) / est.kv_bytes))

    def no_activations(model, gpu, context, dtype, kv_dtype, reserve_fraction):
        est = inference_memory(model, dtype, kv_dtype, context, batch=1)
        usable = get_gpu(gpu).memory_bytes * (1 - reserve_fraction)
        return max(0, math.floor((usable - est.weight_bytes) / est.kv_bytes))

    def per_sequence_activations(model, gpu, context, dtype, kv_dtype, reserve_fraction):
        est = inference_memory(model, dtype, kv_dtype, context, batch=1)
        usable = get_gpu(gpu).memory_bytes * (1 - reserve_fraction)
        return max(0, math.floor((usable - est.weight_bytes) / (est.kv_bytes + est.activation_bytes)))

    for wrong, message in [(no_reserve, "runtime reserve"), (gb_card, "GB vs GiB"),
                           (no_activations, "left out the activations"),
                           (per_sequence_activations, "once per sequence")]:
        with pytest.raises(CheckFailed, match=message):
            for _ in range(20):  # a case where the mistake shows is drawn almost always
                wrong_passes = ch02.check_largest_batch(wrong)
            pytest.fail(f"{wrong.__name__} passed 20 times ({wrong_passes} cases each)")
    with pytest.raises(CheckFailed, match="one too many"):
        ch02.check_largest_batch(plus_one)


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
