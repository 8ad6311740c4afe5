"""Chapter 08 checkers: each passes on right answers (of any numeric type) and fails, naming
the case, the seed and the usual mistake, on wrong ones; never crashes on a learner's answer."""

from dataclasses import replace
from decimal import Decimal

import numpy as np
import pytest
import torch

from llminfra.calc.memory import kv_bytes_per_token, weight_bytes
from llminfra.calc.params import param_count
from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch08
from llminfra.specs import get_gpu, get_model


def layer_right(model, B, c):
    """By hand: P_layer = what one more layer adds to the parameters; FLOPs = B·(2·P_layer +
    4·H·d·c); bytes = 2·P_layer + B·c·kv_bytes_per_token/L (bf16). Llama-2-7B at B = 1, c = 1:
    404,783,104 / 404,783,104 = 1."""
    s = get_model(model)
    p = param_count(replace(s, num_layers=2)) - param_count(replace(s, num_layers=1))
    flops = B * (2 * p + 4 * s.num_heads * s.head_dim * c)
    return flops / (2 * p + B * c * kv_bytes_per_token(s) / s.num_layers)


def decode_right(model, gpu, B, c):
    """By hand: B / max(FLOPs / peak, bytes / bandwidth); Llama-2-7B on an H100 at B = 1,
    c = 2048: 3.35e12 / (13,476,831,232 + 2048 · 524,288) = 230.2 tokens/s."""
    s, g = get_model(model), get_gpu(gpu)
    flops = B * (2 * param_count(s) + 4 * s.num_layers * s.num_heads * s.head_dim * c)
    nbytes = weight_bytes(s) + B * c * kv_bytes_per_token(s)
    return B / max(flops / (g.tflops("bf16") * 1e12), nbytes / g.hbm_bytes_per_s)


def test_hand_examples():
    assert layer_right("llama-2-7b", 1, 1) == pytest.approx(1.0)
    assert decode_right("llama-2-7b", "h100", 1, 2048) == pytest.approx(230.23, abs=0.01)


