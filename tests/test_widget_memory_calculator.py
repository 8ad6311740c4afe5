"""The memory-calculator widget, driven from Python: set a control, the summary, the verdict,
the largest batch and the picture change, and every number equals llminfra.calc.memory's."""

import pytest

from llminfra.calc.memory import fits, gb, gib, kv_bytes, max_batch, weight_bytes
from llminfra.widgets.memory_calculator import (MemoryCalculator, memory_breakdown,
                                                summary_html, summary_text)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def calc():
    return MemoryCalculator(model="llama-2-13b", gpu="a100-40gb", dtype="bf16",
                            kv_dtype="bf16", context=2048, batch=1)


def test_breakdown_matches_the_memory_model():
    """OPT-13B fp16 on an A100-40GB at 2048 tokens (vLLM paper Fig. 1 setting):
    weights 12,853,473,280 · 2 = 25,706,946,560 B; KV 2·40·5120·2·2048 = 1,677,721,600 B;
    card 40,960 MiB = 42,949,672,960 B; usable int(0.9 · that) = 38,654,705,664 B."""
    d = memory_breakdown("opt-13b", "a100-40gb", dtype="fp16", context=2048, batch=1)
    assert d["weight_bytes"] == 25_706_946_560 == weight_bytes("opt-13b", "fp16")
    assert d["kv_bytes"] == 1_677_721_600 == kv_bytes("opt-13b", 2048, 1, "fp16")
    assert d["usable_bytes"] == 38_654_705_664
    assert d["reserve_bytes"] == 42_949_672_960 - 38_654_705_664
    assert d["free_bytes"] == d["usable_bytes"] - d["total_bytes"]
    ref = fits("opt-13b", "a100-40gb", dtype="fp16", context=2048, batch=1)
    assert {k: d[k] for k in ref} == ref
    assert d["max_batch"] == max_batch("opt-13b", "a100-40gb", context=2048, dtype="fp16")
    assert d["gpu_confidence"] == "datasheet"


def test_initial_state_and_summary(calc):
    d = calc.data
    assert d["model"] == "llama-2-13b" and d["batch"] == 1 and d["fits"]
    assert bytes(calc.image.value).startswith(PNG_MAGIC)
    assert "FITS" in calc.text and "DOES NOT FIT" not in calc.text
    assert "[datasheet]" in calc.text  # GPU confidence shown with the GPU
    assert f"{gb(d['weight_bytes']):.4g} GB = {gib(d['weight_bytes']):.4g} GiB" in calc.text
    assert calc.summary.value == summary_html(d)
    assert calc.text == summary_text(d)


def test_batch_beyond_max_does_not_fit(calc):
    """Moving the batch one past the largest batch that fits flips the verdict."""
    limit = calc.data["max_batch"]
    assert limit == max_batch("llama-2-13b", "a100-40gb", context=2048)
    png_before, html_before = calc.image.value, calc.summary.value
    calc.controls["batch"].value = limit
    assert calc.data["fits"]
    calc.controls["batch"].value = limit + 1
    assert not calc.data["fits"] and "DOES NOT FIT" in calc.text
    assert calc.data["kv_bytes"] == kv_bytes("llama-2-13b", 2048, limit + 1)
    assert bytes(calc.image.value) != bytes(png_before) and calc.summary.value != html_before


def test_kv_dtype_context_and_gpu_change_the_numbers(calc):
    calc.controls["kv_dtype"].value = "fp8"
    assert calc.data["kv_bytes"] == kv_bytes("llama-2-13b", 2048, 1, "fp8")
    calc.controls["context"].value = 4096
    assert calc.data["kv_bytes"] == kv_bytes("llama-2-13b", 4096, 1, "fp8")
    assert calc.data["max_batch"] == max_batch("llama-2-13b", "a100-40gb", 4096, kv_dtype="fp8")
    calc.controls["gpu"].value = "h200"
    assert calc.data["gpu_memory_bytes"] == 143_771 * 2**20   # nvidia-smi's H200 total
    assert calc.data["max_batch"] == max_batch("llama-2-13b", "h200", 4096, kv_dtype="fp8")
    calc.controls["dtype"].value = "int4"
    assert calc.data["weight_bytes"] == weight_bytes("llama-2-13b", "int4")


def test_model_change_clamps_context_to_the_window(calc):
    """OPT-13B's window is 2048 tokens: a 4096 context is clamped, the slider's max follows."""
    calc.controls["context"].value = 4096
    calc.controls["model"].value = "opt-13b"
    assert calc.controls["context"].max == 2048
    assert calc.controls["context"].value == 2048 == calc.data["context"]
    calc.controls["model"].value = "llama-2-70b"
    assert calc.controls["context"].max == 4096
    assert calc.data["max_batch"] == 0 and not calc.data["fits"]  # 138 GB of weights > 36 GB


def test_gqa_model_has_smaller_kv_than_mha(calc):
    """Llama-2-70B (GQA, 8 KV heads): 2·80·8·128·2 = 327,680 B/token, less than
    Llama-2-13B (MHA): 2·40·40·128·2 = 819,200 B/token."""
    mha = calc.data["kv_bytes_per_token"]
    calc.controls["model"].value = "llama-2-70b"
    assert (mha, calc.data["kv_bytes_per_token"]) == (819_200, 327_680)


def test_figure_is_rendered_off_screen_and_not_left_open(calc):
    """The widget's PNG comes from a bare Agg figure: pyplot keeps no figure open."""
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    calc.controls["batch"].value = 3
    assert plt.get_fignums() == before


def test_unknown_names_raise_with_the_allowed_list():
    with pytest.raises(KeyError, match="known models"):
        MemoryCalculator(model="llama-9")
    with pytest.raises(KeyError, match="known GPUs"):
        memory_breakdown("llama-2-7b", "a100-41gb")
