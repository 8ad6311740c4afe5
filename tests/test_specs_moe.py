"""Mixture-of-experts and long-context presets (chapter 11): exact parameter counts against each
release's published figure, the KV cache of latent attention / sliding windows / quantized
caches, DeepSeek-V2's 93.3 % claim recomputed, and what a decode step reads of an MoE."""

import dataclasses
import json
import random

import pytest

from llminfra.calc import memory as mem
from llminfra.calc.long_context_kv import (attention_kv_table, kv_dtype_table, mla_kv_claim_check,
                                           sliding_window_table)
from llminfra.calc.params import (active_param_count, expected_experts_touched,
                                  expert_param_count, linear_weight_count, mtp_param_count,
                                  param_breakdown, param_count)
from llminfra.calc.step import decode_step_bytes, weight_bytes_read
from llminfra.cli import main
from llminfra.specs import get_model, model_names
from llminfra.specs.models import published_params

MOE = ["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "deepseek-v2-lite", "deepseek-v2",
       "deepseek-v3"]
NEW = ["mixtral-8x22b", "qwen3-30b-a3b", "deepseek-llm-67b", "deepseek-v2-lite", "deepseek-v2",
       "deepseek-v3"]


def _billions(text: str) -> tuple[float, float]:
    """"46.7B" -> (46.7, 0.1): the value and the unit of its last digit."""
    digits = text.rstrip("B")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return float(digits), 10.0 ** -decimals


def _allowed(published: str, rounding: str) -> tuple[float, float]:
    """The interval of exact counts (in billions) that print as ``published``."""
    value, unit = _billions(published)
    if rounding == "truncated":
        return value, value + unit
    return value - unit / 2, value + unit / 2


@pytest.mark.parametrize("name", MOE)
def test_counts_match_the_published_figures(name):
    """Each release's own total / active figure, within what its rounding allows (a figure
    marked "truncated" is one only truncation reproduces; the row's source says why)."""
    pub = published_params(name)
    assert pub and pub["source"]
    total = param_count(name) / 1e9
    active = active_param_count(name, pub["active_counts_input_embedding"]) / 1e9
    lo, hi = _allowed(pub["total"], "nearest")
    assert lo <= total < hi, (name, total, pub["total"])
    lo, hi = _allowed(pub["active"], pub["rounding"])
    assert lo <= active < hi, (name, active, pub["active"])


def test_exact_counts_by_hand():
    """DeepSeek-V3 (h = 7168, 61 layers, first 3 dense): attention per layer
    7168·1536 + 1536 + 1536·128·192 + 7168·576 + 512 + 512·128·256 + 128·128·7168 = 187,107,328;
    dense MLP 3·7168·18432 = 396,361,728; expert 3·7168·2048 = 44,040,192; MoE layer
    257 experts + router 256·7168 + bias 256; norms 2·7168 per layer;
    embedding + head 2·129280·7168; final norm 7168."""
    attn, dense, expert, norms = 187_107_328, 396_361_728, 44_040_192, 2 * 7168
    moe = 257 * expert + 256 * 7168 + 256
    total = 3 * (attn + dense + norms) + 58 * (attn + moe + norms) + 2 * 129280 * 7168 + 7168
    assert param_count("deepseek-v3") == total == 671_026_419_200
    assert expert_param_count("deepseek-v3") == expert
    assert active_param_count("deepseek-v3") == total - 58 * 248 * expert
    # Qwen3-30B-A3B: q 2048·4096, k and v 2048·512, o 4096·2048, q/k norms 2·128; 128 experts
    # of 3·2048·768; router 128·2048; untied 151936-row embedding and head
    layer = 2048 * 4096 * 2 + 2 * 2048 * 512 + 256 + 128 * 3 * 2048 * 768 + 128 * 2048 + 4096
    assert param_count("qwen3-30b-a3b") == 48 * layer + 2 * 151936 * 2048 + 2048
    # DeepSeek-V2-Lite has no q compression: q is one 2048 -> 16·192 projection
    assert get_model("deepseek-v2-lite").q_lora_rank is None
    assert param_count("deepseek-v2-lite") == 15_706_484_224


