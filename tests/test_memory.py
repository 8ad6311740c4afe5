"""The memory model, with the numbers worked by hand in each docstring."""

import pytest

from llminfra.calc import memory as mem
from llminfra.calc import step
from llminfra.calc.params import active_param_count, param_breakdown, param_count
from llminfra.specs import get_model, model_names

# Published totals (sum of numel of the Hugging Face checkpoints' parameters).
KNOWN = {"gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
         "gpt2-xl": 1_557_611_200, "llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320,
         "llama-2-70b": 68_976_648_192, "llama-3-8b": 8_030_261_248,
         "llama-3-70b": 70_553_706_496, "mistral-7b": 7_241_732_096,
         "mixtral-8x7b": 46_702_792_704, "qwen2.5-7b": 7_615_616_512,
         "falcon-7b": 6_921_720_704}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_param_count_matches_released_checkpoints(name):
    assert param_count(name) == KNOWN[name]


def test_llama_2_7b_by_hand():
    """2·32000·4096 (embedding + lm_head) + 32·(4·4096² + 3·4096·11008 + 2·4096) + 4096
    = 262,144,000 + 6,476,267,520 + 4,096 = 6,738,415,616."""
    b = param_breakdown("llama-2-7b")
    assert b["embedding"] + b["lm_head"] == 262_144_000
    assert b["attention"] + b["mlp"] + b["norms"] - 4096 == 6_476_267_520
    assert b["total"] == 6_738_415_616


def test_paper_sizes():
    """LLaMA paper: 6.7B, 13.0B, 32.5B, 65.2B; Megatron-LM: 8.3B; StarCoder 15.5B. The papers
    truncate (LLaMA-65B has 65,285,660,672 parameters), so compare the truncated value."""
    for name, billions in [("llama-7b", 6.7), ("llama-13b", 13.0), ("llama-33b", 32.5),
                           ("llama-65b", 65.2), ("megatron-8.3b", 8.3), ("starcoder", 15.5)]:
        assert int(param_count(name) / 1e8) / 10 == billions, name


def test_mixtral_active_parameters():
    """Mistral: 46.7B total, 12.9B active (2 of 8 experts per token)."""
    assert round(param_count("mixtral-8x7b") / 1e9, 1) == 46.7
    assert round(active_param_count("mixtral-8x7b") / 1e9, 1) == 12.9
    assert active_param_count("llama-2-7b") == param_count("llama-2-7b")


def test_kv_bytes_per_token_by_hand():
    """Llama-2-7B: 2·32·32·128·2 = 524,288; Llama-2-70B (GQA, 8 KV heads): 2·80·8·128·2 =
    327,680; Falcon-7B (MQA): 2·32·1·64·2 = 8,192; OPT-13B: 2·40·40·128·2 = 819,200."""
    assert mem.kv_bytes_per_token("llama-2-7b") == 524_288
    assert mem.kv_bytes_per_token("llama-2-70b") == 327_680
    assert mem.kv_bytes_per_token("falcon-7b") == 8_192
    assert mem.kv_bytes_per_token("opt-13b") == 819_200
    assert mem.kv_bytes_per_token("llama-2-7b", "fp8") == 262_144
    assert mem.kv_bytes_per_token("llama-2-7b", "fp32") == 1_048_576


def test_kv_bytes_per_sequence_opt_13b():
    """819,200 B/token × 2048 tokens = 1,677,721,600 B = 1.5625 GiB (vLLM's "1.6 GB")."""
    assert mem.kv_bytes("opt-13b", 2048) == 1_677_721_600
    assert mem.gib(mem.kv_bytes("opt-13b", 2048)) == 1.5625
    assert mem.kv_bytes("opt-13b", 2048, batch=3) == 3 * 1_677_721_600


