"""Tests for llminfra.calc.roofline (chapter 08): the one per-step roofline accounting."""

import math

import pytest

from llminfra.calc.step import decode_step_bytes, decode_step_flops, step_bytes, step_flops
from llminfra.calc.roofline import (Roofline, arithmetic_intensity, catalog_table,
                                    decode_time_per_token_s, decode_tokens_per_s,
                                    default_interconnect, device_roofline, layer_point,
                                    prefill_batch, prefill_time_s, step_breakdown, step_time_s,
                                    ttft_s)
from llminfra.specs import get_model


def test_decode_step_by_hand():
    """Llama-2-7B on an A100-80GB SXM (2,039 GB/s, 312 dense bf16 TFLOPS), bf16, one decode
    step at context 1: bytes = 13,476,831,232 + 524,288 = 13,477,355,520 ->
    13,477,355,520 / 2.039e12 = 6.6098 ms; FLOPs 13,477,355,520 / 312e12 = 0.0432 ms.
    Memory-bound: the step time is the memory time."""
    b = step_breakdown("llama-2-7b", "a100-80gb", [(1, 1)])
    assert b["bytes"] == 13_477_355_520 and b["flops"] == 13_477_355_520
    assert b["bound"] == "memory"
    assert math.isclose(b["time_s"], 13_477_355_520 / 2.039e12, rel_tol=1e-12)
    assert step_time_s("llama-2-7b", "a100-80gb", [(1, 1)]) == b["time_s"]


def test_decode_functions_are_the_step_accounting():
    """decode_step_bytes / flops of (batch, context) are step_bytes / flops of `batch` pairs
    (1, context): one function answers the question — chapter 01's count, the input embedding
    whole, which the roofline uses too; step_bytes' default reads only the tokens' rows."""
    for model, batch, ctx in (("gpt2", 3, 7), ("mistral-7b", 2, 100), ("mixtral-8x7b", 1, 5)):
        whole = step_bytes(model, [(1, ctx)] * batch, whole_input_embedding=True)
        assert decode_step_bytes(model, batch, ctx) == whole
        assert step_breakdown(model, "h100", [(1, ctx)] * batch)["bytes"] == whole
        spec = get_model(model)
        assert whole - step_bytes(model, [(1, ctx)] * batch) == \
            (0 if spec.tied_embeddings else (spec.vocab_size - batch) * spec.hidden_size * 2)
        assert decode_step_flops(model, batch, ctx) == step_flops(model, [(1, ctx)] * batch)


def test_prefill_attention_pairs_by_hand():
    """gpt2 (L = 12, H = 12, d = 64), prompt of 4 tokens: causal pairs 1+2+3+4 = 10 =
    n·c - n(n-1)/2 = 16 - 6; FLOPs = 2 · 124,439,808 · 4 + 4 · 12 · 12 · 64 · 10."""
    assert step_flops("gpt2", [(4, 4)]) == 2 * 124_439_808 * 4 + 4 * 12 * 12 * 64 * 10
    # 2 new tokens after 3 cached: pairs 4 + 5 = 9 = 2·5 - 1
    assert step_flops("gpt2", [(2, 5)]) == 2 * 124_439_808 * 2 + 4 * 12 * 12 * 64 * 9


def test_output_layer_once_per_sequence_with_logits_last():
    """Llama-2-7B (V = 32,000, h = 4,096, L = H = 32, d = 128), a prompt of 2 tokens:
    every token through every weight: 2 · 6,738,415,616 · 2 + 4 · 32 · 32 · 128 · 3 =
    26,955,235,328; only the last token's logits: 2 · 32,000 · 4,096 = 262,144,000 fewer,
    26,693,091,328. A decode step (one new token) is the same either way; a step of two
    sequences drops the output layer once per sequence for each token but its last."""
    assert step_flops("llama-2-7b", [(2, 2)]) == 26_955_235_328
    assert step_flops("llama-2-7b", [(2, 2)], logits="last") == 26_693_091_328
    assert step_flops("gpt2", [(1, 9)], logits="last") == step_flops("gpt2", [(1, 9)])
    pairs = [(5, 7), (3, 3)]
    assert step_flops("gpt2", pairs) - step_flops("gpt2", pairs, logits="last") == \
        2 * 50_257 * 768 * (4 + 2)
    roof = Roofline("cpu", 1e11, 2e10)
    b = step_breakdown("gpt2", roof, [(64, 64)], dtype="fp32", logits="last")
    assert b["flops"] == step_flops("gpt2", [(64, 64)], logits="last")
    assert ttft_s("gpt2", roof, 64, dtype="fp32", logits="last") < ttft_s("gpt2", roof, 64,
                                                                         dtype="fp32")
    with pytest.raises(ValueError, match="logits must be one of"):
        step_flops("gpt2", [(1, 1)], logits="first")