def test_mtp_module_is_not_counted():
    """DeepSeek-V3's 671 B is the main model; the 685 B checkpoint adds the "14B" MTP module
    (README). The module's MoE block alone is 11.507 B (README_WEIGHTS: "11.5B unique"); with
    eh_proj (2·7168²) and its 4 norms 11.61 B; with its stored copies of embedding and head
    (2 · 0.93 B) 13.46 B, so the checkpoint holds 684.5 B — the README's 671 and 14 are
    rounded separately, and 685 is their sum, within 1 B of the count."""
    spec = get_model("deepseek-v3")
    assert spec.mtp_layers == 1
    assert "mtp_not_counted" in published_params("deepseek-v3")
    mtp = mtp_param_count(spec)
    assert mtp == 11_610_068_224
    assert round((mtp - 2 * 7168 * 7168 - 4 * 7168) / 1e9, 1) == 11.5
    with_copies = mtp + 2 * spec.vocab_size * spec.hidden_size
    assert abs((param_count(spec) + with_copies) / 1e9 - 685) < 1
    assert mtp_param_count("mixtral-8x7b") == 0


def test_existing_presets_keep_their_fields_and_counts():
    """The new optional fields default to "absent": older presets count as before."""
    for name in model_names():
        s = get_model(name)
        if name not in NEW:
            assert (s.kv_lora_rank, s.moe_intermediate_size, s.num_shared_experts,
                    s.first_dense_layers, s.explicit_head_dim, s.qk_norm) == \
                (None, None, 0, 0, None, False), name
    assert param_count("mixtral-8x7b") == 46_702_792_704
    assert active_param_count("mixtral-8x7b") == 12_879_925_248
    assert get_model("mistral-7b").sliding_window == 4096
    assert get_model("qwen2.5-7b").sliding_window is None  # use_sliding_window: false


def test_breakdown_adds_up_on_random_moe_architectures():
    """Random DeepSeek- and Qwen3-style variants: the parts sum to the total; the linear
    weights + embeddings + norms + routers are every parameter (no biases); all experts
    active -> active == total; the expected experts touched grow from k to E."""
    rng = random.Random(11)
    for _ in range(25):
        base = get_model(rng.choice(["deepseek-v2-lite", "deepseek-v3", "qwen3-30b-a3b"]))
        E, L = rng.randint(2, 64), rng.randint(1, 9)
        spec = dataclasses.replace(
            base, name="random-moe", num_layers=L, num_experts=E,
            experts_per_token=rng.randint(1, E), hidden_size=rng.choice([64, 128]),
            moe_intermediate_size=rng.randint(1, 300), vocab_size=rng.randint(10, 999),
            first_dense_layers=min(base.first_dense_layers, L))
        parts = param_breakdown(spec)
        assert sum(v for k, v in parts.items() if k != "total") == parts["total"]
        L, h = spec.num_layers, spec.hidden_size
        inner = L * (2 * spec.head_dim if spec.qk_norm else 0)
        if spec.is_mla:
            inner += L * (spec.kv_lora_rank + (spec.q_lora_rank or 0))
        rest = 2 * spec.vocab_size * h + (2 * L + 1) * h + parts["router"] + inner
        assert linear_weight_count(spec) + rest == param_count(spec)
        assert active_param_count(dataclasses.replace(spec, experts_per_token=E)) == \
            param_count(spec)
        touched = [expected_experts_touched(spec, t) for t in (1, 2, 7, 10_000)]
        assert touched[0] == spec.experts_per_token and touched == sorted(touched)
        assert touched[-1] == pytest.approx(E)


def test_mla_kv_bytes_per_token_by_hand():
    """The cache holds c_KV (512) + k^R (64) per layer, shared by all heads:
    DeepSeek-V3 61 · 576 · 2 = 70,272 B in bf16; V2-Lite 27 · 576 · 2 = 31,104 B;
    fp8 / int8 halve it, int4 quarters it."""
    assert mem.kv_bytes_per_token("deepseek-v3") == 70_272
    assert mem.kv_bytes_per_token("deepseek-v2-lite") == 31_104
    assert mem.kv_bytes_per_token("deepseek-v3", "fp8") == 35_136
    assert mem.kv_bytes_per_token("deepseek-v3", "int8") == 35_136
    assert mem.kv_bytes_per_token("deepseek-v3", "int4") == 17_568
    assert get_model("deepseek-v3").attention == "MLA"
    # Qwen3: 4 KV heads of its explicit head_dim 128 (not 2048 / 32 = 64)
    assert mem.kv_bytes_per_token("qwen3-30b-a3b") == 2 * 48 * 4 * 128 * 2


