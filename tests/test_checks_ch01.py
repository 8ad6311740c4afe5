"""Each chapter-01 checker passes the package's own function and fails a wrong answer with a
message that names the mistake."""

import pytest

from llminfra.calc.memory import (activation_bytes_training, decode_arithmetic_intensity,
                                  decode_step_bytes, training_memory)
from llminfra.calc.params import param_count
from llminfra.course.checking import CheckFailed, fresh_rng
from llminfra.course.checks import ch01


def test_random_specs_are_valid_gqa_llamas():
    rng = fresh_rng()
    for _ in range(50):
        s = ch01.random_llama_spec(rng)
        assert s.num_heads % s.num_kv_heads == 0 and s.head_dim % 2 == 0
        assert s.family == "llama" and s.mlp == "gated"


def test_param_count_passes_the_package_and_a_hand_formula():
    assert ch01.check_param_count(param_count) == 8

    def by_hand(s):  # 2·V·h (or V·h tied) + L·(2h² + 2h·kv + 3hI + 2h) + h
        h, kv = s.hidden_size, s.num_kv_heads * s.head_dim
        emb = s.vocab_size * h * (1 if s.tied_embeddings else 2)
        return emb + s.num_layers * (2 * h * h + 2 * h * kv + 3 * h * s.intermediate_size + 2 * h) + h
    assert ch01.check_param_count(by_hand) == 8


@pytest.mark.parametrize("wrong, message", [
    (lambda s: param_count(s) + (s.vocab_size * s.hidden_size if s.tied_embeddings else 0),
     "tied"),
    (lambda s: param_count(s) - (0 if s.tied_embeddings else s.vocab_size * s.hidden_size),
     "does NOT tie"),
    (lambda s: param_count(s) - 2 * s.num_layers * s.hidden_size - s.hidden_size, "RMSNorm"),
    (lambda s: param_count(s) - s.num_layers * s.hidden_size * s.intermediate_size, "THREE"),
])
def test_param_count_names_the_mistake(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        # the two embedding cases need both tied and untied specs: drawn in every run
        ch01.check_param_count(wrong)


def test_param_count_gqa_mistake():
    def mha(s):  # K and V as h × h
        h, kv = s.hidden_size, s.num_kv_heads * s.head_dim
        return param_count(s) + 2 * s.num_layers * h * (h - kv)
    rng_has_gqa = any(ch01.random_llama_spec(fresh_rng()).attention != "MHA" for _ in range(20))
    assert rng_has_gqa
    for _ in range(5):  # a run where every spec drawn is MHA would pass; 8 draws make it rare
        try:
            ch01.check_param_count(mha)
        except CheckFailed as e:
            assert "grouped-query" in str(e)
            return
    pytest.fail("an MHA count passed a GQA checker five times")


def test_param_count_stub_and_garbage():
    def stub(s):
        raise NotImplementedError("your code here")
    with pytest.raises(CheckFailed, match="not implemented"):
        ch01.check_param_count(stub)
    with pytest.raises(CheckFailed, match="off by"):
        ch01.check_param_count(lambda s: param_count(s) + 7)


def test_training_memory_checker():
    assert ch01.check_training_memory(lambda s, b, t: training_memory(s, b, t)["total"]) == 8
    cases = [
        (lambda s, b, t: training_memory(s, b, t)["total"] / 1e9, "GB"),
        (lambda s, b, t: 16 * param_count(s), "activations"),
        (lambda s, b, t: training_memory(s, b, t)["total"] - 4 * param_count(s), "master"),
        (lambda s, b, t: training_memory(s, b, t)["total"] - 8 * param_count(s), "moments"),
        (lambda s, b, t: 4 * param_count(s) + activation_bytes_training(s, b, t), "optimizer"),
    ]
    for wrong, message in cases:
        with pytest.raises(CheckFailed, match=message):
            ch01.check_training_memory(wrong)


def test_activation_checker():
    def by_hand(s, b, h, a, flash):
        return s * b * h * 34 + (0 if flash else 5 * a * s * s * b)
    assert ch01.check_activation_bytes(by_hand) == 8
    with pytest.raises(CheckFailed, match="5·a·s²·b"):
        ch01.check_activation_bytes(lambda s, b, h, a, flash: s * b * h * 34 + 5 * a * s * s * b)
    with pytest.raises(CheckFailed, match="factor 2"):
        ch01.check_activation_bytes(lambda s, b, h, a, flash: by_hand(s, b, h, a, flash) / 2)


def test_decode_intensity_checker():
    assert ch01.check_decode_intensity(decode_arithmetic_intensity) == 8

    def weights_per_sequence(s, b, c, dtype):  # reads the weights once per sequence
        return decode_arithmetic_intensity(s, b, c, dtype) / b
    with pytest.raises(CheckFailed):
        ch01.check_decode_intensity(weights_per_sequence)

    def weights_only(s, b, c, dtype):  # forgets the KV cache
        return 1.0
    with pytest.raises(CheckFailed, match="FLOPs = B"):
        ch01.check_decode_intensity(weights_only)
    assert decode_step_bytes("gpt2", 2, 3) > 0


@pytest.mark.parametrize("check", [ch01.check_param_count, ch01.check_training_memory,
                                   ch01.check_activation_bytes, ch01.check_decode_intensity])
def test_forgotten_return_is_a_check_failure(check):
    """A body without ``return`` gives None: the checker must say so, not crash in a hint."""
    with pytest.raises(CheckFailed, match="returned None"):
        check(lambda *args: None)