def test_cpu_roofline_and_overhead():
    """A measured device: 1e11 FLOP/s and 2e10 B/s, ridge 5 FLOP/B. gpt2 fp32 decode at
    context 1 reads 4 · 124,439,808 + 2·12·12·64·4 bytes -> /2e10 s, plus 1 ms overhead."""
    roof = Roofline("cpu", 1e11, 2e10)
    assert roof.ridge_flops_per_byte == 5
    assert roof.attainable_flops_per_s(1.0) == 2e10 and roof.attainable_flops_per_s(50) == 1e11
    nbytes = 4 * 124_439_808 + 2 * 12 * 12 * 64 * 4
    t = step_time_s("gpt2", roof, [(1, 1)], dtype="fp32", overhead_s=1e-3)
    assert math.isclose(t, nbytes / 2e10 + 1e-3, rel_tol=1e-12)


def test_tensor_parallel_splits_and_adds_allreduces():
    """Llama-2-70B (h = 8192, L = 80, 8 KV heads) on 4 H100s, decode batch 1 at context 1:
    each all-reduce 8192 · 2 B over NVLink 4 (450 GB/s a direction): 1.5 · 16,384 / 450e9 s,
    160 of them."""
    one = step_breakdown("llama-2-70b", "h100", [(1, 1)])
    four = step_breakdown("llama-2-70b", "h100", [(1, 1)], tensor_parallel=4)
    assert math.isclose(four["memory_s"], one["memory_s"] / 4, rel_tol=1e-12)
    assert math.isclose(four["comm_s"], 160 * 1.5 * 16_384 / 450e9, rel_tol=1e-12)
    assert four["time_s"] == four["memory_s"] + four["comm_s"]


def test_interconnect_defaults():
    assert default_interconnect("h100").bytes_per_s == 450e9
    assert default_interconnect("a100-80gb-pcie", 2).name.startswith("NVLink")
    assert default_interconnect("a100-80gb-pcie", 4).name.startswith("PCIe")
    with pytest.raises(ValueError, match="interconnect"):
        default_interconnect("m4-max")


def test_bad_inputs():
    with pytest.raises(ValueError, match="new_tokens"):
        step_time_s("gpt2", "h100", [(5, 3)])
    with pytest.raises(ValueError, match="pair"):
        step_time_s("gpt2", "h100", [])
    with pytest.raises(ValueError, match="tensor_parallel"):
        step_time_s("gpt2", "h100", [(1, 1)], tensor_parallel=0)
    with pytest.raises(ValueError, match="interconnect"):
        step_time_s("gpt2", Roofline("cpu", 1e11, 1e10), [(1, 1)], tensor_parallel=2)
    with pytest.raises(KeyError, match="unknown GPU"):
        device_roofline("h1000")
    with pytest.raises(ValueError, match="Roofline"):
        Roofline("cpu", 0, 1e9)


def test_layer_point_by_hand():
    """A Llama-2-7B block in bf16, decode at batch 1, context 1: 4·4096² + 3·4096·11008 +
    2·4096 = 202,383,360 weights -> 404,766,720 FLOPs + 4·32·128 = 404,783,104 FLOPs; bytes
    404,766,720 + 2·32·128·2 = 404,783,104 -> intensity 1. At batch 64 the FLOPs grow 64x and
    the bytes barely (the weights are shared)."""
    one = layer_point("llama-2-7b", [(1, 1)])
    assert one["flops"] == 404_783_104 and one["bytes"] == 404_783_104
    many = layer_point("llama-2-7b", [(1, 1)] * 64)
    assert many["flops"] == 64 * one["flops"] and 60 < many["intensity"] < 64


def test_bounds_are_step_time():
    """Every bound is step_time_s of the matching batch of pairs."""
    t = decode_time_per_token_s("mistral-7b", "h100", batch=4, context=300)
    assert t == step_time_s("mistral-7b", "h100", [(1, 300)] * 4)
    assert decode_tokens_per_s("mistral-7b", "h100", 4, 300) == 4 / t
    assert ttft_s("mistral-7b", "h100", 512) == prefill_time_s("mistral-7b", "h100", 512) == \
        step_time_s("mistral-7b", "h100", [(512, 512)])
    assert arithmetic_intensity("llama-2-7b", [(1, 1)]) == 1.0


def test_prefill_is_compute_bound_decode_memory_bound():
    """On every catalog GPU: a 2048-token Llama-2-7B prefill is compute-bound, batch-1 decode
    memory-bound, and the decode intensity (~1 FLOP/B) is far below the ridge (75..420)."""
    rows = catalog_table("llama-2-7b", batch=1, context=2048)
    assert len(rows) >= 10
    for r in rows:
        assert r["intensity"] < r["ridge_flops_per_byte"] / 50
        assert step_breakdown("llama-2-7b", r["gpu"], prefill_batch(2048))["bound"] == "compute"
        assert math.isclose(r["attainable_tflops"], r["intensity"] * r["bandwidth_gb_per_s"] / 1e3)
