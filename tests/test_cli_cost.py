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
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "0"], "tokens_per_s must be > 0"),
    (["selfhost", "--gpu-hour-price", "-2", "--tokens-per-s", "10"],
     "gpu_hour_price_usd must be >= 0"),
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "10", "--utilization", "1.2"],
     "utilization must be in (0, 1]"),
    (["selfhost", "--gpu-hour-price", "2", "--tokens-per-s", "10", "--utilization", "0"],
     "utilization must be in (0, 1]"),
    (["api", "--requests-per-day", "-5", "--input-tokens", "1", "--output-tokens", "1",
      "--input-price", "1", "--output-price", "1"], "requests_per_day must be >= 0"),
])
def test_cost_bad_numbers_exit_2_with_one_line(args, message, capsys):
    assert main(["cost", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
