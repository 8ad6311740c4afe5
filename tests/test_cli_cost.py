"""``python -m llminfra cost …`` as a user runs it (numbers worked by hand in test_cost.py)."""

import json
import subprocess
import sys

import pytest

from llminfra.cli import main

API = ["cost", "api", "--requests-per-day", "1000", "--input-tokens", "2000",
       "--output-tokens", "500", "--input-price", "3", "--output-price", "15"]


def test_cost_api_json_in_a_subprocess():
    """Source 000's volume at 3 / 15 USD per million: 60 M + 15 M tokens, 180 + 225 = 405 USD."""
    r = subprocess.run([sys.executable, "-m", "llminfra", *API, "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["monthly_input_tokens"] == 60_000_000
    assert d["monthly_output_tokens"] == 15_000_000
    assert d["monthly_cost"] == pytest.approx(405)


def test_cost_api_days_and_table(capsys):
    """7 days: 14 M + 3.5 M tokens, 42 + 52.5 = 94.5 USD, printed for people."""
    assert main(API + ["--days", "7"]) == 0
    out = capsys.readouterr().out
    assert "14,000,000 input" in out and "94.50 USD" in out


def test_cost_selfhost_json(capsys):
    """2 USD/h, 1,000 tokens/s, busy 25%: 2 / (1,000 · 0.25 · 3,600) · 1e6 = 2.222 USD per M."""
    assert main(["cost", "selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "1000",
                 "--utilization", "0.25", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cost_per_million_tokens"] == pytest.approx(2.2222, abs=1e-4)
    assert main(["cost", "selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "1000"]) == 0
    assert "0.5556 USD per million tokens" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "0"],
     "argument --tokens-per-s: must be a finite number of tokens per second > 0"),
    (["selfhost", "--gpu-hour-price", "-2", "--tokens-per-s", "10"],
     "argument --gpu-hour-price: must be a finite number of USD >= 0"),
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "10", "--utilization", "1.2"],
     "argument --utilization: must be a finite number in (0, 1]"),
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "10", "--utilization", "0"],
     "argument --utilization: must be a finite number in (0, 1]"),
    (["api", "--requests-per-day", "-5", "--input-tokens", "1", "--output-tokens", "1",
      "--input-price", "1", "--output-price", "1"],
     "argument --requests-per-day: must be a finite number >= 0"),
])
def test_cost_bad_numbers_exit_2_with_one_line(args, message, capsys):
    assert main(["cost", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


# ---- hardening (issue 25) -------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "10", "--n-gpus", "0.5"],
     "argument --n-gpus: must be an integer number of GPUs in 1..1,000,000, got '0.5'"),
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "10", "--n-gpus", "0"],
     "argument --n-gpus: must be an integer number of GPUs in 1..1,000,000, got 0"),
    (["selfhost", "--gpu-hour-price", "nan", "--tokens-per-s", "10"],
     "argument --gpu-hour-price: must be a finite number of USD >= 0, got 'nan'"),
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "inf"],
     "argument --tokens-per-s: must be a finite number of tokens per second > 0, got 'inf'"),
    (["api", "--requests-per-day", "1e400", "--input-tokens", "1", "--output-tokens", "1",
      "--input-price", "1", "--output-price", "1"],
     "argument --requests-per-day: must be a finite number >= 0, got '1e400'"),
    (["api", "--requests-per-day", "1", "--input-tokens", "1", "--output-tokens", "1",
      "--input-price", "1", "--output-price", "1", "--days", "0"],
     "argument --days: must be a finite number of days > 0, got '0'"),
])
def test_cost_numbers_out_of_range_name_the_option(args, message, capsys):
    """Fractional GPUs, NaN and infinities used to be accepted or to reach the calculator."""
    assert main(["cost", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("args, needle", [
    (["api", "--requests-per-day", "1e308", "--input-tokens", "2000", "--output-tokens", "500",
      "--input-price", "3", "--output-price", "15"], "monthly_input_tokens overflows"),
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "1e-320"],
     "cost_per_million_tokens overflows"),
])
@pytest.mark.parametrize("as_json", [False, True])
def test_cost_that_overflows_says_so(args, needle, as_json, capsys):
    """1e308 requests a day used to print ``Infinity``, 1e-320 tokens/s ``inf USD per million
    tokens``: finite inputs whose figure passes the largest float (about 1.8e308)."""
    assert main(["cost", *args] + (["--json"] if as_json else [])) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err and "1.8e308" in err and err.count("\n") == 1


def test_cost_large_but_finite_still_prints(capsys):
    """Just below the overflow the figure is printed: 1e300 requests a day of one token at
    1 USD per million for 30 days = 3e301 tokens, 3e295 USD."""
    assert main(["cost", "api", "--requests-per-day", "1e300", "--input-tokens", "1",
                 "--output-tokens", "0", "--input-price", "1", "--output-price", "1",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["monthly_input_tokens"] == pytest.approx(3e301)
    assert d["monthly_cost"] == pytest.approx(3e295)
