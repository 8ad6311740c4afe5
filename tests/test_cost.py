"""The cost model (llminfra.calc.cost), worked by hand."""

import math
import random

import pytest

from llminfra.calc.cost import (api_monthly_cost, blended_price_per_million,
                                break_even_tokens_per_month, gpu_board_power_w,
                                gpu_rental_monthly_cost, months_to_pay_back,
                                own_server_monthly_cost, power_monthly_cost,
                                selfhost_cost_per_million_tokens, selfhost_monthly_tokens)


def test_api_bill_of_source_000_by_hand():
    """Source 000: 1,000 requests a day, 2,000 input and 500 output tokens each, 30 days:
    2,000,000 input and 500,000 output tokens a day; 60,000,000 and 15,000,000 a month.
    At 3 / 15 USD per million: 180 + 225 = 405 USD; per request (6,000 + 7,500) / 1e6 =
    0.0135 USD."""
    r = api_monthly_cost(1000, 2000, 500, 3, 15)
    assert r.monthly_input_tokens == 60_000_000
    assert r.monthly_output_tokens == 15_000_000
    assert r.monthly_input_cost == pytest.approx(180)
    assert r.monthly_output_cost == pytest.approx(225)
    assert r.monthly_cost == pytest.approx(405)
    assert r.cost_per_request == pytest.approx(0.0135)
    assert r.to_dict()["monthly_cost"] == pytest.approx(405)


def test_api_bill_scales_with_days_and_is_additive():
    """7 days instead of 30: 7/30 of the bill; input and output add up to the total.
    Random volumes (seed printed) keep the rule from holding only at one point."""
    seed = random.randrange(2**32)
    print(f"random seed: {seed}")
    rng = random.Random(seed)
    n, i, o = rng.randint(1, 10**5), rng.randint(0, 10**4), rng.randint(0, 10**4)
    p_in, p_out = rng.uniform(0, 20), rng.uniform(0, 80)
    month, week = api_monthly_cost(n, i, o, p_in, p_out), api_monthly_cost(n, i, o, p_in, p_out, 7)
    assert week.monthly_cost == pytest.approx(month.monthly_cost * 7 / 30)
    assert month.monthly_cost == pytest.approx(month.monthly_input_cost + month.monthly_output_cost)
    assert month.monthly_cost == pytest.approx(n * 30 * month.cost_per_request)


def test_blended_price_by_hand():
    """2,000 in / 500 out at 3 / 15 USD: (6,000 + 7,500) / 2,500 = 5.4 USD per million; the
    API bill of 75 M tokens at that price is again 405 USD."""
    p = blended_price_per_million(2000, 500, 3, 15)
    assert p == pytest.approx(5.4)
    assert 75 * p == pytest.approx(api_monthly_cost(1000, 2000, 500, 3, 15).monthly_cost)
    with pytest.raises(ValueError, match="input_tokens \\+ output_tokens"):
        blended_price_per_million(0, 0, 3, 15)


def test_selfhost_cost_per_million_by_hand():
    """2 USD/h, 1,000 tokens/s: 3.6 M tokens an hour, 2 / 3.6 = 0.5556 USD per million.
    Busy a quarter of the time: 4x, 2.222 USD. Twice the throughput: half the cost (source
    000). 8 GPUs at 2 USD/h serving 8,000 tokens/s together: the same 0.5556."""
    assert selfhost_cost_per_million_tokens(2, 1000) == pytest.approx(0.5556, abs=1e-4)
    assert selfhost_cost_per_million_tokens(2, 1000, 0.25) == pytest.approx(2.2222, abs=1e-4)
    assert selfhost_cost_per_million_tokens(2, 2000) == pytest.approx(
        selfhost_cost_per_million_tokens(2, 1000) / 2)
    assert selfhost_cost_per_million_tokens(2, 8000, n_gpus=8) == pytest.approx(0.5556, abs=1e-4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(gpu_hour_price_usd=-1, tokens_per_s=1000), "gpu_hour_price_usd must be >= 0"),
    (dict(gpu_hour_price_usd=2, tokens_per_s=0), "tokens_per_s must be > 0"),
    (dict(gpu_hour_price_usd=2, tokens_per_s=1000, utilization=0), "utilization must be in"),
    (dict(gpu_hour_price_usd=2, tokens_per_s=1000, utilization=1.5), "utilization must be in"),
    (dict(gpu_hour_price_usd=2, tokens_per_s=float("nan")), "tokens_per_s must be finite"),
    (dict(gpu_hour_price_usd="two", tokens_per_s=1000), "gpu_hour_price_usd must be a number"),
    (dict(gpu_hour_price_usd=2, tokens_per_s=1000, n_gpus=0), "n_gpus must be > 0"),
])
def test_selfhost_bad_numbers_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        selfhost_cost_per_million_tokens(**kwargs)