def test_deepseek_v2_kv_claim():
    """93.3 % is reproduced only with V2's 6-bit cache (§3.2.3) against the 67B in 16 bits:
    1 - 60·576·6/8 / (2·95·8·128·2) = 1 - 25,920 / 389,120 = 93.34 %; dtype for dtype,
    1 - 34,560 / 194,560 = 82.24 %."""
    check = mla_kv_claim_check()
    assert check["model_elements_per_token"] == 60 * 576
    assert check["baseline_elements_per_token"] == 2 * 95 * 8 * 128
    by_case = {r["case"]: r for r in check["rows"]}
    assert by_case["same dtype: both bf16"]["reduction"] == pytest.approx(1 - 34_560 / 194_560)
    assert not by_case["same dtype: both bf16"]["matches_claim"]
    six = by_case["V2 6-bit cache (§3.2.3), 67B bf16"]
    assert six["model_bytes_per_token"] == 25_920 and six["baseline_bytes_per_token"] == 389_120
    assert six["matches_claim"] and [r["matches_claim"] for r in check["rows"]].count(True) == 1
    assert "82.2%" in check["verdict"]


def test_sliding_window_bounds_the_cache():
    """Mistral-7B (W = 4096), bf16, 32,768 tokens: 131,072 B/token · 4,096 = 0.537 GB with the
    rolling buffer vs · 32,768 = 4.29 GB; below the window nothing changes; the budget fits
    more sequences with the window."""
    per = mem.kv_bytes_per_token("mistral-7b")
    assert mem.kv_bytes("mistral-7b", 32768, sliding_window=True) == per * 4096
    assert mem.kv_bytes("mistral-7b", 32768) == per * 32768
    assert mem.kv_bytes("mistral-7b", 1000, sliding_window=True) == per * 1000
    assert mem.kv_bytes("llama-2-7b", 4096, sliding_window=True) == mem.kv_bytes("llama-2-7b", 4096)
    rows = sliding_window_table("mistral-7b", (2048, 32768))
    assert [r["ratio"] for r in rows] == [1.0, 8.0]
    with pytest.raises(ValueError, match="no sliding window"):
        sliding_window_table("llama-2-7b")
    full = mem.max_batch("mistral-7b", "a100-80gb", context=32768)
    windowed = mem.max_batch("mistral-7b", "a100-80gb", context=32768, sliding_window=True)
    assert windowed > 7 * full >= 7


def test_quantized_kv_dtypes_and_scales():
    """fp8 / int8 / int4 KV: 1, 1, 0.5 bytes per element; with kv_group_size 32 each of the 64
    head vectors (128 wide) of a Llama-2-7B layer adds 4 fp16 scales: 32 · (4096 + 512) B."""
    assert mem.kv_bytes_per_token("llama-2-7b", "fp8") == 262_144
    assert mem.kv_bytes_per_token("llama-2-7b", "int4") == 131_072
    assert mem.kv_bytes_per_token("llama-2-7b", "int4", kv_group_size=32) == 32 * (4096 + 512)
    rows = {r["kv_dtype"]: r for r in kv_dtype_table("deepseek-v3", 32768)}
    assert rows["int4"]["vs_bf16"] == 0.25 and rows["fp8"]["vs_bf16"] == 0.5
    with pytest.raises(ValueError, match="quantized"):
        mem.kv_bytes_per_token("llama-2-7b", "bf16", kv_group_size=32)
    with pytest.raises(ValueError, match="kv_group_size"):
        mem.kv_bytes_per_token("llama-2-7b", "int8", kv_group_size=0)
    with pytest.raises(KeyError, match="int4"):
        mem.inference_memory("llama-2-7b", kv_dtype="int3")


