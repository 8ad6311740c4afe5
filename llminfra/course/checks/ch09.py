"""Answer checkers for chapter 09 (``solutions/09_deployment_and_cost.ipynb``): the monthly API
bill, the self-hosted cost per million tokens with utilisation, and the break-even volume in
requests per day.

Every run builds its cases from one seed that a failure names (replay them with
``ch09.check_…(fn, seed=…)``); one case of each category the exercises name comes first:
source 000's example volume, a request with no output tokens, a month that is not 30 days,
a partly idle GPU, several GPUs, and random volumes and prices. On a mismatch the message
gives the case, the expected and returned values, their difference, and the usual mistake
when the wrong answer matches one: prices per thousand instead of per million, one price for
both directions, the input and output prices swapped, a daily instead of a monthly bill, 30 days
for a month of another length, multiplying by the utilisation instead of dividing, the 3,600 seconds
or the 24 hours left out, the GPU count left out. Each of these fails at a fixed case in every
run: at full load utilisation cannot show, on one GPU the GPU count cannot, in a 30-day month
the days cannot, so each has a case of its own.

References: :mod:`llminfra.calc.cost` (taught in chapter 09).
"""

from __future__ import annotations

from llminfra.calc.cost import (api_monthly_cost, blended_price_per_million,
                                break_even_tokens_per_month, gpu_rental_monthly_cost,
                                selfhost_cost_per_million_tokens)
from llminfra.course.checking import Case, checker, first_matching, run_checks, seeded


def _matching(wrong: dict, got, expected) -> str:
    return first_matching(got, wrong, expected, rel=1e-6)


def _run(name: str, fn, reference, cases: list[Case], seed: int, hint) -> int:
    return run_checks(name, fn, reference, cases, rel=1e-6, hint=hint, seed=seed,
                      replay=f"ch09.check_{name}")


# --- exercise 1: the monthly API bill -----------------------------------------------------

def _api_reference(requests_per_day, input_tokens, output_tokens, input_price, output_price,
                   days):
    return api_monthly_cost(requests_per_day, input_tokens, output_tokens, input_price,
                            output_price, days).monthly_cost


def _api_hint(args, kwargs, expected, got) -> str:
    n, i, o, p_in, p_out, d = args
    wrong = {
        "prices are per MILLION tokens: divide by 1e6, not 1e3": expected * 1000,
        "you returned one day's bill: multiply by the days": expected / d,
        "you priced every token at the input price: output tokens have their own price":
            n * d * (i + o) * p_in / 1e6,
        "you priced every token at the output price: input tokens have their own price":
            n * d * (i + o) * p_out / 1e6,
        "you swapped the prices: input tokens at the output price and vice versa":
            n * d * (i * p_out + o * p_in) / 1e6,
        "you forgot the requests per day": d * (i * p_in + o * p_out) / 1e6,
        "you left out the output tokens": n * d * i * p_in / 1e6,
        "you assumed 30 days: use the days argument": expected / d * 30,
    }
    return _matching(wrong, got, expected) or (
        "expected requests_per_day · days · (input_tokens · "
        "input_price + output_tokens · output_price) / 1e6")


@checker
def check_monthly_api_cost(fn, seed: int | None = None) -> int:
    """Check ``fn(requests_per_day, input_tokens, output_tokens, input_price, output_price,
    days) -> USD`` (prices per million tokens). Source 000's volume at 3 / 15 USD, 30 days:
    60 M · 3 + 15 M · 15 = 405 USD."""
    seed, rng = seeded(seed)
    cases = [Case("source 000's example volume, 30 days", (1000, 2000, 500, 3.0, 15.0, 30)),
             Case("no output tokens", (rng.randint(1, 10**4), rng.randint(100, 8000), 0,
                                       rng.uniform(0.1, 10), rng.uniform(1, 60), 30)),
             Case("a month that is not 30 days",
                  (rng.randint(1, 10**4), rng.randint(1, 8000), rng.randint(1, 2000),
                   rng.uniform(0.1, 10), rng.uniform(1, 60), rng.choice([7, 28, 31])))]
    for _ in range(5):
        cases.append(Case("random volume, prices and days",
                          (rng.randint(1, 10**6), rng.randint(1, 32_000), rng.randint(1, 4000),
                           round(rng.uniform(0.05, 15), 2), round(rng.uniform(0.2, 75), 2),
                           rng.randint(1, 31))))
    return _run("monthly_api_cost", fn, _api_reference, cases, seed, _api_hint)


# --- exercise 2: self-hosted cost per million tokens --------------------------------------

def _selfhost_reference(gpu_hour_price, tokens_per_s, utilization, n_gpus):
    return selfhost_cost_per_million_tokens(gpu_hour_price, tokens_per_s, utilization, n_gpus)


def _selfhost_hint(args, kwargs, expected, got) -> str:
    p, t, u, n = args
    wrong = {
        "you multiplied by the utilisation: an idle GPU still costs its hour, so DIVIDE "
        "by the share of hours it is busy": n * p / (t * 3600) * 1e6 * u,
        "you left out the utilisation": n * p / (t * 3600) * 1e6,
        "you left out the 3,600 seconds in an hour (tokens/s -> tokens per hour)":
            n * p / (t * u) * 1e6,
        "you returned USD per token, not per million tokens": expected / 1e6,
        "you returned USD per thousand tokens": expected / 1e3,
        "you left out the number of GPUs (each is paid by the hour)": expected / n,
    }
    return _matching(wrong, got, expected) or (
        "expected n_gpus · gpu_hour_price / (tokens_per_s · "
        "utilization · 3600) · 1e6")