SEEDS = [1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_checkers_pass_on_right_answers(seed):
    assert ch08.check_layer_point(layer_right, seed=seed) == 8
    assert ch08.check_decode_bound(decode_right, seed=seed) == 8


@pytest.mark.parametrize("seed", SEEDS)
def test_any_numeric_type_is_accepted(seed):
    assert ch08.check_layer_point(lambda *a: np.float32(layer_right(*a)), seed=seed) == 8
    assert ch08.check_decode_bound(lambda *a: torch.tensor(decode_right(*a),
                                                           dtype=torch.float64), seed=seed) == 8
    assert ch08.check_layer_point(lambda *a: Decimal(layer_right(*a)), seed=seed) == 8


def _layer_parts(model, B, c):
    s = get_model(model)
    p = param_count(replace(s, num_layers=2)) - param_count(replace(s, num_layers=1))
    return s, p, 4 * s.num_heads * s.head_dim, kv_bytes_per_token(s) / s.num_layers


def no_two(model, B, c):
    s, p, attn, kv = _layer_parts(model, B, c)
    return B * (p + attn * c / 2) / (2 * p + B * c * kv)


def weights_per_seq(model, B, c):
    s, p, attn, kv = _layer_parts(model, B, c)
    return B * (2 * p + attn * c) / (B * 2 * p + B * c * kv)


def no_kv(model, B, c):
    s, p, attn, kv = _layer_parts(model, B, c)
    return B * (2 * p + attn * c) / (2 * p)


@pytest.mark.parametrize("wrong, message", [
    (no_two, "factor 2"), (weights_per_seq, "once per sequence"), (no_kv, "left out the KV"),
    (lambda m, B, c: layer_right(m, B, c) / 2, "fp32"),
    (lambda m, B, c: 1 / layer_right(m, B, c), "bytes per FLOP"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_layer_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message) as e:
        ch08.check_layer_point(wrong, seed=seed)
    assert f"replay: ch08.check_layer_point(your_function, seed={seed})" in str(e.value)


@pytest.mark.parametrize("wrong, message", [
    (lambda m, g, B, c: decode_right(m, g, B, c) / B, "multiply by the batch"),
    (lambda m, g, B, c: 1 / decode_right(m, g, B, c), "seconds per token"),
    (lambda m, g, B, c: B * get_gpu(g).hbm_bytes_per_s / weight_bytes(m), "left out the KV"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_decode_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message):
        ch08.check_decode_bound(wrong, seed=seed)


def memory_roof_only(model, gpu, B, c):
    """The usual wrong bound: bytes / bandwidth alone, the compute roof left out."""
    s = get_model(model)
    return B * get_gpu(gpu).hbm_bytes_per_s / (weight_bytes(s) + B * c * kv_bytes_per_token(s))


def no_attention_flops(model, gpu, B, c):
    """The compute roof without the attention FLOPs (4·L·H·d per cached position)."""
    s, g = get_model(model), get_gpu(gpu)
    nbytes = weight_bytes(s) + B * c * kv_bytes_per_token(s)
    return B / max(B * 2 * param_count(s) / (g.tflops("bf16") * 1e12), nbytes / g.hbm_bytes_per_s)


@pytest.mark.parametrize("wrong, message", [
    (memory_roof_only, "left out the compute roof"),
    (no_attention_flops, "left out the attention FLOPs"),
])
@pytest.mark.parametrize("seed", range(10))
def test_decode_without_the_compute_roof_fails_every_run(wrong, message, seed):
    """Random draws are compute-bound in under 1 % of cases; the fixed compute-bound case
    (case 3, after two batch-1 steps that are always memory-bound) makes these wrong answers
    fail on every seed, at that case."""
    with pytest.raises(CheckFailed, match=message) as e:
        ch08.check_decode_bound(wrong, seed=seed)
    assert "case 3 of 8: compute-bound GQA preset: a large batch at a short context" in str(e.value)


def attention_over_kv_heads(model, gpu, B, c, divided=False):
    """The compute roof with the attention FLOPs over the KV heads: 4·L·H_kv·d per cached
    position, or 4·L·H·d / H_kv ("divided by the KV heads")."""
    s, g = get_model(model), get_gpu(gpu)
    heads = s.num_heads / s.num_kv_heads if divided else s.num_kv_heads
    flops = B * (2 * param_count(s) + 4 * s.num_layers * heads * s.head_dim * c)
    nbytes = weight_bytes(s) + B * c * kv_bytes_per_token(s)
    return B / max(flops / (g.tflops("bf16") * 1e12), nbytes / g.hbm_bytes_per_s)


@pytest.mark.parametrize("divided, message", [(False, "H, not H_kv"),
                                              (True, "divided the attention FLOPs by the KV")])
@pytest.mark.parametrize("seed", range(10))
def test_decode_attention_over_kv_heads_fails_every_run_at_case_3(divided, message, seed):
    """It passed every seed whose compute-bound case drew a multi-head model (H_kv = H): case 3
    is now a grouped-query preset, compute-bound, where those FLOPs change the bound."""
    assert ch08.check_decode_bound(decode_right, seed=seed) == 8
    with pytest.raises(CheckFailed, match=message) as e:
        ch08.check_decode_bound(lambda *a: attention_over_kv_heads(*a, divided=divided),
                                seed=seed)
    assert "case 3 of 8: compute-bound GQA preset" in str(e.value)


def test_replay_with_the_seed_gives_the_same_cases():
    seen = []

    def spy(*args):
        seen.append(args)
        return decode_right(*args)

    ch08.check_decode_bound(spy, seed=123)
    first, seen[:] = list(seen), []
    ch08.check_decode_bound(spy, seed=123)
    assert seen == first


def test_never_crashes_on_a_learner_answer():
    for bad in (lambda *a: "fast", lambda *a: None, lambda *a: [1, 2], lambda *a: 1 / 0):
        with pytest.raises(CheckFailed):
            ch08.check_layer_point(bad)

    def stub(*a):
        raise NotImplementedError("your code here")
    for check in (ch08.check_layer_point, ch08.check_decode_bound):
        with pytest.raises(NotAttempted, match="not implemented"):
            check(stub)
    with pytest.raises(CheckFailed, match="expected a function"):
        ch08.check_decode_bound(42)
