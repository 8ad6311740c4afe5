"""Each chapter-01 checker passes the package's own function and fails a wrong answer with a
message that names the mistake."""

import re

import pytest

from llminfra.calc.memory import activation_bytes_training, training_memory
from llminfra.calc.step import decode_arithmetic_intensity, decode_step_bytes
from llminfra.calc.params import param_count
from llminfra.specs.formats import dtype_bytes
from llminfra.course.checking import CheckFailed, NotAttempted, fresh_rng
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
    for seed in range(5):  # a GQA spec is case 1 of every run
        with pytest.raises(CheckFailed, match=r"case 1 of 8: .*\(GQA\)[\s\S]*grouped-query"):
            ch01.check_param_count(mha, seed=seed)


def test_param_count_stub_and_garbage():
    def stub(s):
        raise NotImplementedError("your code here")
    with pytest.raises(NotAttempted, match="not implemented"):
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
    """Fresh seeds: an answer off by a factor 2 or 4 is told so on every seed (it was told
    "grow with the batch" when case 1 drew batch 2, where 34·s·b·h / 2 = 34·s·h)."""
    def by_hand(s, b, h, a, flash):
        return s * b * h * 34 + (0 if flash else 5 * a * s * s * b)
    assert ch01.check_activation_bytes(by_hand) == 8
    with pytest.raises(CheckFailed, match="5·a·s²·b"):
        ch01.check_activation_bytes(lambda s, b, h, a, flash: s * b * h * 34 + 5 * a * s * s * b)
    for factor in (2, 4):
        with pytest.raises(CheckFailed, match=f"off by a factor {factor}:") as e:
            ch01.check_activation_bytes(
                lambda s, b, h, a, flash: by_hand(s, b, h, a, flash) / factor)
        assert "case 1 of 8" in str(e.value) and "grow with the batch" not in str(e.value)


def paper_form(s, b, h, a, flash):
    """Korthikanti et al. eq. 1 as printed: s·b·h·(34 + 5·a·s/h), a float (the division)."""
    return s * b * h * (34 + (0 if flash else 5 * a * s / h))


@pytest.mark.parametrize("seed", range(40))
def test_activation_right_answer_in_the_papers_float_form_passes(seed):
    """Rejected as "a count has no fraction" in about half the seeds: the float lands a unit
    in the last place off the whole count. Counts computed through floats are judged within
    float64 rounding; a real fraction still fails."""
    assert ch01.check_activation_bytes(paper_form, seed=seed) == 8
    with pytest.raises(CheckFailed, match="a count has no fraction"):
        ch01.check_activation_bytes(lambda *args: paper_form(*args) + 0.5, seed=seed)


def test_a_fresh_seed_is_logged_and_replays(caplog):
    """A test that fails on a fresh seed shows it (conftest.py shows the log beside failures)."""
    import logging
    caplog.set_level(logging.INFO, logger="llminfra.course.checking")
    seen = []
    with pytest.raises(CheckFailed) as e:
        ch01.check_param_count(lambda s: seen.append(s) or 3)
    logged = re.findall(r"fresh checker seed (\d+)", caplog.text)
    assert len(logged) == 1 and f"seed {logged[0]};" in str(e.value)
    replayed = []
    with pytest.raises(CheckFailed):
        ch01.check_param_count(lambda s: replayed.append(s) or 3, seed=int(logged[0]))
    assert replayed == seen


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


def _intensity_by_hand(spec, batch, context, dtype, weight_bytes=None, kv_bytes=None):
    """FLOPs = B·(2P + 4·L·H·d·c); bytes = P·b_w + B·c·2·L·H_kv·d·b_kv."""
    P = param_count(spec)
    L, H, Hkv, d = spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim
    bw = dtype_bytes(dtype) if weight_bytes is None else weight_bytes
    bkv = dtype_bytes(dtype) if kv_bytes is None else kv_bytes
    flops = batch * (2 * P + 4 * L * H * d * context)
    return flops / (P * bw + batch * context * 2 * L * Hkv * d * bkv)


