"""Chapter 09 checkers: each passes on right answers (of any numeric type) and fails, naming
the case, the seed and the usual mistake, on wrong ones; never crashes on a learner's answer."""

from decimal import Decimal

import numpy as np
import pytest
import torch

from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch09


def api_right(n, i, o, p_in, p_out, days):
    """By hand: n · days · (i · p_in + o · p_out) / 1e6."""
    return n * days * (i * p_in + o * p_out) / 1e6


def selfhost_right(p, t, u, n):
    return n * p / (t * u * 3600) * 1e6


def break_even_right(p, n, i, o, p_in, p_out, days):
    """Per day: n · p · 24 USD of GPUs = requests · (i · p_in + o · p_out) / 1e6."""
    return n * p * 24 / ((i * p_in + o * p_out) / 1e6)


def test_hand_examples():
    """Source 000 at 3 / 15 USD: 405 USD; 2 USD/h, 1,000 tokens/s, 25 %: 2.222 USD per M;
    break-even 48 / 0.0135 = 3,555.6 requests a day."""
    assert api_right(1000, 2000, 500, 3, 15, 30) == pytest.approx(405)
    assert selfhost_right(2, 1000, 0.25, 1) == pytest.approx(2.2222, abs=1e-4)
    assert break_even_right(2, 1, 2000, 500, 3, 15, 30) == pytest.approx(3555.56, abs=0.01)
    assert ch09._break_even_reference(2, 1, 2000, 500, 3, 15, 30) == pytest.approx(3555.56,
                                                                                   abs=0.01)


