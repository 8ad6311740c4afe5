"""`llminfra loadtest`'s table prints numbers as a person writes them: "end-to-end (ms) 38,240",
never "3.824e+04" (issue 42, the learner's path)."""

import math
import re

import pytest

from llminfra.serving.loadtest_stats import format_summary, plain_number


@pytest.mark.parametrize("value, text", [
    (38240.4, "38,240"), (38244.6, "38,240"), (1234567.0, "1,235,000"), (999.96, "1,000"),
    (123.456, "123.5"), (4.4, "4.4"), (5.0, "5"), (0.0123456, "0.01235"), (0.0, "0"),
    (-1500.2, "-1,500"), (math.nan, "—"),
])
def test_plain_number(value, text):
    assert plain_number(value) == text


def test_a_slow_run_reads_without_exponents():
    seconds = {"mean": 38.2404, "std": 1.9, "p50": 38.1, "p90": 40.5, "p95": 41.0, "p99": 41.9}
    r = {"num_requests": 200, "num_ok": 200, "num_errors": 0, "errors": [], "wall_s": 512.3,
         "output_tokens_per_s": 10840.2, "requests_per_s": 0.39,
         "settings": {"base_url": "http://x", "model": "m", "concurrency": 16},
         "ttft_s": {k: v / 100 for k, v in seconds.items()}, "e2e_s": seconds}
    text = format_summary(r)
    assert not re.search(r"\de[+-]\d", text), text
    e2e = next(line for line in text.splitlines() if line.startswith("end-to-end (ms)"))
    assert e2e.split()[2:4] == ["38,240", "1,900"]
    assert "throughput: 10,840 output tokens/s, 0.39 requests/s" in text
