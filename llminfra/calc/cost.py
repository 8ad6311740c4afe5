"""The cost model: a hosted API's monthly bill, self-hosted cost per token, break-even volume,
and the cost of owning servers (purchase, power, amortisation).

Prices are always inputs. Nothing here holds a "current" price: the examples the course uses
live in the notebook, each labelled with its date and source.

Rules, each worked by hand in ``tests/test_cost.py``:

* API bill: tokens priced apart per direction, in USD per million tokens (how providers quote):
  ``cost = N_req/day · days · (I · p_in + O · p_out) / 1e6``.
  Source 000's example: 1,000 requests a day of 2,000 input and 500 output tokens is
  60 M input and 15 M output tokens in 30 days.
* Self-hosted cost per million tokens: a GPU hour costs the same whether it works or idles, so
  with ``n`` GPUs at ``P`` USD per GPU hour serving ``T`` tokens/s at full load, busy a share
  ``u`` of the time: ``cost_per_M = n · P / (T · u · 3600) · 1e6``.
* Break-even: the monthly token volume at which a fixed monthly self-hosting cost ``F`` equals
  the API bill at a blended API price ``p`` (USD per million tokens): ``V = F / p · 1e6``.
* Owning: monthly cost = purchase / amortisation months + power + other operations, with power
  ``TDP · n · PUE · hours · price_per_kWh / 1000`` (PUE = facility power / IT power,
  The Green Grid, White Paper #49, 2012).

Taught in chapter 09.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from llminfra.specs.gpus import get_gpu

HOURS_PER_DAY = 24
#: the course's "month": 30 days (source 000 uses 30); pass ``days`` to change it
DAYS_PER_MONTH = 30


def _check(name: str, value, *, positive: bool = False, allow_zero: bool = True) -> float:
    """``value`` as a float; ``ValueError`` naming ``name`` if it is not a finite number that
    is ``>= 0`` (or ``> 0`` with ``positive=True``)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and x <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if x < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return x


def _check_count(name: str, value) -> float:
    """A whole number >= 1 (GPUs come whole: ``n_gpus = 0.5`` is refused), as a float."""
    x = _check(name, value, positive=True)
    if x < 1 or not x.is_integer():
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return x


def _result(what: str, x: float, **inputs) -> float:
    """``x`` if finite; else ``ValueError``: finite inputs whose result overflows (1e308
    requests a day, 5e-324 tokens/s) are beyond any deployment, and ``inf`` is no answer."""
    if not math.isfinite(x):
        given = ", ".join(f"{k}={v!r}" for k, v in inputs.items())
        raise ValueError(f"{what} overflows: it passes the largest float (about 1.8e308) for "
                         f"{given}; the inputs are out of range")
    return x


def _check_utilization(value) -> float:
    u = _check("utilization", value)
    if not 0 < u <= 1:
        raise ValueError(f"utilization must be in (0, 1] (share of the hours the GPUs are busy), "
                         f"got {value!r}")
    return u


@dataclass(frozen=True)
class APICost:
    """One month of a hosted API: tokens per direction and what they cost (USD)."""

    requests_per_day: float
    days: float
    monthly_input_tokens: float
    monthly_output_tokens: float
    monthly_input_cost: float
    monthly_output_cost: float
    monthly_cost: float
    cost_per_request: float

    def to_dict(self) -> dict:
        return asdict(self)


def api_monthly_cost(requests_per_day, input_tokens, output_tokens, input_price_per_million,
                     output_price_per_million, days=DAYS_PER_MONTH) -> APICost:
    """Monthly bill of a hosted API, input and output tokens priced apart.

    ``monthly_cost = N · days · (I · p_in + O · p_out) / 1e6`` with ``N`` requests a day of
    ``I`` input and ``O`` output tokens, prices in USD per million tokens.

    Worked example (source 000's volume): N = 1,000, I = 2,000, O = 500, 30 days:
    60,000,000 input and 15,000,000 output tokens; at 3 and 15 USD per million:
    60 · 3 + 15 · 15 = 180 + 225 = 405 USD. Taught in chapter 09.
    """
    n = _check("requests_per_day", requests_per_day)
    i = _check("input_tokens", input_tokens)
    o = _check("output_tokens", output_tokens)
    p_in = _check("input_price_per_million", input_price_per_million)
    p_out = _check("output_price_per_million", output_price_per_million)
    d = _check("days", days, positive=True)
    tin, tout = n * d * i, n * d * o
    cin, cout = tin * p_in / 1e6, tout * p_out / 1e6
    per_request = (i * p_in + o * p_out) / 1e6
    given = dict(requests_per_day=requests_per_day, input_tokens=input_tokens,
                 output_tokens=output_tokens, days=days)
    for what, x in (("monthly_input_tokens", tin), ("monthly_output_tokens", tout),
                    ("monthly_cost", cin + cout), ("cost_per_request", per_request)):
        _result(what, x, **given)
    return APICost(n, d, tin, tout, cin, cout, cin + cout, per_request)


