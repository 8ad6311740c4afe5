"""The deployment advisor, driven from Python: set a control, the ranking and the table change,
and every number equals llminfra.calc.cost / llminfra.calc.deployment's."""

import pytest

from llminfra.calc.cost import api_monthly_cost
from llminfra.calc.deployment import Prices, Requirements, rank_deployments
from llminfra.widgets.deployment_advisor import (DeploymentAdvisor, advice_html, advice_lines,
                                                 advise)

#: test inputs, not market prices
PRICES = Prices(api_usd_per_million=5.4, rent_usd_per_gpu_hour=2.0, own_usd_per_gpu_hour=1.2,
                tokens_per_s_per_gpu=1000)


@pytest.fixture
def panel():
    return DeploymentAdvisor(PRICES, api_prices_per_million=(3, 15))


def test_advise_matches_the_cost_model():
    """1,000 requests/day of 2,000 + 500 tokens: 75 M tokens a month; blended 3 / 15 USD:
    5.4 USD per million, API 405 USD = api_monthly_cost(...).monthly_cost."""
    d = advise(PRICES, 1000, 2000, 500, api_prices_per_million=(3, 15))
    assert d["monthly_tokens"] == 75e6
    assert d["api_usd_per_million"] == pytest.approx(5.4)
    api = next(r for r in d["ranking"] if r.option == "api")
    assert api.monthly_cost_usd == pytest.approx(api_monthly_cost(1000, 2000, 500, 3, 15).monthly_cost)
    assert [r.option for r in d["ranking"]] == [
        r.option for r in rank_deployments(Requirements(75e6), PRICES)]


def test_initial_panel_ranks_the_api_first(panel):
    assert panel.data["ranking"][0].option == "api"
    assert panel.text.splitlines()[1].startswith("1. hosted API: 405 USD/month")
    assert panel.summary.value == advice_html(panel.data)
    assert panel.text == "\n".join(advice_lines(panel.data))


def test_moving_controls_changes_the_ranking(panel):
    """100,000 requests a day (7,500 M tokens) with a GPU team: own servers first;
    7,500e6 / (1,000 · 0.5 · 2,592,000) = 5.8 -> 6 GPUs, 6 · 1.2 · 720 = 5,184 USD."""
    html_before = panel.summary.value
    panel.controls["requests_per_day"].value = 1e5
    panel.controls["has_gpu_team"].value = True
    first = panel.data["ranking"][0]
    assert (first.option, first.n_gpus) == ("own", 6)
    assert first.monthly_cost_usd == pytest.approx(5184)
    assert panel.summary.value != html_before and "<b>own servers</b>" in panel.summary.value
    panel.controls["data_may_leave"].value = False
    api = next(r for r in panel.data["ranking"] if r.option == "api")
    assert not api.feasible and "data may not leave" in panel.text
    panel.controls["output_tokens"].value = 2000   # mix moves toward output: dearer API
    assert panel.data["api_usd_per_million"] == pytest.approx((2000 * 3 + 2000 * 15) / 4000)
    panel.controls["single_user"].value = True
    assert panel.data["ranking"][0].option == "local"


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="prices must be"):
        DeploymentAdvisor({"api": 5.4})
    with pytest.raises(ValueError, match="requests_per_day must be >= 0"):
        advise(PRICES, -1, 2000, 500)


def test_large_token_counts_read_as_numbers_not_exponents():
    """Issue 24: the advisor showed "4.302e+04 M tokens"; thousands of millions now have commas."""
    from llminfra.widgets.deployment_advisor import millions
    assert millions(43_020e6) == "43,020"
    assert millions(75e6) == "75" and millions(2.25e6) == "2.25" and millions(999.4e6) == "999.4"


def test_the_volume_slider_stops_only_on_round_numbers(panel):
    """Issue 53: the log slider's quarter steps landed on 177,828 requests a day; every stop is
    now 1, 2 or 5 times a power of ten, and its readout is the number with commas."""
    slider = panel.controls["requests_per_day"]
    for label, value in slider.options:
        assert int(str(value).rstrip("0") or "0") in (1, 2, 5), value
        assert label == f"{value:,}"
    slider.value = 200_000
    assert panel.data["monthly_tokens"] == 200_000 * 2_500 * 30
    with pytest.raises(ValueError, match="round stops"):
        DeploymentAdvisor(PRICES, requests_per_day=177_828)


def test_the_checkbox_labels_are_not_cut(panel):
    """Issue 53: "needs an open-weights mo…": a checkbox's label was cut to the default box
    width (its indent took a description's width); it now sizes to its label."""
    for name in ("data_may_leave", "needs_open_weights", "has_gpu_team", "single_user"):
        box = panel.controls[name]
        assert box.indent is False and box.layout.width == "auto", name
