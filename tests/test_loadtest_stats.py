"""The load test's pure parts: statistics worked by hand, goodput SLOs, vLLM's field names,
the peaks (output tokens per 1-s bucket, requests in flight), gamma (bursty) arrivals, the
shared-prefix workload, and bad values refused by name; then one exact run through a mock
transport and a stepping clock (no server). The ramp-up: tests/test_loadtest_workload.py."""

import json
import math

import httpx
import pytest
import torch

from llminfra.cli import main
from llminfra.serving.loadtest import (RequestRecord, check_request_settings,
                                      loadtest_requests, parse_goodput, percentiles,
                                      prompt_texts, run_loadtest, summarize)
from llminfra.serving.loadtest_stats import (GOODPUT_METRICS, format_summary, meets_slos,
                                             output_tokens_each_second,
                                             peak_concurrent_requests, peak_output_tokens_per_s,
                                             vllm_fields)
from llminfra.serving.loadtest_workload import gamma_arrivals, shared_prefix_ids
from llminfra.sim.goodput import goodput as engine_goodput
from llminfra.sim.workload import poisson_arrivals

#: the keys of vLLM's result JSON (vllm/benchmarks/serve.py, benchmark())
VLLM_KEYS = ["duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests"] + [
                 f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                 for s in ("mean", "median", "std", "p99")]


def test_percentiles_by_hand():
    """1..4: mean 2.5, population std √1.25, p50 2.5, p95 = 1 + 0.95·3 = 3.85, p99 3.97."""
    p = percentiles([4.0, 1.0, math.nan, 3.0, 2.0])
    assert p["mean"] == 2.5 and p["std"] == pytest.approx(math.sqrt(1.25))
    assert p["p50"] == 2.5 and p["p90"] == pytest.approx(3.7)
    assert p["p95"] == pytest.approx(3.85) and p["p99"] == pytest.approx(3.97)
    assert all(math.isnan(v) for v in percentiles([math.nan]).values())


def _records():
    """Two good requests and one error, times worked by hand."""
    a = RequestRecord(0, 10, 3, sent_s=0.0, first_token_s=0.5, done_s=0.9, output_tokens=3,
                      chunk_times_s=[0.5, 0.6, 0.9])                  # ITL 0.1, 0.3
    b = RequestRecord(1, 20, 1, sent_s=1.0, first_token_s=1.2, done_s=1.2, output_tokens=1,
                      chunk_times_s=[1.2])                            # no gap, no TPOT
    bad = RequestRecord(2, 30, 4, error="HTTP 400")
    return [a, b, bad]


def test_summary_itl_tpot_and_vllm_fields_by_hand():
    s = summarize(_records(), wall_s=2.0)
    assert _records()[0].itl_s == pytest.approx([0.1, 0.3])
    assert s["itl_s"]["mean"] == pytest.approx(0.2) and s["itl_s"]["std"] == pytest.approx(0.1)
    assert s["tpot_s"]["p50"] == pytest.approx(0.2)                  # (0.9 − 0.5) / 2
    assert s["ttft_s"]["mean"] == pytest.approx(0.35) and s["e2e_s"]["p50"] == pytest.approx(0.55)
    assert all(k in s for k in VLLM_KEYS)
    assert (s["completed"], s["failed"], s["total_input_tokens"], s["total_output_tokens"]) == (
        2, 1, 30, 4)
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 2.0
    assert s["total_token_throughput"] == 17.0 and s["duration"] == 2.0
    assert s["mean_itl_ms"] == pytest.approx(200) and s["median_ttft_ms"] == pytest.approx(350)
    assert s["p99_e2el_ms"] == pytest.approx(1e3 * (0.2 + 0.99 * 0.7))
    assert s["request_goodput"] is None and vllm_fields(s) == {k: s[k] for k in vllm_fields(s)}
    # peaks: buckets from t = 0, ⌈1.2⌉ + 1 = 3 of them: a's 3 chunks in [0, 1), b's in [1, 2)
    assert (s["peak_output_tokens_per_s"], s["max_output_tokens_per_s"]) == (3.0, 3.0)
    assert s["peak_concurrent_requests"] == s["max_concurrent_requests"] == 1   # a ends first


