"""Tests for the decode-step traffic model of llminfra.calc.step (chapter 01)."""

import math

import pytest

from llminfra.calc.memory import kv_bytes_per_token, weight_bytes
from llminfra.calc.step import decode_arithmetic_intensity, decode_step_bytes, decode_step_flops


def test_llama2_7b_by_hand():
    """Llama-2-7B, bf16, batch 1, context 1: bytes = 2 · 6,738,415,616 + 2·32·32·128·2
    = 13,476,831,232 + 524,288; FLOPs = 2 · 6,738,415,616 + 4·32·32·128 — the same number, so
    the intensity is exactly 1 FLOP per byte."""
    assert decode_step_bytes("llama-2-7b", 1, 1) == 13_476_831_232 + 524_288
    assert decode_step_flops("llama-2-7b", 1, 1) == 13_477_355_520
    assert decode_arithmetic_intensity("llama-2-7b", 1, 1) == 1.0


@pytest.mark.parametrize("model", ["llama-2-13b", "mistral-7b", "gpt2"])
def test_batch_shares_the_weights(model):
    """Weights are read once per step whatever the batch; KV and FLOPs grow with it, so the
    intensity grows with the batch (by nearly 8x from 1 to 8 at a short context)."""
    b1, b8 = decode_step_bytes(model, 1, 16), decode_step_bytes(model, 8, 16)
    assert b8 - b1 == 7 * 16 * kv_bytes_per_token(model)
    assert decode_step_flops(model, 8, 16) == 8 * decode_step_flops(model, 1, 16)
    ratio = decode_arithmetic_intensity(model, 8, 16) / decode_arithmetic_intensity(model, 1, 16)
    assert 7 < ratio <= 8


def test_moe_batch_reads_more_experts():
    """Mixtral 8x7B: a batch of B decode tokens reads the experts they were routed to, on
    average 8 · (1 - (6/8)^B) per layer (uniform routing): 2 at B = 1, 8 · (1 - 0.75⁸) = 7.20
    at B = 8, so the step reads more weights than at batch 1 but never more than all of them.
    FLOPs still grow exactly with the batch (2 experts per token)."""
    from llminfra.calc.params import expert_param_count
    b1, b8 = decode_step_bytes("mixtral-8x7b", 1, 16), decode_step_bytes("mixtral-8x7b", 8, 16)
    extra = 32 * (8 * (1 - 0.75 ** 8) - 2) * expert_param_count("mixtral-8x7b") * 2
    assert b8 - b1 == pytest.approx(7 * 16 * kv_bytes_per_token("mixtral-8x7b") + extra, abs=2)
    assert b8 < weight_bytes("mixtral-8x7b") + 8 * 16 * kv_bytes_per_token("mixtral-8x7b")
    assert decode_step_flops("mixtral-8x7b", 8, 16) == 8 * decode_step_flops("mixtral-8x7b", 1, 16)


def test_int4_weights_raise_the_intensity():
    """int4 weights read about a quarter of the bf16 bytes, so FLOPs per byte rise ~3-4x."""
    r = decode_arithmetic_intensity("llama-2-7b", 1, 1, "int4") / decode_arithmetic_intensity(
        "llama-2-7b", 1, 1, "bf16")
    assert 3 < r < 4
    assert decode_step_bytes("llama-2-7b", 1, 1, "int4") == weight_bytes("llama-2-7b", "int4") + 524_288


def test_bad_inputs():
    with pytest.raises(ValueError, match="batch"):
        decode_step_flops("gpt2", 0)
    with pytest.raises(ValueError, match="context"):
        decode_step_bytes("gpt2", 1, 10**6)
    assert math.isfinite(decode_arithmetic_intensity("gpt2", 3, 5))