@pytest.mark.parametrize("seed", range(5))
def test_decode_intensity_ignoring_dtype_fails_every_run_with_the_right_hint(seed):
    """Ignoring dtype passed 3 % of runs (when no fp32 case was drawn); it was then told
    'forgot the factor 2'. Every run now has fp32 (case 1), bf16 and fp16 cases."""
    assert ch01.check_decode_intensity(_intensity_by_hand, seed=seed) == 8
    with pytest.raises(CheckFailed, match="you ignored dtype") as e:
        ch01.check_decode_intensity(
            lambda s, b, c, dt: _intensity_by_hand(s, b, c, dt, weight_bytes=2, kv_bytes=2), seed=seed)
    assert "multiply-add" not in str(e.value)
    with pytest.raises(CheckFailed, match="KV cache does not"):
        ch01.check_decode_intensity(lambda s, b, c, dt: _intensity_by_hand(s, b, c, dt, kv_bytes=2),
                                    seed=seed)


def test_decode_intensity_accepts_numpy_and_fraction():
    import numpy as np
    from fractions import Fraction
    assert ch01.check_decode_intensity(lambda *a: np.float64(decode_arithmetic_intensity(*a))) == 8
    assert ch01.check_decode_intensity(
        lambda s, b, c, dt: Fraction(decode_arithmetic_intensity(s, b, c, dt))) == 8


def test_training_bytes_calling_a_stub_names_the_stub():
    """training_bytes uses count_params; while that is a stub, the message names count_params,
    not training_bytes."""
    def count_params(spec):
        raise NotImplementedError("your code here")

    def training_bytes(spec, batch, seq_len):
        return 16 * count_params(spec) + 1

    with pytest.raises(CheckFailed, match="`count_params`, which your training_bytes calls") as e:
        ch01.check_training_memory(training_bytes)
    assert not isinstance(e.value, NotAttempted)


def test_numpy_int32_answer_does_not_overflow_in_a_hint():
    import numpy as np
    with pytest.raises(CheckFailed, match="off by"):
        ch01.check_param_count(lambda s: np.int32(param_count(s) % 2**31 + 3))


# ---- every branch has a fixed case: a wrong answer that ignores one fails on every seed, there
SEEDS = range(8)


def params_by_hand(s, tied_aware=True, kv_heads=True, norms_per_layer=2, mlp_matrices=3,
                   final_norm=True):
    """Embeddings (V·h, twice when untied) + L·(2h² + 2h·H_kv·d + 3h·I + 2h) + h, with one of
    the usual slips switched on."""
    h, L = s.hidden_size, s.num_layers
    kv = (s.num_kv_heads if kv_heads else s.num_heads) * s.head_dim
    emb = s.vocab_size * h * (1 if tied_aware and s.tied_embeddings else 2)
    block = 2 * h * h + 2 * h * kv + mlp_matrices * h * s.intermediate_size + norms_per_layer * h
    return emb + L * block + (h if final_norm else 0)