def blended_price_per_million(input_tokens, output_tokens, input_price_per_million,
                              output_price_per_million) -> float:
    """One USD-per-million price for a request mix: ``(I · p_in + O · p_out) / (I + O)``.

    2,000 in / 500 out at 3 / 15 USD: (6,000 + 7,500) / 2,500 = 5.4 USD per million tokens.
    """
    i = _check("input_tokens", input_tokens)
    o = _check("output_tokens", output_tokens)
    if i + o == 0:
        raise ValueError("input_tokens + output_tokens must be > 0, got 0")
    p_in = _check("input_price_per_million", input_price_per_million)
    p_out = _check("output_price_per_million", output_price_per_million)
    return _result("the blended price", (i * p_in + o * p_out) / (i + o),
                   input_tokens=input_tokens, output_tokens=output_tokens)


def selfhost_cost_per_million_tokens(gpu_hour_price_usd, tokens_per_s, utilization=1.0,
                                     n_gpus=1) -> float:
    """USD per million tokens from rented (or amortised) GPU hours.

    ``cost_per_M = n_gpus · P / (T · u · 3600) · 1e6``: ``n_gpus`` GPUs at ``P`` USD per GPU
    hour together serve ``T`` tokens/s while busy, and are busy a share ``u`` of their hours
    (an idle GPU still costs its hour, so a lower ``u`` raises the price of every token).

    Worked: one GPU at 2 USD/h, 1,000 tokens/s, u = 1: 3.6 M tokens per hour, so
    2 / 3.6 = 0.5556 USD per million; at u = 0.25 four times that, 2.222 USD. Taught in
    chapter 09 (and used by chapter 08's roofline widget).
    """
    p = _check("gpu_hour_price_usd", gpu_hour_price_usd)
    t = _check("tokens_per_s", tokens_per_s, positive=True)
    u = _check_utilization(utilization)
    n = _check_count("n_gpus", n_gpus)
    return _result("cost_per_million_tokens", n * p / (t * u * 3600) * 1e6,
                   gpu_hour_price_usd=gpu_hour_price_usd, tokens_per_s=tokens_per_s,
                   utilization=utilization, n_gpus=n_gpus)


def selfhost_monthly_tokens(tokens_per_s, utilization=1.0, days=DAYS_PER_MONTH) -> float:
    """Tokens served in a month: ``T · u · 3600 · 24 · days``.

    1,000 tokens/s at u = 0.5 for 30 days: 1,000 · 0.5 · 2,592,000 = 1.296e9 tokens.
    """
    t = _check("tokens_per_s", tokens_per_s, positive=True)
    u = _check_utilization(utilization)
    d = _check("days", days, positive=True)
    return _result("the monthly tokens", t * u * 3600 * HOURS_PER_DAY * d,
                   tokens_per_s=tokens_per_s, days=days)


def gpu_rental_monthly_cost(gpu_hour_price_usd, n_gpus=1, days=DAYS_PER_MONTH) -> float:
    """Monthly cost of GPUs rented around the clock: ``n · P · 24 · days``.

    One GPU at 2 USD/h for 30 days: 2 · 720 = 1,440 USD.
    """
    p = _check("gpu_hour_price_usd", gpu_hour_price_usd)
    n = _check_count("n_gpus", n_gpus)
    d = _check("days", days, positive=True)
    return _result("the monthly rental", n * p * HOURS_PER_DAY * d,
                   gpu_hour_price_usd=gpu_hour_price_usd, n_gpus=n_gpus, days=days)


def break_even_tokens_per_month(monthly_fixed_cost_usd, api_price_per_million) -> float:
    """Monthly token volume above which a fixed self-hosting cost beats the API.

    ``V = F / p · 1e6``. 1,440 USD a month against 5.4 USD per million tokens:
    1,440 / 5.4 = 266.7 M tokens a month (below it, the API is cheaper).
    """
    f = _check("monthly_fixed_cost_usd", monthly_fixed_cost_usd)
    p = _check("api_price_per_million", api_price_per_million, positive=True)
    return _result("the break-even volume", f / p * 1e6,
                   monthly_fixed_cost_usd=monthly_fixed_cost_usd,
                   api_price_per_million=api_price_per_million)


