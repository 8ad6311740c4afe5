"""Chapter 09's figures draw the cost model's numbers."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from llminfra.calc.cost import selfhost_cost_per_million_tokens  # noqa: E402
from llminfra.calc.deployment import Prices, monthly_cost_curves  # noqa: E402
from llminfra.plots.cost import cost_per_million_vs_utilization, monthly_cost_vs_volume  # noqa: E402

PRICES = Prices(5.4, 2.0, 1.2, 1000)


def test_curves_by_hand():
    """75e6 and 5e9 tokens, u = 0.8: api 405 and 27,000 USD; 1 and 3 GPUs: rented 1,440 and
    4,320, own 864 and 2,592."""
    c = monthly_cost_curves([75e6, 5e9], PRICES, 0.8)
    assert c["api"] == pytest.approx([405, 27_000])
    assert c["rented"] == pytest.approx([1440, 4320])
    assert c["own"] == pytest.approx([864, 2592])


def test_volume_figure_marks_the_given_volumes():
    fig, ax = plt.subplots()
    vols = [1e6, 75e6, 1e9, 1e10]
    monthly_cost_vs_volume(vols, PRICES, 0.5, ax=ax)
    assert list(ax.get_xticks()) == pytest.approx([1, 75, 1000, 10_000])
    assert "USD per month" in ax.get_ylabel() and "million tokens" in ax.get_xlabel()
    dots = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
    assert list(dots[0].get_ydata()) == pytest.approx([5.4, 405, 5400, 54_000])
    # break-even line: 1,440 USD / 5.4 USD per M = 266.7 M tokens
    assert any(list(ln.get_xdata()) == pytest.approx([1440 / 5.4] * 2) for ln in ax.get_lines())
    with pytest.raises(ValueError, match="not all equal"):
        monthly_cost_vs_volume([1e6, 1e6], PRICES, 0.5, ax=ax)
    plt.close(fig)


def test_utilization_figure():
    fig, ax = plt.subplots()
    us = [0.1, 0.5, 1.0]
    cost_per_million_vs_utilization(2.0, 1000, us, api_usd_per_million=5.4, ax=ax)
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == pytest.approx([10, 50, 100])
    assert list(line.get_ydata()) == pytest.approx(
        [selfhost_cost_per_million_tokens(2.0, 1000, u) for u in us])
    assert ax.get_lines()[1].get_ydata()[0] == 5.4
    plt.close(fig)