@checker
def check_selfhost_cost_per_million(fn, seed: int | None = None) -> int:
    """Check ``fn(gpu_hour_price, tokens_per_s, utilization, n_gpus) -> USD per million
    tokens``. One GPU at 2 USD/h, 1,000 tokens/s, busy 25 %: 2 / (1,000 · 0.25 · 3,600) · 1e6
    = 2.222 USD."""
    seed, rng = seeded(seed)
    cases = [Case("one GPU at full load", (2.0, 1000.0, 1.0, 1)),
             Case("one GPU, partly idle", (2.0, 1000.0, 0.25, 1)),
             Case("several GPUs at full load", (rng.uniform(0.5, 12), rng.uniform(100, 20_000),
                                                1.0, rng.choice([2, 4, 8])))]
    for _ in range(5):
        cases.append(Case("random price, throughput, utilisation and GPUs",
                          (round(rng.uniform(0.2, 15), 2), rng.uniform(10, 50_000),
                           rng.uniform(0.01, 0.99), rng.randint(1, 16))))
    return _run("selfhost_cost_per_million", fn, _selfhost_reference, cases, seed,
                _selfhost_hint)


# --- exercise 3: break-even volume in requests per day -----------------------------------

def _break_even_reference(gpu_hour_price, n_gpus, input_tokens, output_tokens, input_price,
                          output_price, days):
    fixed = gpu_rental_monthly_cost(gpu_hour_price, n_gpus, days)
    blended = blended_price_per_million(input_tokens, output_tokens, input_price, output_price)
    tokens = break_even_tokens_per_month(fixed, blended)
    return tokens / (input_tokens + output_tokens) / days


def _break_even_hint(args, kwargs, expected, got) -> str:
    p, n, i, o, p_in, p_out, d = args
    per_request = (i * p_in + o * p_out) / 1e6
    wrong = {
        "you left out the 24 hours: GPUs are paid around the clock": expected / 24,
        "you left out the number of GPUs": expected / n,
        "you returned requests per MONTH: divide by the days": expected * d,
        "you priced all tokens at the input price": n * p * 24 / ((i + o) * p_in / 1e6),
        "you priced all tokens at the output price": n * p * 24 / ((i + o) * p_out / 1e6),
        "you returned tokens per day, not requests per day": expected * (i + o),
        "prices are per MILLION tokens: you divided by 1e3": n * p * 24 / (per_request * 1000),
        "you swapped the prices: input tokens at the output price and vice versa":
            n * p * 24 / ((i * p_out + o * p_in) / 1e6),
        "you left out the output tokens' cost": n * p * 24 / (i * p_in / 1e6),
        "you rented the GPUs for 30 days but paid the API for `days`: use the same days on "
        "both sides (they cancel)": expected * 30 / d,
        "you paid the API for 30 days but rented the GPUs for `days`: use the same days on "
        "both sides (they cancel)": expected * d / 30,
    }
    return _matching(wrong, got, expected) or (
        "expected n_gpus · gpu_hour_price · 24 / ((input_tokens · "
        "input_price + output_tokens · output_price) / 1e6)")


@checker
def check_break_even_requests_per_day(fn, seed: int | None = None) -> int:
    """Check ``fn(gpu_hour_price, n_gpus, input_tokens, output_tokens, input_price,
    output_price, days) -> requests per day`` at which renting ``n_gpus`` around the clock
    costs what the API costs. One GPU at 2 USD/h (48 USD a day) against 0.0135 USD a request
    (2,000 in / 500 out at 3 / 15 USD): 48 / 0.0135 = 3,555.6 requests a day."""
    seed, rng = seeded(seed)
    cases = [Case("source 000's request, one GPU, 30 days", (2.0, 1, 2000, 500, 3.0, 15.0, 30)),
             Case("several GPUs, a month that is not 30 days",
                  (rng.uniform(0.5, 12), rng.choice([2, 4, 8]), rng.randint(100, 8000),
                   rng.randint(1, 2000), rng.uniform(0.1, 10), rng.uniform(1, 60),
                   rng.choice([7, 31]))),
             Case("no output tokens", (rng.uniform(0.5, 12), 1, rng.randint(100, 8000), 0,
                                       rng.uniform(0.1, 10), rng.uniform(1, 60), 30))]
    for _ in range(5):
        cases.append(Case("random prices, GPUs, tokens and days",
                          (round(rng.uniform(0.2, 15), 2), rng.randint(1, 16),
                           rng.randint(1, 32_000), rng.randint(1, 4000),
                           round(rng.uniform(0.05, 15), 2), round(rng.uniform(0.2, 75), 2),
                           rng.randint(1, 31))))
    return _run("break_even_requests_per_day", fn, _break_even_reference, cases, seed,
                _break_even_hint)


__all__ = ["check_break_even_requests_per_day", "check_monthly_api_cost",
           "check_selfhost_cost_per_million"]
