"""Chapter 05's latency–throughput figure on a scale of round numbers (``xticks="round"``):
however close the live run's load levels land in throughput, the x axis keeps four or more
labelled ticks, evenly spaced, around every point — and still reads well (the checks of
``test_plots_read_well``)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from test_plots_read_well import assert_reads_well, notebook_figure  # noqa: E402

from llminfra.plots.serving import plot_latency_throughput  # noqa: E402


def _points(tokens_per_s):
    return [{"concurrency": c, "output_tokens_per_s": x, "tpot_s": {"p50": 0.002 * (1 + i)},
             "ttft_s": {"p50": 0.008 * (1 + i) ** 2}}
            for i, (c, x) in enumerate(zip((1, 4, 16), tokens_per_s))]


def _shown_ticks(ax) -> list[tuple[float, str]]:
    lo, hi = ax.get_xlim()
    return [(v, t.get_text()) for v, t in zip(ax.get_xticks(), ax.get_xticklabels())
            if lo <= v <= hi]


@pytest.mark.parametrize("tokens_per_s", [(783, 2169, 3358), (410, 450, 2197), (100, 102, 104),
                                          (2000, 2001, 2003)])
def test_round_ticks_stay_readable(monkeypatch, tokens_per_s):
    fig, (ax1, ax2) = notebook_figure(9, 3.4, ncols=2)
    plot_latency_throughput(_points(tokens_per_s), ax1, "tpot_s", xticks="round")
    plot_latency_throughput(_points(tokens_per_s), ax2, "ttft_s", xticks="round")
    fig.suptitle("tiny model on this CPU over HTTP: one point per number of clients (a live run)",
                 fontsize=10)
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)         # draws the figure: the tick labels are set
    for ax in (ax1, ax2):
        ticks = _shown_ticks(ax)
        values = [v for v, _ in ticks]
        assert len(ticks) >= 4 and all(text for _, text in ticks), ticks
        assert np.allclose(np.diff(values), values[1] - values[0]), values     # evenly spaced
        step = values[1] - values[0]
        assert values[0] - step <= min(tokens_per_s) and max(tokens_per_s) <= values[-1] + step
        assert all(float(text.replace(",", "")) == v for v, text in ticks), ticks


def test_measured_ticks_are_the_default():
    ax = plot_latency_throughput(_points((410, 450, 2197)), Figure().add_subplot())
    assert list(ax.get_xticks()) == [410, 450, 2197]


def test_unknown_tick_style_is_refused():
    with pytest.raises(ValueError, match="'nice'.*measured, round"):
        plot_latency_throughput(_points((1, 2, 3)), Figure().add_subplot(), xticks="nice")
