"""The chapter 08 widget and roofline plot, driven from Python."""

import math

import pytest
from matplotlib.figure import Figure

from llminfra.calc.roofline import Roofline, decode_time_per_token_s
from llminfra.plots.roofline import plot_roofline, roofline_png
from llminfra.widgets.gpu_roofline import RooflineCalculator, serving_estimate

PNG_MAGIC = b"\x89PNG"


def test_estimate_by_hand():
    """Llama-2-7B bf16 on one H100, batch 1 at 2048 tokens: 14,550,573,056 B / 3.35e12 B/s =
    4.3435 ms; 230.2 tokens/s; at 2 USD/h 2 / (230.2 · 3600) · 1e6 = 2.413 USD per million."""
    d = serving_estimate("llama-2-7b", "h100", context=2048, concurrency=1)
    assert d["decode"]["bytes"] == 14_550_573_056
    assert math.isclose(d["tpot_ms"], 14_550_573_056 / 3.35e12 * 1e3, rel_tol=1e-12)
    assert d["tpot_ms"] / 1e3 == decode_time_per_token_s("llama-2-7b", "h100", 1, 2048)
    assert math.isclose(d["usd_per_million_tokens"], 2 / (d["tokens_per_s"] * 3600) * 1e6)
    assert round(d["usd_per_million_tokens"], 3) == 2.413
    assert d["fits"] and d["prefill"]["bound"] == "compute"


def test_widget_follows_its_controls():
    calc = RooflineCalculator()
    assert calc.data["fits"] and bytes(calc.image.value).startswith(PNG_MAGIC)
    one = calc.data["tokens_per_s"]
    calc.controls["concurrency"].value = 16
    assert calc.data["tokens_per_s"] > 5 * one   # weights shared; each sequence reads its KV
    calc.controls["concurrency"].value = calc.data["max_sequences"] + 1
    assert not calc.data["fits"] and "DOES NOT FIT" in calc.text
    calc.controls["model"].value = "llama-2-70b"
    calc.controls["concurrency"].value = 1
    assert not calc.data["fits"]                          # 138 GB of weights on one 80 GB card
    calc.controls["num_gpus"].value = 4
    assert calc.data["fits"] and calc.data["decode"]["comm_s"] > 0
    calc.controls["gpu_hour_price_usd"].value = 4.0
    assert calc.data["usd_per_million_tokens"] == pytest.approx(
        4 * 4 / (calc.data["tokens_per_s"] * 3600) * 1e6)


def test_widget_shows_refusals():
    calc = RooflineCalculator(model="opt-13b", context=2048)
    calc.controls["context"].value = 4096                 # past OPT-13B's 2048-token window
    assert calc.data is None and "2048" in calc.text and "not possible" in calc.summary.value


def test_plot_draws_roofs_and_points():
    roof = Roofline("cpu", 1e11, 1e10)
    ax = plot_roofline([roof], [{"label": "decode", "intensity": 1.0, "flops_per_s": 5e9}],
                       Figure().add_subplot())
    assert ax.get_xscale() == "log" and "FLOP" in ax.get_xlabel()
    y = ax.lines[0].get_ydata()
    assert y.max() == 1e11 and math.isclose(y.min(), ax.get_xlim()[0] * 1e10)
    assert roofline_png([roof], []).startswith(PNG_MAGIC)
    with pytest.raises(ValueError):
        plot_roofline([], [], Figure().add_subplot())