SEEDS = [1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_checkers_pass_on_right_answers(seed):
    assert ch09.check_monthly_api_cost(api_right, seed=seed) == 8
    assert ch09.check_selfhost_cost_per_million(selfhost_right, seed=seed) == 8
    assert ch09.check_break_even_requests_per_day(break_even_right, seed=seed) == 8


@pytest.mark.parametrize("seed", SEEDS)
def test_any_numeric_type_is_accepted(seed):
    assert ch09.check_monthly_api_cost(lambda *a: np.float32(api_right(*a)), seed=seed) == 8
    assert ch09.check_selfhost_cost_per_million(lambda *a: torch.tensor(
        selfhost_right(*a), dtype=torch.float64), seed=seed) == 8
    assert ch09.check_break_even_requests_per_day(lambda *a: Decimal(break_even_right(*a)),
                                                  seed=seed) == 8


@pytest.mark.parametrize("wrong, message", [
    (lambda n, i, o, pi, po, d: api_right(n, i, o, pi, po, d) * 1000, "per MILLION"),
    (lambda n, i, o, pi, po, d: api_right(n, i, o, pi, po, d) / d, "one day's bill"),
    (lambda n, i, o, pi, po, d: n * d * (i + o) * pi / 1e6, "every token at the input price"),
    (lambda n, i, o, pi, po, d: n * d * (i * po + o * pi) / 1e6, "swapped the prices"),
    (lambda n, i, o, pi, po, d: api_right(n, i, o, pi, po, 30), "assumed 30 days"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_api_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message) as e:
        ch09.check_monthly_api_cost(wrong, seed=seed)
    assert f"replay: ch09.check_monthly_api_cost(your_function, seed={seed})" in str(e.value)


@pytest.mark.parametrize("wrong, message", [
    (lambda p, t, u, n: n * p / (t * 3600) * 1e6 * u, "multiplied by the utilisation"),
    (lambda p, t, u, n: n * p / (t * u) * 1e6, "3,600 seconds"),
    (lambda p, t, u, n: p / (t * u * 3600) * 1e6, "number of GPUs"),
    (lambda p, t, u, n: n * p / (t * u * 3600), "per token"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_selfhost_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message):
        ch09.check_selfhost_cost_per_million(wrong, seed=seed)


@pytest.mark.parametrize("wrong, message", [
    (lambda p, n, i, o, pi, po, d: break_even_right(p, n, i, o, pi, po, d) / 24, "24 hours"),
    (lambda p, n, i, o, pi, po, d: break_even_right(p, n, i, o, pi, po, d) * d, "per MONTH"),
    (lambda p, n, i, o, pi, po, d: break_even_right(p, n, i, o, pi, po, d) * (i + o),
     "tokens per day"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_break_even_diagnoses(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message):
        ch09.check_break_even_requests_per_day(wrong, seed=seed)


def test_seed_replays_the_same_cases_and_failure():
    """A failure names its seed; the same seed gives the same message."""
    def off(*a):
        return api_right(*a) * 1.01
    with pytest.raises(CheckFailed) as first:
        ch09.check_monthly_api_cost(off)
    seed = int(str(first.value).split("(seed ")[1].split(";")[0])
    with pytest.raises(CheckFailed) as again:
        ch09.check_monthly_api_cost(off, seed=seed)
    assert str(again.value) == str(first.value)
    assert "difference" in str(first.value)


@pytest.mark.parametrize("answer", [None, "405", [1, 2], float("nan"), {"cost": 1}])
def test_odd_answers_fail_cleanly(answer):
    with pytest.raises(CheckFailed):
        ch09.check_monthly_api_cost(lambda *a: answer)


def test_stub_and_crash_and_non_function():
    def stub(*a):
        raise NotImplementedError("your code here")
    for check in (ch09.check_monthly_api_cost, ch09.check_selfhost_cost_per_million,
                  ch09.check_break_even_requests_per_day):
        with pytest.raises(NotAttempted, match="not implemented yet"):
            check(stub)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        ch09.check_break_even_requests_per_day(lambda *a: 1 / 0)
    with pytest.raises(CheckFailed, match="expected a function"):
        ch09.check_monthly_api_cost(42)


# ---- every branch has a fixed case: a wrong answer that ignores one fails on every seed, there
EVERY = range(8)


@pytest.mark.parametrize("wrong, case, message", [
    (lambda n, i, o, pi, po, d: api_right(n, i, o, pi, po, d) * 1000, 1, "per MILLION"),
    (lambda n, i, o, pi, po, d: api_right(n, i, o, pi, po, d) / d, 1, "one day's bill"),
    (lambda n, i, o, pi, po, d: n * d * (i + o) * pi / 1e6, 1, "every token at the input price"),
    (lambda n, i, o, pi, po, d: n * d * (i + o) * po / 1e6, 1, "every token at the output price"),
    (lambda n, i, o, pi, po, d: n * d * (i * po + o * pi) / 1e6, 1, "swapped the prices"),
    (lambda n, i, o, pi, po, d: d * (i * pi + o * po) / 1e6, 1, "requests per day"),
    (lambda n, i, o, pi, po, d: n * d * i * pi / 1e6, 1, "left out the output tokens"),
    (lambda n, i, o, pi, po, d: api_right(n, i, o, pi, po, 30), 3, "assumed 30 days"),
])
@pytest.mark.parametrize("seed", EVERY)
def test_api_slips_fail_every_run_at_their_case(wrong, case, message, seed):
    """Case 1 is source 000's volume in 30 days; case 3 a month of 7, 28 or 31 days."""
    with pytest.raises(CheckFailed, match=message) as e:
        ch09.check_monthly_api_cost(wrong, seed=seed)
    names = {1: "source 000's example volume, 30 days", 3: "a month that is not 30 days"}
    assert f"case {case} of 8: {names[case]}" in str(e.value)


@pytest.mark.parametrize("wrong, case, message", [
    (lambda p, t, u, n: n * p / (t * 3600) * 1e6 * u, 2, "multiplied by the utilisation"),
    (lambda p, t, u, n: n * p / (t * 3600) * 1e6, 2, "left out the utilisation"),
    (lambda p, t, u, n: p / (t * u * 3600) * 1e6, 3, "number of GPUs"),
    (lambda p, t, u, n: n * p / (t * u) * 1e6, 1, "3,600 seconds"),
    (lambda p, t, u, n: n * p / (t * u * 3600), 1, "per token"),
    (lambda p, t, u, n: n * p / (t * u * 3600) * 1e3, 1, "per thousand"),
])
@pytest.mark.parametrize("seed", EVERY)
def test_selfhost_slips_fail_every_run_at_their_case(wrong, case, message, seed):
    """At full load (case 1) the utilisation cannot show: case 2 is partly idle, case 3 has
    several GPUs."""
    with pytest.raises(CheckFailed, match=message) as e:
        ch09.check_selfhost_cost_per_million(wrong, seed=seed)
    names = {1: "one GPU at full load", 2: "one GPU, partly idle", 3: "several GPUs at full load"}
    assert f"case {case} of 8: {names[case]}" in str(e.value)


@pytest.mark.parametrize("wrong, case, message", [
    (lambda p, n, i, o, pi, po, d: break_even_right(p, n, i, o, pi, po, d) / 24, 1, "24 hours"),
    (lambda p, n, i, o, pi, po, d: break_even_right(p, n, i, o, pi, po, d) * d, 1, "per MONTH"),
    (lambda p, n, i, o, pi, po, d: break_even_right(p, n, i, o, pi, po, d) * (i + o), 1,
     "tokens per day"),
    (lambda p, n, i, o, pi, po, d: p * 24 / ((i * pi + o * po) / 1e6), 2, "number of GPUs"),
    (lambda p, n, i, o, pi, po, d: n * p * 24 * 30 / ((i * pi + o * po) / 1e6) / d, 2,
     "rented the GPUs for 30 days"),
    (lambda p, n, i, o, pi, po, d: n * p * 24 * d / ((i * pi + o * po) / 1e6) / 30, 2,
     "paid the API for 30 days"),
    (lambda p, n, i, o, pi, po, d: n * p * 24 / ((i * po + o * pi) / 1e6), 1, "swapped"),
    (lambda p, n, i, o, pi, po, d: n * p * 24 / (i * pi / 1e6), 1, "output tokens"),
    (lambda p, n, i, o, pi, po, d: n * p * 24 / ((i + o) * pi / 1e6), 1, "all tokens at the input"),
])
@pytest.mark.parametrize("seed", EVERY)
def test_break_even_slips_fail_every_run_at_their_case(wrong, case, message, seed):
    """Case 1 is one GPU in a 30-day month: the GPU count and the days cannot show there; case
    2 has several GPUs in a month of 7 or 31 days."""
    with pytest.raises(CheckFailed, match=message) as e:
        ch09.check_break_even_requests_per_day(wrong, seed=seed)
    names = {1: "source 000's request, one GPU, 30 days",
             2: "several GPUs, a month that is not 30 days"}
    assert f"case {case} of 8: {names[case]}" in str(e.value)