def test_decode_reads_only_the_routed_experts():
    """Weights count every expert (capacity); one decode token reads 2 · its active params
    without the input embedding, + the one embedding row it looks up, in bf16 (DeepSeek-V3:
    73.3 GB of 1,342 GB); a long prefill reads them all; dense models read all their weights
    but the embedding rows no token looked up."""
    assert weight_bytes_read("deepseek-v3", "bf16", 1) == 2 * (
        active_param_count("deepseek-v3", include_input_embedding=False) + 7168)
    assert weight_bytes_read("deepseek-v3", "bf16", 1, whole_input_embedding=True) == \
        2 * active_param_count("deepseek-v3")
    assert weight_bytes_read("deepseek-v3", "bf16", 200_000) == mem.weight_bytes("deepseek-v3")
    reads = [weight_bytes_read("qwen3-30b-a3b", "fp8", t) for t in (1, 4, 16, 64)]
    assert reads == sorted(reads) and reads[-1] <= mem.weight_bytes("qwen3-30b-a3b", "fp8")
    assert weight_bytes_read("llama-2-7b", "bf16", 1) == \
        mem.weight_bytes("llama-2-7b") - 31_999 * 4096 * 2
    assert weight_bytes_read("llama-2-7b", "bf16", 32_000) == mem.weight_bytes("llama-2-7b")
    assert weight_bytes_read("smollm2-135m", "bf16", 1) == mem.weight_bytes("smollm2-135m")
    assert decode_step_bytes("deepseek-v3", 1, 1024) == \
        weight_bytes_read("deepseek-v3", whole_input_embedding=True) + 1024 * 70_272


def test_latent_cache_is_whole_on_every_gpu():
    """Tensor parallelism splits K/V heads but not the shared latent: on 8 GPUs every token's
    70,272 B (bf16) are stored 8 times, so the pooled budget holds 1/8 of the tokens."""
    b = mem.kv_budget("deepseek-v3", "h200", dtype="fp8", context=4096, num_gpus=8)
    assert b.kv_budget_tokens == b.kv_budget_bytes // (8 * b.kv_bytes_per_token)
    assert b.max_sequences >= 1


def test_attention_table_and_memory_json(capsys):
    """The comparison table covers every kind; `llminfra memory --model deepseek-v3 --context
    32768 --json` prints the contract keys with the MLA cache, and `models --json` gives
    total_params and active_params in every row."""
    kinds = {r["attention"] for r in attention_kv_table()}
    assert {"GQA", "MLA"} <= kinds
    assert main(["memory", "--model", "deepseek-v3", "--context", "32768", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["kv_bytes"] == 70_272 * 32768 and r["attention"] == "MLA"
    assert r["params"] == param_count("deepseek-v3") and r["total_bytes"] > r["weight_bytes"]
    assert r["decode_weight_bytes_read"] == \
        2 * (active_param_count("deepseek-v3", include_input_embedding=False) + 7168)
    assert main(["memory", "--model", "mistral-7b", "--context", "32768", "--kv-dtype", "int4",
                 "--sliding-window", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["kv_bytes"] == 4096 * 32 * 2 * 8 * 128 // 2
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all({"total_params", "active_params", "params"} <= set(row) for row in rows)
    assert {row["name"] for row in rows} >= set(NEW)


def test_memory_calculator_offers_the_variants():
    """The chapter 02 calculator lists the new presets and KV dtypes, and its window switch
    bounds Mistral's cache."""
    from llminfra.widgets.memory_calculator import KV_DTYPES, MemoryCalculator, memory_breakdown
    assert {"int8", "int4", "fp8"} <= set(KV_DTYPES)
    full = memory_breakdown("mistral-7b", "a100-80gb", "bf16", "bf16", 32768, 1)
    windowed = memory_breakdown("mistral-7b", "a100-80gb", "bf16", "bf16", 32768, 1,
                                sliding_window=True)
    assert full["kv_bytes"] == 8 * windowed["kv_bytes"]
    calc = MemoryCalculator(model="deepseek-v2-lite", gpu="a100-80gb")
    assert set(NEW) <= set(calc.controls["model"].options)
    assert "latent" in calc.text and "experts" in calc.text


def test_bad_architectures_are_refused():
    base = get_model("deepseek-v2-lite")
    with pytest.raises(ValueError, match="v_head_dim"):
        dataclasses.replace(base, v_head_dim=0)
    with pytest.raises(ValueError, match="first_dense_layers"):
        dataclasses.replace(base, first_dense_layers=99)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        dataclasses.replace(base, kv_lora_rank=0)
    with pytest.raises(ValueError, match="tokens"):
        expected_experts_touched("mixtral-8x7b", 0)
