"""Tests for llminfra.plots.memory: the figures draw what they are given, in the unit asked."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from llminfra.plots.memory import intensity_vs_batch, stacked_memory_bars  # noqa: E402


def test_stacked_bars_heights_in_the_unit_asked():
    """Two bars: 3 GB + 1 GB and 2 GB; in GiB the first bar's top is 4e9 / 2**30 = 3.725."""
    bars = {"a": {"weights": 3e9, "activations": 1e9, "total": 4e9}, "b": {"weights": 2e9}}
    fig, ax = plt.subplots()
    stacked_memory_bars(bars, unit="GiB", ax=ax, limit_bytes=80e9)
    tops = sorted(p.get_y() + p.get_height() for p in ax.patches)
    assert tops == pytest.approx(sorted([3e9 / 2**30, 4e9 / 2**30, 2e9 / 2**30, 2e9 / 2**30]))
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"weights", "activations", "GPU memory"}
    assert ax.get_ylabel() == "memory (GiB)"
    plt.close(fig)


def test_stacked_bars_horizontal_and_bad_unit():
    fig, ax = plt.subplots()
    stacked_memory_bars({"x": {"weights": 5e8}}, unit="MB", ax=ax, horizontal=True)
    assert ax.patches[0].get_width() == pytest.approx(500)
    with pytest.raises(ValueError, match="GB, GiB"):
        stacked_memory_bars({"x": {"weights": 1}}, unit="TB", ax=ax)
    plt.close(fig)


def test_intensity_plot_lines_and_length_check():
    fig, ax = plt.subplots()
    intensity_vs_batch([1, 2, 4], [1.0, 1.9, 3.5], {"h100": 295.0}, ax=ax)
    assert len(ax.get_lines()) == 2 and ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="3 batches but 2"):
        intensity_vs_batch([1, 2, 4], [1.0, 2.0], {}, ax=ax)
    plt.close(fig)


def test_roofline_legend_writes_bandwidth_in_tb_s_from_1_tb_s():
    """Issue 24: "3.35e+03 GB/s" for 3.35 TB/s; the legend now reads 3.35 TB/s (864 GB/s below)."""
    from matplotlib.figure import Figure

    from llminfra.calc.roofline import Roofline
    from llminfra.plots.roofline import plot_roofline
    ax = Figure().add_subplot()
    plot_roofline([Roofline("h100", 989e12, 3.35e12), Roofline("l40s", 362e12, 864e9)], [], ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else [
        line.get_label() for line in ax.get_lines()]
    assert any("h100: 3.35 TB/s" in s for s in labels), labels
    assert any("l40s: 864 GB/s" in s for s in labels), labels