def test_weight_bytes_plain():
    """StarCoder 15,517,456,384 params × 2 B = 31.03 GB = 28.9 GiB."""
    w = mem.weight_bytes("starcoder", "bf16")
    assert w == 2 * param_count("starcoder")
    assert round(mem.gb(w), 2) == 31.03 and round(mem.gib(w), 1) == 28.9
    assert mem.weight_bytes("llama-2-7b", "fp32") == 4 * 6_738_415_616


def test_weight_bytes_int4_with_group_scales():
    """int4-g128: 0.5 B per linear weight + 2 B per 128 weights = 0.515625 B; the rest
    (embedding, lm_head, norms) in bf16. Llama-2-7B: linear = 32·(4·4096² + 3·4096·11008)
    = 6,476,005,376; rest = 6,738,415,616 − 6,476,005,376 = 262,410,240."""
    linear, rest = 6_476_005_376, 262_410_240
    expected = int(linear * 0.5 + linear // 128 * 2 + rest * 2)
    assert mem.weight_bytes("llama-2-7b", "int4", group_size=128) == expected
    with_zero = mem.weight_bytes("llama-2-7b", "int4", group_size=128, zero_point=True)
    assert with_zero - expected == linear // 128 * 2


def test_weight_bytes_per_channel():
    """Per output channel: one scale per row; Llama-2-7B has 32·(4·4096 + 2·11008 + 4096)
    rows = 1,359,872 rows (q, k, v, o, gate, up: out rows; down: 4096 rows)."""
    linear, rest = 6_476_005_376, 262_410_240
    rows = 32 * (4 * 4096 + 2 * 11008 + 4096)
    assert mem.weight_bytes("llama-2-7b", "int8", group_size=None) == linear + 2 * rows + 2 * rest


def test_training_memory_mixed_adamw_is_16_bytes_per_param():
    P = param_count("llama-2-7b")
    t = mem.training_memory("llama-2-7b", batch=1, seq_len=2048)
    assert t["weights"] + t["gradients"] + t["master_weights"] + t["optimizer_states"] == 16 * P
    eight = mem.training_memory("llama-2-7b", recipe="adamw-8bit")
    assert eight["optimizer_states"] == 2 * P


def test_training_activations_korthikanti():
    """GPT-2 (h=768, a=12, L=12), s=1024, b=1, no flash: per layer s·b·h·34 + 5·a·s²·b
    = 26,738,688 + 62,914,560 = 89,653,248; × 12 layers = 1,075,838,976."""
    assert mem.activation_bytes_training("gpt2", 1, 1024, flash=False) == 1_075_838_976
    assert mem.activation_bytes_training("gpt2", 1, 1024, flash=True) == 12 * 26_738_688
    ckpt = mem.activation_bytes_training("gpt2", 1, 1024, checkpointing=True, flash=True)
    assert ckpt == 12 * 2 * 1024 * 768 + 26_738_688


def test_inference_activations_by_hand():
    """Llama-2-7B, 1 sequence × 1 token, bf16: (4·4096 + 2·4096 + 3·11008)·2 B
    = 57,600·2 = 115,200 B; plus fp32 logits 32000·4 = 128,000 B → 243,200 B."""
    assert mem.activation_bytes_inference("llama-2-7b", 1, 1) == 243_200
    naive = mem.activation_bytes_inference("llama-2-7b", 1, 100, attention="naive")
    flash = mem.activation_bytes_inference("llama-2-7b", 1, 100, attention="flash")
    assert naive - flash == 32 * 100 * 100 * 2


def test_inference_memory_keys_and_total():
    e = mem.inference_memory("llama-2-13b", "bf16", context=4096).to_dict()
    for key in ("params", "weight_bytes", "kv_bytes_per_token", "kv_bytes", "total_bytes"):
        assert key in e
    assert e["total_bytes"] == e["weight_bytes"] + e["kv_bytes"] + e["activation_bytes"]
    assert e["kv_bytes"] == 819_200 * 4096


def test_fits_and_max_batch_are_consistent():
    for name in ("opt-13b", "llama-2-7b", "mistral-7b"):
        b = mem.max_batch(name, "a100-40gb", context=2048)
        assert b >= 1
        assert mem.fits(name, "a100-40gb", context=2048, batch=b)["fits"]
        assert not mem.fits(name, "a100-40gb", context=2048, batch=b + 1)["fits"]
    assert mem.max_batch("llama-2-70b", "a100-40gb", context=2048) == 0
    assert mem.max_batch("llama-2-70b", "a100-80gb", context=2048, num_gpus=2) >= 1


def test_fits_reserve():
    """A100-40GB: 40,960 MiB = 42,949,672,960 bytes; 75 % of it is 32,212,254,720."""
    r = mem.fits("llama-2-7b", "a100-40gb", reserve_fraction=0.25)
    assert r["usable_bytes"] == 32_212_254_720 and r["gpu_memory_bytes"] == 42_949_672_960


@pytest.mark.parametrize("kwargs,match", [
    (dict(context=0), "context"), (dict(context=5000), "1..4096"), (dict(batch=-1), "batch"),
    (dict(dtype="fp12"), "fp12"), (dict(kv_dtype="int2"), "int2"),
])
def test_impossible_inputs_say_what_is_allowed(kwargs, match):
    with pytest.raises((ValueError, KeyError), match=match):
        mem.inference_memory("llama-2-13b", **kwargs)


def test_bad_reserve_and_recipe():
    with pytest.raises(ValueError, match="reserve_fraction"):
        mem.fits("llama-2-7b", "h100", reserve_fraction=1.5)
    with pytest.raises(KeyError, match="adamw-mixed"):
        mem.training_memory("llama-2-7b", recipe="lion")


def test_every_preset_computes():
    for name in model_names():
        e = mem.inference_memory(name, context=min(1024, get_model(name).max_positions or 1024))
        assert e.total_bytes > e.weight_bytes > 0


def test_dtype_spelling_does_not_change_the_estimate():
    """``dtype_bytes`` accepts any case and spacing, so the defaults must too: "FP32" weights
    keep an fp32 KV cache (2·32·32·128·4 = 1,048,576 B/token) and fp32 activations."""
    lower = mem.inference_memory("llama-2-7b", "fp32", context=16).to_dict()
    upper = mem.inference_memory("llama-2-7b", "FP32", context=16).to_dict()
    assert upper["kv_bytes_per_token"] == 1_048_576
    assert {k: v for k, v in upper.items() if k != "dtype"} == \
        {k: v for k, v in lower.items() if k != "dtype"}
    assert step.decode_step_bytes("gpt2", 1, 8, "FP16") == \
        step.decode_step_bytes("gpt2", 1, 8, "fp16")


def test_weight_bytes_ignores_spelling():
    """" INT4" is int4: group scales counted, embeddings kept in bf16."""
    assert mem.weight_bytes("llama-2-7b", " INT4") == mem.weight_bytes("llama-2-7b", "int4")


def test_kv_budget_counts_replicated_kv_heads_across_gpus():
    """With fewer KV heads than GPUs each GPU holds a whole head (vLLM replicates them): falcon-7b
    (1 KV head) on 2 GPUs stores every token's KV twice, so half the pooled tokens fit; a model
    whose heads split evenly keeps the pooled count."""
    from llminfra.calc.memory import kv_budget
    from llminfra.specs import get_model
    assert get_model("falcon-7b").num_kv_heads == 1
    two = kv_budget("falcon-7b", "a100-40gb", num_gpus=2)
    assert two.kv_budget_tokens == two.kv_budget_bytes // (2 * two.kv_bytes_per_token)
    even = kv_budget("llama-2-13b", "a100-40gb", num_gpus=2)
    assert get_model("llama-2-13b").num_kv_heads % 2 == 0
    assert even.kv_budget_tokens == even.kv_budget_bytes // even.kv_bytes_per_token
