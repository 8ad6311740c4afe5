"""Chapter 02's calculator: "window only" on a model without a sliding window says so in the
summary, instead of changing nothing silently (issue 42, the learner's path)."""

from llminfra.specs.models import get_model, model_names
from llminfra.widgets.memory_calculator import MemoryCalculator, memory_breakdown, summary_text


def test_window_only_on_a_model_without_a_window_is_told():
    calc = MemoryCalculator(model="llama-2-13b", gpu="a100-40gb")
    assert get_model("llama-2-13b").sliding_window is None
    before = calc.data["kv_bytes"]
    assert "changes nothing" not in calc.text
    calc.controls["sliding_window"].value = True
    assert calc.data["kv_bytes"] == before                # nothing to drop …
    assert "'window only' changes nothing here: llama-2-13b has no sliding window" in calc.text
    assert "changes nothing" in calc.summary.value        # … and the widget says so
    calc.controls["sliding_window"].value = False
    assert "changes nothing" not in calc.text


def test_window_only_on_a_model_with_a_window_keeps_w_tokens_and_no_such_note():
    windowed = [n for n in model_names() if get_model(n).sliding_window]
    assert windowed, "no preset with a sliding window"
    name = windowed[0]
    w = get_model(name).sliding_window
    d = memory_breakdown(name, "h100", context=2 * w, sliding_window=True)
    assert d["kv_tokens_per_sequence"] == w and d["kv_bytes"] < d["kv_bytes_full_attention"]
    text = summary_text(d)
    assert f"sliding window {w:,}" in text and "changes nothing" not in text
