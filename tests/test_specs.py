"""The facts tables: every preset the course names (README, chapters) is there, with its fields and source."""

import json
from pathlib import Path

import pytest
import torch

from llminfra.specs import FORMATS, get_format, get_gpu, get_model, gpu_names, model_names
from llminfra.specs.formats import dtype_bytes

DESIGN_MODELS = ["llama-7b", "llama-13b", "llama-33b", "llama-65b", "llama-2-7b", "llama-2-13b",
                 "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b", "mixtral-8x7b",
                 "falcon-7b", "falcon-40b", "starcoder", "gpt2", "gpt2-medium", "gpt2-large",
                 "gpt2-xl", "opt-13b", "qwen2.5-7b", "megatron-8.3b"]
DESIGN_GPUS = ["a100-40gb", "a100-80gb", "a100-80gb-pcie", "h100", "h100-pcie", "h200", "l40s",
               "mi300x", "rtx-4090", "rtx-3090"]
DATA = Path(__file__).resolve().parents[1] / "llminfra" / "specs"


def test_every_design_model_is_a_preset():
    assert set(DESIGN_MODELS) <= set(model_names())
    assert get_model("octocoder") == get_model("starcoder")
    assert get_model("Llama-2-7B").name == "llama-2-7b"


def test_every_datasheet_row_is_in_the_catalog():
    rows = json.loads((DATA / "gpu_datasheets.json").read_text())["gpus"]
    assert set(DESIGN_GPUS) <= set(gpu_names())
    assert {get_gpu(n).display_name for n in gpu_names()} == {r["name"] for r in rows}


@pytest.mark.parametrize("name,kind", [("llama-2-7b", "MHA"), ("llama-2-70b", "GQA"),
                                       ("falcon-7b", "MQA"), ("starcoder", "MQA"),
                                       ("falcon-40b", "GQA"), ("qwen2.5-7b", "GQA")])
def test_attention_kind(name, kind):
    assert get_model(name).attention == kind


def test_architecture_fields():
    assert get_model("gpt2").positions == "learned" and get_model("gpt2").tied_embeddings
    assert get_model("llama-3-8b").mlp == "gated" and not get_model("llama-3-8b").tied_embeddings
    assert get_model("qwen2.5-7b").qkv_bias and not get_model("llama-2-7b").qkv_bias
    assert get_model("opt-13b").linear_bias
    m = get_model("mixtral-8x7b")
    assert m.is_moe and (m.num_experts, m.experts_per_token) == (8, 2)
    for name in model_names():
        assert get_model(name).sources, f"{name} has no source"


def test_unknown_names_list_what_is_allowed():
    with pytest.raises(KeyError, match="llama-2-7b"):
        get_model("llama-9b")
    with pytest.raises(KeyError, match="h100"):
        get_gpu("h1000")
    with pytest.raises(KeyError, match="bf16"):
        dtype_bytes("fp12")


def test_dense_and_sparse_kept_apart():
    """H100 SXM bf16: 989.4 dense, 1979 with 2:4 sparsity (datasheet); sparse = 2 × dense."""
    h100 = get_gpu("h100")
    assert h100.tflops("bf16") == pytest.approx(989.4)
    assert h100.tflops("bf16", sparse=True) == pytest.approx(1979)
    for name in gpu_names():
        g = get_gpu(name)
        for dtype, row in g.peak_tflops.items():
            if row["dense"] and row["sparse"]:
                assert row["sparse"] == pytest.approx(2 * row["dense"], rel=0.02), (name, dtype)
        assert g.confidence and g.source


def test_rtx_4090_quotes_fp32_accumulate():
    g = get_gpu("rtx-4090")
    assert g.tflops("fp16") == pytest.approx(165.2)
    assert any("fp16 accumulation" in n for n in g.notes)


def test_gpu_memory_and_bandwidth_units():
    """A100 40GB: the vendor's 40 GB are 40 GiB = 42,949,672,960 bytes, and nvidia-smi reports
    40,960 MiB = the same; 1555 GB/s = 1.555e12 bytes/s (bandwidth GB are decimal). H100 SXM:
    nominal 80 GiB = 85,899,345,920, driver total 81,559 MiB = 85,520,809,984 (79.65 GiB), which
    is the figure used."""
    g = get_gpu("a100-40gb")
    assert g.memory_bytes == g.nominal_memory_bytes == 42_949_672_960
    assert g.hbm_bytes_per_s == 1.555e12
    h = get_gpu("h100")
    assert h.nominal_memory_bytes == 85_899_345_920
    assert h.memory_bytes == h.driver_memory_bytes == 85_520_809_984
    assert "81,559 MiB" in h.memory_source


def test_every_gpu_memory_has_a_source():
    """One rule: the driver total where on record (never above nominal by more than rounding:
    H200 NVL's 141 is a rounded figure), else the nominal GiB."""
    from llminfra.specs import gpu_names
    for name in gpu_names():
        g = get_gpu(name)
        assert g.memory_bytes == (g.driver_memory_bytes or g.nominal_memory_bytes)
        assert g.memory_bytes <= g.nominal_memory_bytes * 1.01, name
        assert g.memory_source and g.memory_unit == "GiB"


@pytest.mark.parametrize("name,torch_dtype", [("fp32", torch.float32), ("fp16", torch.float16),
                                              ("bf16", torch.bfloat16),
                                              ("fp8-e4m3", torch.float8_e4m3fn),
                                              ("fp8-e5m2", torch.float8_e5m2)])
def test_float_formats_match_torch_finfo(name, torch_dtype):
    """Ranges come from the bit layout; torch's finfo is the independent check.
    fp16: max = (2 - 2**-10) · 2**15 = 65504, min normal 2**-14, eps 2**-10."""
    f, fi = get_format(name), torch.finfo(torch_dtype)
    assert f.max == fi.max and f.min_normal == fi.tiny and f.eps == fi.eps
    assert f.sign_bits + f.exponent_bits + f.mantissa_bits == f.bits


def test_integer_formats():
    assert (get_format("int8").min, get_format("int8").max) == (-128, 127)
    assert (get_format("int4").min, get_format("int4").max) == (-8, 7)
    assert FORMATS["int4"].bytes == 0.5


def test_to_dict_hands_out_a_copy_of_the_cached_catalog():
    """Changing a returned dict must not change what the next caller reads."""
    d = get_gpu("h100").to_dict()
    d["peak_tflops"]["bf16"]["dense"] = 0.0
    assert get_gpu("h100").tflops("bf16") == pytest.approx(989.4)
    assert get_gpu("h100").tflops("fp16") == pytest.approx(989.4)


# ---- hardening (issue 13) -------------------------------------------------------------------
@pytest.mark.parametrize("field,bad", [("num_layers", 0), ("num_layers", 2.5),
                                       ("hidden_size", -4096), ("num_heads", 0),
                                       ("num_kv_heads", -1), ("intermediate_size", 0),
                                       ("vocab_size", 0), ("max_positions", 0),
                                       ("num_experts", 0), ("experts_per_token", 3)])
def test_model_spec_refuses_impossible_sizes(field, bad):
    """n_layers = 0 was accepted (and a negative hidden size gave a negative head_dim); the
    calculators then printed figures for a model that cannot exist."""
    import dataclasses
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(get_model("mistral-7b"), **{field: bad})