@pytest.mark.parametrize("slip, case, message", [
    (dict(tied_aware=False), r"case 2 of 8: .*\(GQA\).*, tied embeddings", "embeddings are tied"),
    (dict(kv_heads=False), r"case 1 of 8: .*\(GQA\)", "grouped-query"),
    (dict(norms_per_layer=1), "case 1 of 8", "TWO RMSNorm"),
    (dict(mlp_matrices=2), "case 1 of 8", "THREE matrices"),
    (dict(final_norm=False), "case 1 of 8", "final RMSNorm"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_param_count_slips_fail_every_run_at_their_case(slip, case, message, seed):
    assert ch01.check_param_count(params_by_hand, seed=seed) == 8
    with pytest.raises(CheckFailed, match=message) as e:
        ch01.check_param_count(lambda s: params_by_hand(s, **slip), seed=seed)
    assert re.search(case, str(e.value))


def training_by_hand(s, b, t, per_layer=True, flash=True, state_bytes=16):
    """16 B per parameter + L · 34·t·b·h (+ L · 5·a·t²·b without FlashAttention)."""
    layer = 34 * t * b * s.hidden_size + (0 if flash else 5 * s.num_heads * t * t * b)
    return state_bytes * params_by_hand(s) + (s.num_layers if per_layer else 1) * layer


@pytest.mark.parametrize("slip, message", [
    (dict(per_layer=False), "34·s·b·h is per layer"),
    (dict(flash=False), "no attention matrix is stored"),
    (dict(state_bytes=12), "fp32 master weights"),
    (dict(state_bytes=4), "optimizer state"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_training_memory_slips_fail_every_run_at_case_1(slip, message, seed):
    """Case 1 has two layers or more: activations counted for one layer fail it in every run
    (a one-layer spec, drawn now and then, cannot tell)."""
    assert ch01.check_training_memory(training_by_hand, seed=seed) == 8
    with pytest.raises(CheckFailed, match=message) as e:
        ch01.check_training_memory(lambda s, b, t: training_by_hand(s, b, t, **slip), seed=seed)
    assert "case 1 of 8" in str(e.value)


def activation_by_hand(s, b, h, a, flash, attention=lambda s, b, h, a: 5 * a * s * s * b,
                       batch_in_34=True, use_flash=True):
    stored = 34 * s * (b if batch_in_34 else 1) * h
    return stored + (0 if flash and use_flash else attention(s, b, h, a))


@pytest.mark.parametrize("slip, case, message", [
    (dict(use_flash=False), 1, "is not stored"),
    (dict(attention=lambda s, b, h, a: 0), 2, "add the attention matrices"),
    (dict(attention=lambda s, b, h, a: 5 * h * s * s * b), 2, "not the hidden size h"),
    (dict(attention=lambda s, b, h, a: 5 * a * s * s), 2, "grow with the batch"),
    (dict(attention=lambda s, b, h, a: 5 * a * s * b), 2, "s × s"),
    (dict(batch_in_34=False), 1, "grow with the batch: 34·s·b·h"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_activation_slips_fail_every_run_at_their_case(slip, case, message, seed):
    """Case 1 (with FlashAttention) and case 2 (without) have b > 1 and h > a: a term without
    the batch, or with h in place of a, was caught only when a random case happened to have
    them."""
    assert ch01.check_activation_bytes(activation_by_hand, seed=seed) == 8
    with pytest.raises(CheckFailed, match=message) as e:
        ch01.check_activation_bytes(lambda *args: activation_by_hand(*args, **slip), seed=seed)
    assert f"case {case} of 8: s=" in str(e.value)


def intensity_slip(spec, batch, context, dtype, cache_heads=None, flop_heads=None,
                   weights_per_sequence=False):
    P, b = params_by_hand(spec), dtype_bytes(dtype)
    L, d = spec.num_layers, spec.head_dim
    flops = batch * (2 * P + 4 * L * (flop_heads or spec.num_heads) * d * context)
    kv = batch * context * 2 * L * (cache_heads or spec.num_kv_heads) * d * b
    return flops / (P * b * (batch if weights_per_sequence else 1) + kv)


@pytest.mark.parametrize("slip, message", [
    (lambda s: dict(cache_heads=s.num_heads), "num_kv_heads heads, not num_heads"),
    (lambda s: dict(flop_heads=s.num_kv_heads), "every query head"),
    (lambda s: dict(weights_per_sequence=True), "once for the whole batch"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_decode_intensity_slips_fail_every_run_at_case_1(slip, message, seed):
    """Case 1 is a grouped-query model (H_kv < H) at batch > 1, in fp32."""
    assert ch01.check_decode_intensity(intensity_slip, seed=seed) == 8
    with pytest.raises(CheckFailed, match=message) as e:
        ch01.check_decode_intensity(lambda s, b, c, dt: intensity_slip(s, b, c, dt, **slip(s)),
                                    seed=seed)
    assert re.search(r"case 1 of 8: .*\(GQA\).*fp32", str(e.value))