def _three_requests(c_sent_s=11.1):
    """Three completed requests (and one error) on a clock that starts at 10 s:

    ====  ======  ==============================  =====
    req   sent    chunks                          done
    ====  ======  ==============================  =====
    A     10.0    10.2, 10.5, 10.9, 11.1          11.1
    B     10.5    10.7, 10.8, 11.3, 11.6, 11.9    12.0
    C     11.1    12.3, 12.4                      12.5
    ====  ======  ==============================  =====
    """
    return [RequestRecord(0, 5, 4, sent_s=10.0, first_token_s=10.2, done_s=11.1,
                          output_tokens=4, chunk_times_s=[10.2, 10.5, 10.9, 11.1]),
            RequestRecord(1, 5, 5, sent_s=10.5, first_token_s=10.7, done_s=12.0,
                          output_tokens=5, chunk_times_s=[10.7, 10.8, 11.3, 11.6, 11.9]),
            RequestRecord(2, 5, 2, sent_s=c_sent_s, first_token_s=12.3, done_s=12.5,
                          output_tokens=2, chunk_times_s=[12.3, 12.4]),
            RequestRecord(3, 5, 9, sent_s=10.0, done_s=13.0, error="HTTP 500",
                          chunk_times_s=[10.1] * 9)]


def test_peaks_by_hand():
    """Buckets start at the earliest send, 10.0 s (not at 0 on the clock): ⌈12.5 − 10⌉ + 1 = 4
    buckets. [10, 11): A 10.2 10.5 10.9 + B 10.7 10.8 = 5; [11, 12): A 11.1 + B 11.3 11.6
    11.9 = 4; [12, 13): C 12.3 12.4 = 2; [13, 14): 0. The error's 9 chunks count nowhere.
    Peak output 5 tokens/s. In flight: A [10, 11.1), B [10.5, 12), C [11.1, 12.5): two at
    once at most (C starts as A ends: half-open, A has left); C sent at 11.0 instead: three."""
    recs = _three_requests()
    assert output_tokens_each_second(recs) == [5, 4, 2, 0]
    assert peak_output_tokens_per_s(recs) == 5.0
    assert peak_concurrent_requests(recs) == 2
    assert peak_concurrent_requests(_three_requests(c_sent_s=11.0)) == 3
    s = summarize(recs, wall_s=2.5)
    assert (s["peak_output_tokens_per_s"], s["peak_concurrent_requests"]) == (5.0, 2)
    assert (s["max_output_tokens_per_s"], s["max_concurrent_requests"]) == (5.0, 2)
    # nothing completed: 0 as vLLM (a count, not a missing sample)
    for none in ([], recs[3:]):
        assert output_tokens_each_second(none) == []
        assert (peak_output_tokens_per_s(none), peak_concurrent_requests(none)) == (0.0, 0)
    s["settings"] = {"base_url": "http://x", "model": "m", "concurrency": 3}
    assert "peak: 5 output tokens/s (fullest 1-s bucket), 2 requests in flight" in (
        format_summary(s))


def test_goodput_parsing():
    assert parse_goodput("ttft:500 tpot:50 e2el:3000") == {"ttft": 500, "tpot": 50,
                                                            "e2el": 3000}
    assert parse_goodput(["ttft:500 tpot:50", "e2el:3000"]) == {"ttft": 500, "tpot": 50,
                                                                 "e2el": 3000}
    assert parse_goodput(["e2el:2.5"]) == {"e2el": 2.5} == parse_goodput({"e2el": 2.5})
    for bad, needle in (("ttft=500", "not NAME:MILLISECONDS"), ("itl:5", "'itl' is unknown"),
                        ("ttft:-1", "ttft:-1 must be a finite number of milliseconds >= 0"),
                        ("ttft:nan", "finite"), ("tpot:fast", "tpot:fast"),
                        ("ttft:1 ttft:2", "twice"), ("", "at least one"), ([], "at least one")):
        with pytest.raises(ValueError, match=needle):
            parse_goodput(bad)
    assert GOODPUT_METRICS == ("ttft", "tpot", "e2el")


