"""Metrics (percentiles worked by hand, summaries), the sampler's filters, the workload."""


import pytest
import torch

from llminfra.engine import RequestMetrics, SamplingParams, percentile, summarize
from llminfra.engine.sampler import filter_logits, sample_tokens
from llminfra.sim.workload import serving_workload


def test_percentile_worked_by_hand():
    """[1, 2, 3, 4]: p50 -> rank 1.5 -> 2.5; p99 -> rank 2.97 -> 3.97; p0 -> 1."""
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([1, 2, 3, 4], 0) == 1 and percentile([7], 90) == 7
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_request_metrics_and_summary():
    """A: arrives 0, tokens at 1, 2, 4 -> TTFT 1, TPOT (4 - 1) / 2 = 1.5, e2e 4.
    B: arrives 1, one token at 3 -> TTFT 2, no TPOT, e2e 2. Throughput 4 tokens / 4 s."""
    a = RequestMetrics(0.0, 0.5, 1.0, [1.0, 2.0, 4.0], 4.0, 3)
    b = RequestMetrics(1.0, 2.0, 3.0, [3.0], 3.0, 1)
    assert (a.ttft_s, a.tpot_s, a.e2e_s, a.queue_s) == (1.0, 1.5, 4.0, 0.5)
    assert b.tpot_s is None
    s = summarize([a, b, RequestMetrics(9.0)])          # the unfinished one is left out
    assert s["num_requests"] == 2 and s["throughput_tokens_per_s"] == 1.0
    assert s["ttft_s"]["p50"] == 1.5 and s["tpot_s"]["mean"] == 1.5 and s["e2e_s"]["p90"] == 3.8
    with pytest.raises(ValueError, match="no finished"):
        summarize([RequestMetrics(0.0)])


def test_top_p_and_top_k_worked_example():
    """Probabilities [0.5, 0.3, 0.15, 0.05], p = 0.8 keeps {0.5, 0.3}; top_k = 3 drops 0.05."""
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert torch.isfinite(filter_logits(logits, None, 0.8)).tolist() == [True, True, False, False]
    assert torch.isfinite(filter_logits(logits, 3, 1.0)).tolist() == [True, True, True, False]
    g = torch.Generator().manual_seed(0)
    draws = sample_tokens(logits.repeat(200, 1), [SamplingParams(temperature=1.0, top_p=0.8)]
                          * 200, [g] * 200)
    assert set(draws) == {0, 1}
    assert sample_tokens(logits[None], [SamplingParams()], [None]) == [0]
    with pytest.raises(ValueError, match="Generator"):
        sample_tokens(logits[None], [SamplingParams(temperature=1.0)], [None])


def test_greedy_rows_take_the_first_maximum_as_argmax_does():
    """The batch's greedy tokens (``max(dim=-1).indices``, faster than ``argmax`` on a CPU) are
    argmax's: the first of tied maxima, the first NaN, index 0 of a row of -inf."""
    inf, nan = float("inf"), float("nan")
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.5, nan, 1.0, nan], [2.0, 2.0, 2.0, 2.0],
                           [-inf, -inf, -inf, -inf], [0.0, 0.0, 0.0, 9.0]])
    got = sample_tokens(logits, [SamplingParams()] * 5, [None] * 5)
    assert got == logits.argmax(dim=-1).tolist() == [1, 1, 0, 0, 3]


def test_workload_is_seeded_and_fits(gen):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    a = serving_workload(50, torch.Generator().manual_seed(seed), rate_per_s=4.0,
                         max_seq_len=256, scale=0.25)
    b = serving_workload(50, torch.Generator().manual_seed(seed), rate_per_s=4.0,
                         max_seq_len=256, scale=0.25)
    assert a == b and a[0].arrival_time_s == 0.0
    assert all(r.prompt_len >= 1 and r.output_len >= 1 and r.prompt_len + r.output_len <= 256
               for r in a)
    times = [r.arrival_time_s for r in a]
    assert times == sorted(times) and 5 < times[-1] < 30      # 49 gaps of mean 0.25 s
    burst = serving_workload(3, gen)
    assert [r.arrival_time_s for r in burst] == [0.0] * 3
    with pytest.raises(ValueError):
        serving_workload(3, gen, rate_per_s=0)


def test_percentile_and_kv_budget_refuse_a_bool():
    """Leftovers of the reliability issue: ``True`` is not a percentile nor a reserve."""
    import numpy as np

    from llminfra.calc.memory import kv_budget
    with pytest.raises(ValueError, match="q must be a number"):
        percentile([1.0, 2.0], True)
    assert percentile([1.0, 2.0, 3.0, 4.0], np.int64(50)) == 2.5
    with pytest.raises(ValueError, match="reserve_fraction must be a number"):
        kv_budget("llama-2-7b", "a100-80gb", reserve_fraction=False)


def test_ttft_and_tpot_are_defined_once():
    """Every timing consumer derives a measured TTFT and TPOT (from timestamps; calc's and
    planning's are roofline predictions) from ``llminfra.engine.metrics``: a
    property or function named ``ttft*`` / ``tpot*`` elsewhere calls ``ttft(...)`` /
    ``tpot(...)`` (or another such property) instead of writing the formula again; and a
    one-token answer has one TPOT everywhere: None."""
    import ast
    from pathlib import Path

    import llminfra
    from llminfra.sim.goodput import RequestTimes
    from llminfra.engine.metrics import tpot, ttft
    from llminfra.sim.scheduling_rules import ttft_tpot
    from llminfra.serving.loadtest_stats import RequestRecord
    root = Path(llminfra.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if (path.name == "metrics.py" and path.parent.name == "engine") \
                or path.parent.name in ("calc", "planning"):   # predictions, not timestamps
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith(("ttft", "tpot")):
                continue
            calls = {getattr(c.func, "id", getattr(c.func, "attr", None))
                     for c in ast.walk(node) if isinstance(c, ast.Call)}
            reads = {getattr(a, "attr", None) for a in ast.walk(node)
                     if isinstance(a, ast.Attribute)}
            if not calls & {"ttft", "tpot", "ttft_s", "tpot_s", "ttft_tpot"} and \
                    not reads & {"ttft_s", "tpot_s"}:
                offenders.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    assert not offenders, offenders
    assert ttft(1.0, 1.5) == 0.5 and tpot(0.5, 0.8, 3) == pytest.approx(0.15)
    one = [tpot(2.0, 2.0, 1), RequestTimes(0.0, 1.0, 1.0, 1).tpot_s, ttft_tpot(0.0, [1.0])[1],
           RequestRecord(0, 4, 1, sent_s=0.0, first_token_s=1.0, done_s=1.0,
                         output_tokens=1).tpot_s]
    assert one == [None] * 4