def test_api_bad_numbers_are_named():
    with pytest.raises(ValueError, match="requests_per_day must be >= 0"):
        api_monthly_cost(-1, 2000, 500, 3, 15)
    with pytest.raises(ValueError, match="days must be > 0"):
        api_monthly_cost(1000, 2000, 500, 3, 15, days=0)
    with pytest.raises(ValueError, match="output_price_per_million must be a number"):
        api_monthly_cost(1000, 2000, 500, 3, None)


def test_monthly_tokens_rental_and_break_even_by_hand():
    """1,000 tokens/s at u = 0.5 for 30 days: 1,000 · 0.5 · 2,592,000 = 1.296e9 tokens.
    One GPU at 2 USD/h all month: 1,440 USD; against 5.4 USD per M tokens the API costs the
    same at 1,440 / 5.4 = 266.67 M tokens a month. At that volume the self-hosted cost per
    million (1,440 USD / 266.67 M) equals the API price."""
    assert selfhost_monthly_tokens(1000, 0.5) == pytest.approx(1.296e9)
    assert gpu_rental_monthly_cost(2) == pytest.approx(1440)
    assert gpu_rental_monthly_cost(2, n_gpus=8, days=31) == pytest.approx(8 * 2 * 24 * 31)
    v = break_even_tokens_per_month(1440, 5.4)
    assert v == pytest.approx(266.667e6, rel=1e-5)
    # consistency: at the break-even volume one GPU runs at u = v / capacity
    u = v / selfhost_monthly_tokens(1000, 1.0)
    assert selfhost_cost_per_million_tokens(2, 1000, u) == pytest.approx(5.4)
    with pytest.raises(ValueError, match="api_price_per_million must be > 0"):
        break_even_tokens_per_month(1440, 0)


def test_power_and_ownership_by_hand():
    """Eight H100 at 700 W (catalog), PUE 1.5, 0.10 USD/kWh, 30 days: 5.6 kW · 1.5 · 720 h ·
    0.10 = 604.8 USD. A 200,000 USD server over 36 months (5,555.6) + 10.2 kW at the same
    PUE and price (1,101.6) = 6,657.2 USD a month, 1.156 USD per GPU hour over 8 GPUs.
    Renting 8 at 2.69 USD/h costs 15,494.4 a month: buying pays back in 200,000 / (15,494.4 −
    1,101.6) = 13.90 months."""
    assert gpu_board_power_w("h100") == 700
    assert gpu_board_power_w("h100-pcie") == 350      # "300-350": the largest
    assert gpu_board_power_w("h200") == 700           # "up to 700"
    assert power_monthly_cost(8 * gpu_board_power_w("h100"), 1.5, 0.10) == pytest.approx(604.8)
    own = own_server_monthly_cost(200_000, 36, 10_200, 1.5, 0.10, n_gpus=8)
    assert own.amortization == pytest.approx(5555.56, abs=0.01)
    assert own.power == pytest.approx(1101.6)
    assert own.monthly_cost == pytest.approx(6657.16, abs=0.01)
    assert own.gpu_hour_cost == pytest.approx(1.1558, abs=1e-4)
    rent = gpu_rental_monthly_cost(2.69, n_gpus=8)
    assert rent == pytest.approx(15_494.4)
    assert months_to_pay_back(200_000, rent, own.power) == pytest.approx(13.896, abs=1e-3)
    assert months_to_pay_back(200_000, 500, 600) == math.inf


def test_power_and_catalog_errors():
    with pytest.raises(ValueError, match="pue must be >= 1"):
        power_monthly_cost(700, 0.9, 0.1)
    with pytest.raises(ValueError, match="no board power"):
        gpu_board_power_w("m4-max")
    with pytest.raises(KeyError, match="unknown GPU"):
        gpu_board_power_w("voodoo2")