def test_goodput_by_hand_and_as_the_engine_counts_it():
    recs = _records()
    assert summarize(recs, 2.0, {"ttft": 400})["request_goodput"] == 0.5      # b only
    assert summarize(recs, 2.0, {"tpot": 100})["goodput_requests_per_s"] == 0.5  # b: no TPOT
    assert summarize(recs, 2.0, {"e2el": 900})["request_goodput"] == 1.0   # both (≤ inclusive)
    assert summarize(recs, 2.0, {"e2el": 899})["request_goodput"] == 0.5
    # TTFT and TPOT: the engine's rule on random requests gives the same count
    g = torch.Generator().manual_seed(3)
    recs = []
    for i in range(200):
        sent, ttft, tpot = (torch.rand(3, generator=g, dtype=torch.float64) * 0.2).tolist()
        n = int(torch.randint(1, 6, (1,), generator=g))
        recs.append(RequestRecord(i, 5, n, sent_s=sent, first_token_s=sent + ttft,
                                  done_s=sent + ttft + tpot * (n - 1), output_tokens=n))
    ours = summarize(recs, 10.0, {"ttft": 100, "tpot": 80})["request_goodput"]
    theirs = engine_goodput([(r.sent_s, r.first_token_s, r.done_s, r.output_tokens)
                             for r in recs], 0.1, 0.08, duration_s=10.0)
    assert ours == pytest.approx(theirs) and 0 < ours < 20
    assert meets_slos(recs[0], {}) is True


@pytest.mark.parametrize("b", [0.25, 1.0, 4.0])
def test_gamma_arrivals_mean_gap_and_burstiness(b):
    """Mean gap 1/rate for every shape; squared coefficient of variation 1/b."""
    t = gamma_arrivals(20_000, 5.0, b, torch.Generator().manual_seed(0))
    gaps = torch.tensor(t).diff()
    assert t[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean().item() == pytest.approx(0.2, rel=0.05)
    cv2 = (gaps.var() / gaps.mean() ** 2).item()
    assert cv2 == pytest.approx(1 / b, rel=0.1)
    assert t == gamma_arrivals(20_000, 5.0, b, torch.Generator().manual_seed(0))


def test_burstiness_one_is_the_exponential():
    """Shape 1 and the Poisson process's exponential gaps: the same mean, CV and share of gaps
    below the mean (1 − 1/e); and b = 1 leaves loadtest_requests exactly as before."""
    gam = torch.tensor(gamma_arrivals(20_000, 2.0, 1.0, torch.Generator().manual_seed(1))).diff()
    exp = torch.tensor(poisson_arrivals(20_000, 2.0, torch.Generator().manual_seed(2))).diff()
    for gaps in (gam, exp):
        assert gaps.mean().item() == pytest.approx(0.5, rel=0.05)
        assert (gaps.std() / gaps.mean()).item() == pytest.approx(1.0, rel=0.05)
        assert (gaps < 0.5).double().mean().item() == pytest.approx(1 - math.exp(-1), abs=0.02)
    assert loadtest_requests(50, 4, 256, rate=3.0, burstiness=1.0) == loadtest_requests(
        50, 4, 256, rate=3.0)
    bursty = loadtest_requests(50, 4, 256, rate=3.0, burstiness=0.3)
    assert [(r.prompt_len, r.output_len) for r in bursty] == [
        (r.prompt_len, r.output_len) for r in loadtest_requests(50, 4, 256, rate=3.0)]


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "1"])
def test_bad_burstiness_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="burstiness must be a finite number > 0"):
        check_request_settings(10, 0, rate=1.0, burstiness=bad)
    with pytest.raises(ValueError, match="burstiness"):
        gamma_arrivals(3, 1.0, bad, torch.Generator())


def test_burstiness_needs_poisson_arrivals_at_a_rate():
    for kwargs in (dict(rate=None), dict(rate=2.0, arrivals="fixed")):
        with pytest.raises(ValueError, match="burstiness 0.5 shapes the gaps"):
            loadtest_requests(5, 0, 256, burstiness=0.5, **kwargs)


def test_shared_prefix_workload():
    reqs = loadtest_requests(100, 2, 256, prefix_tokens=40)
    assert all(r.prompt_len > 40 and r.prompt_len + r.output_len <= 256 for r in reqs)
    ids = shared_prefix_ids(100, 3, 7)
    assert sorted(set(ids)) == [0, 1, 2] and ids == shared_prefix_ids(100, 3, 7)
    texts = prompt_texts([r.prompt_len for r in reqs], prefix_tokens=40, prefix_ids=ids)
    assert [len(t) for t in texts] == [r.prompt_len for r in reqs]
    heads = {}
    for i, t in zip(ids, texts):
        assert heads.setdefault(i, t[:40]) == t[:40]          # one text per prefix id
    assert len(set(heads.values())) == 3
    for kwargs, needle in ((dict(prefix_tokens=255), "prefix_tokens 255 leaves no room"),
                           (dict(prefix_tokens=-1), "prefix_tokens must be an int >= 0")):
        with pytest.raises(ValueError, match=needle):
            loadtest_requests(5, 0, 256, **kwargs)