def gpu_board_power_w(gpu) -> float:
    """A GPU's board power (TDP) in watts from the catalog (:mod:`llminfra.specs`).

    The catalog writes it as text ("700", "300-350", "up to 700"); the largest number is taken
    (the conservative reading for a power budget). ``ValueError`` if the catalog has none.
    """
    spec = get_gpu(gpu)
    text = spec.tdp_w
    numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text or "")]
    if not numbers:
        raise ValueError(f"the GPU catalog gives no board power for {spec.name!r} "
                         f"(tdp_w={text!r}); pass the power in watts yourself")
    return max(numbers)


def power_monthly_cost(power_w, pue, usd_per_kwh, days=DAYS_PER_MONTH) -> float:
    """Electricity for a month at a constant IT power: ``P · PUE · 24 · days · price / 1000``.

    PUE (power usage effectiveness) = facility power / IT power (The Green Grid, White Paper
    #49, 2012): it adds cooling and power distribution to what the servers draw. Eight H100
    at 700 W (5,600 W), PUE 1.5, 0.10 USD/kWh, 30 days: 5.6 · 1.5 · 720 · 0.10 = 604.8 USD.
    """
    p = _check("power_w", power_w)
    e = _check("pue", pue, positive=True)
    if e < 1:
        raise ValueError(f"pue must be >= 1 (facility power / IT power), got {pue!r}")
    c = _check("usd_per_kwh", usd_per_kwh)
    d = _check("days", days, positive=True)
    return _result("the monthly power cost", p * e * HOURS_PER_DAY * d * c / 1000,
                   power_w=power_w, pue=pue, usd_per_kwh=usd_per_kwh, days=days)


@dataclass(frozen=True)
class OwnServerCost:
    """Monthly cost of servers you own, in USD, by part."""

    amortization: float
    power: float
    operations: float
    monthly_cost: float
    gpu_hour_cost: float   # monthly cost / (n_gpus · hours in the month)

    def to_dict(self) -> dict:
        return asdict(self)


def own_server_monthly_cost(purchase_usd, amortization_months, power_w, pue, usd_per_kwh,
                            n_gpus=1, operations_monthly_usd=0.0,
                            days=DAYS_PER_MONTH) -> OwnServerCost:
    """Owning: straight-line amortisation + power + operations, per month and per GPU hour.

    ``monthly = purchase / months + power_monthly_cost(power_w, pue, price) + operations``;
    ``gpu_hour_cost = monthly / (n_gpus · 24 · days)``, the figure to put into
    :func:`selfhost_cost_per_million_tokens` in place of a rental price. Power is charged at
    ``power_w`` all month (the board power is an upper bound; an idle GPU draws less, but the
    purchase is paid whether it works or not).

    Worked: a 200,000 USD 8-GPU server over 36 months = 5,555.6 USD; 10,200 W at PUE 1.5 and
    0.10 USD/kWh = 10.2 · 1.5 · 720 · 0.10 = 1,101.6 USD; no staff: 6,657.2 USD a month,
    6,657.2 / (8 · 720) = 1.156 USD per GPU hour.
    """
    buy = _check("purchase_usd", purchase_usd)
    months = _check("amortization_months", amortization_months, positive=True)
    n = _check_count("n_gpus", n_gpus)
    ops = _check("operations_monthly_usd", operations_monthly_usd)
    d = _check("days", days, positive=True)
    amort = buy / months
    power = power_monthly_cost(power_w, pue, usd_per_kwh, d)
    total = _result("the monthly cost", amort + power + ops, purchase_usd=purchase_usd,
                    amortization_months=amortization_months,
                    operations_monthly_usd=operations_monthly_usd)
    return OwnServerCost(amort, power, ops, total, total / (n * HOURS_PER_DAY * d))


def months_to_pay_back(purchase_usd, rental_monthly_usd, own_running_monthly_usd) -> float:
    """Months after which buying beats renting the same GPUs:
    ``purchase / (rental − own running cost)``; ``inf`` if renting is never dearer.

    200,000 USD against 8 GPUs rented at 2.69 USD/h (8 · 2.69 · 720 = 15,494.4 USD a month)
    with 1,101.6 USD of power: 200,000 / 14,392.8 = 13.90 months.
    """
    buy = _check("purchase_usd", purchase_usd)
    rent = _check("rental_monthly_usd", rental_monthly_usd)
    run = _check("own_running_monthly_usd", own_running_monthly_usd)
    saving = rent - run
    if saving <= 0:
        return math.inf                  # documented: renting is never dearer
    return _result("the pay-back time", buy / saving, purchase_usd=purchase_usd,
                   rental_monthly_usd=rental_monthly_usd,
                   own_running_monthly_usd=own_running_monthly_usd)