def _mock_server(chunks=("a", "b", "c")):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 256}]})
        lines = [json.dumps({"choices": [{"text": c}]}) for c in chunks]
        lines.append(json.dumps({"choices": [], "usage": {"completion_tokens": len(chunks)}}))
        body = "".join(f"data: {x}\n\n" for x in lines + ["[DONE]"])
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})
    return httpx.MockTransport(handler)


def test_exact_times_through_a_mock_server():
    """A clock that steps 1/8 s a call: t0 0, sent 1/8, chunks 2/8, 3/8, 4/8, done 5/8,
    wall 6/8. TTFT 125 ms, ITL 125 ms twice, TPOT (5/8 − 2/8) / 2 = 187.5 ms, E2EL 500 ms."""
    ticks = iter(range(100))
    r = run_loadtest("http://mock", concurrency=1, num_requests=1, progress=False,
                     clock=lambda: next(ticks) / 8, transport=_mock_server(),
                     goodput="ttft:125 tpot:200 e2el:500")
    assert (r["mean_ttft_ms"], r["mean_itl_ms"], r["std_itl_ms"]) == (125, 125, 0)
    assert (r["mean_tpot_ms"], r["p99_e2el_ms"], r["duration"]) == (187.5, 500, 0.75)
    assert r["request_goodput"] == pytest.approx(1 / 0.75)
    assert r["requests"][0]["itl_s"] == [0.125, 0.125]
    assert (r["max_output_tokens_per_s"], r["max_concurrent_requests"]) == (3.0, 1)
    ticks = iter(range(100))
    r = run_loadtest("http://mock", concurrency=1, num_requests=1, progress=False,
                     clock=lambda: next(ticks) / 8, transport=_mock_server(),
                     goodput={"e2el": 499})
    assert r["request_goodput"] == 0.0


def test_sweep_through_a_mock_server_and_bad_sweeps():
    r = run_loadtest("http://mock", rate=[50.0, 100.0], num_requests=3, progress=False,
                     transport=_mock_server(), burstiness=2.0)
    assert r["rates"] == [50.0, 100.0] and r["num_ok"] == 6 and len(r["sweep"]) == 2
    assert [run["settings"]["rate"] for run in r["sweep"]] == [50.0, 100.0]
    assert all(run["completed"] == 3 and run["settings"]["burstiness"] == 2.0
               for run in r["sweep"])
    with pytest.raises(ValueError, match="needs at least one rate"):
        run_loadtest("http://mock", rate=[], transport=_mock_server())
    with pytest.raises(ValueError, match="rate must be a finite number"):
        run_loadtest("http://mock", rate=[1.0, math.inf], transport=_mock_server())


LT = ["loadtest", "--base-url", "http://127.0.0.1:9"]


@pytest.mark.parametrize("args, needle", [
    (LT + ["--rate", "1,inf"], "argument --rate: must be a finite number of requests per second"),
    (LT + ["--sweep-rates", ","], "argument --sweep-rates: needs at least one number"),
    (LT + ["--sweep-rates", "2,0"], "argument --sweep-rates: must be a finite number"),
    (LT + ["--rate", "1", "--burstiness", "0"], "argument --burstiness: must be a finite number"),
    (LT + ["--rate", "1", "--burstiness", "nan"], "argument --burstiness"),
    (LT + ["--rate", "1", "--prefix-tokens", "-1"], "argument --prefix-tokens"),
    (LT + ["--rate", "1", "--num-prefixes", "0"], "argument --num-prefixes"),
    (LT + ["--rate", "1", "--goodput", "ttft=5"],
     "llminfra loadtest: goodput SLO 'ttft=5' is not NAME:MILLISECONDS"),
    (LT + ["--rate", "1", "--goodput", "itl:5"], "goodput SLO name 'itl' is unknown: allowed "
                                                  "ttft, tpot, e2el"),
    (LT + ["--concurrency", "2", "--burstiness", "0.5"], "llminfra loadtest: burstiness 0.5"),
])
def test_cli_bad_values_are_one_line(args, needle, capsys):
    """Refused before any request: the address leads nowhere."""
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_copies_match_their_source():
    from llminfra import cli_serving
    from llminfra.serving import loadtest_workload
    assert cli_serving.MAX_PREFIXES == loadtest_workload.MAX_PREFIXES
