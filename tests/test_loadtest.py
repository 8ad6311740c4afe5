"""The load generator: arrivals and lengths by hand, then real HTTP against the real server on
the tiny model (closed loop, open loop, errors counted), and the command line."""

import json
import math

import pytest

from llminfra.cli import main
from llminfra.serving.background import ServerThread
from llminfra.serving.loadtest import (RequestRecord, loadtest_requests, percentiles,
                                      prompt_texts, run_loadtest, summarize)


def test_requests_arrivals_and_lengths():
    fixed = loadtest_requests(4, 0, 256, rate=2.0, arrivals="fixed")
    assert [r.arrival_time_s for r in fixed] == [0.0, 0.5, 1.0, 1.5]
    t = [r.arrival_time_s for r in loadtest_requests(4000, 1, 256, rate=10.0)]
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert t[0] == 0.0 and all(g >= 0 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.05)   # mean gap 1 / rate
    assert loadtest_requests(5, 7, 256, rate=3.0) == loadtest_requests(5, 7, 256, rate=3.0)
    for r in loadtest_requests(200, 3, 256, max_output_tokens=50):
        assert r.arrival_time_s == 0.0 and r.prompt_len >= 1 and 1 <= r.output_len <= 50
        assert r.prompt_len + r.output_len <= 256
    with pytest.raises(ValueError, match="rate"):
        loadtest_requests(3, 0, 256, rate=0.0)
    with pytest.raises(ValueError, match="arrivals"):
        loadtest_requests(3, 0, 256, rate=1.0, arrivals="bursty")


def test_prompts_have_their_length():
    assert [len(s.encode()) for s in prompt_texts([1, 17, 128])] == [1, 17, 128]
    assert len(prompt_texts([10], chars_per_token=4.0)[0]) == 40


def test_percentiles_and_summary_by_hand():
    """Values 1..4: mean 2.5, p50 2.5, p90 3.7 (linear interpolation)."""
    p = percentiles([1.0, 2.0, 3.0, 4.0, math.nan])
    assert p["mean"] == 2.5 and p["p50"] == 2.5 and p["p90"] == pytest.approx(3.7)
    ok = RequestRecord(0, 5, 3, sent_s=0.0, first_token_s=0.5, done_s=0.9, output_tokens=3)
    bad = RequestRecord(1, 5, 3, error="HTTP 400")
    s = summarize([ok, bad], wall_s=2.0)
    assert (s["num_ok"], s["num_errors"], s["output_tokens"]) == (1, 1, 3)
    assert s["output_tokens_per_s"] == 1.5
    assert s["ttft_s"]["p50"] == 0.5 and s["tpot_s"]["p50"] == pytest.approx(0.2)


@pytest.fixture(scope="module")
def server(one_thread):
    from llminfra.engine import LLMEngine
    from llminfra.serving.server import create_app
    from llminfra.model import load_tiny
    model, tok = load_tiny()
    with ServerThread(create_app(LLMEngine(model, tok, num_blocks=128), tok)) as srv:
        yield srv


def test_closed_loop_against_the_server(server):
    r = run_loadtest(server.base_url, concurrency=4, num_requests=8, max_output_tokens=8,
                     progress=False)
    expected = sum(r.output_len for r in loadtest_requests(8, 0, 256, max_output_tokens=8))
    assert r["num_ok"] == 8 and r["num_errors"] == 0
    assert r["output_tokens"] == expected              # every request got all its tokens
    assert r["settings"]["max_model_len"] == 256       # read from /v1/models
    assert 0 < r["ttft_s"]["p50"] <= r["e2e_s"]["p50"]
    assert r["output_tokens_per_s"] > 0


def test_open_loop_and_errors_counted(server):
    r = run_loadtest(f"{server.base_url}/v1", rate=20.0, num_requests=6, max_output_tokens=4,
                     arrivals="fixed", progress=False)
    assert r["num_ok"] == 6
    # lengths drawn for a 2048-token context do not all fit the 256-token model: 400s counted
    r = run_loadtest(server.base_url, concurrency=4, num_requests=12, max_model_len=2048,
                     max_output_tokens=4, progress=False, seed=5)
    too_long = sum(r.prompt_len + r.output_len > 256
                   for r in loadtest_requests(12, 5, 2048, max_output_tokens=4))
    assert too_long > 0 and r["num_errors"] == too_long
    assert all(e.startswith("HTTP 400") for e in r["errors"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="exactly one"):
        run_loadtest("http://127.0.0.1:9", rate=1.0, concurrency=2)
    with pytest.raises(ValueError, match="no OpenAI-compatible model list"):
        run_loadtest("http://127.0.0.1:9", concurrency=2, num_requests=1, timeout_s=2)


def test_cli_writes_json(server, tmp_path, capsys):
    path = tmp_path / "lt.json"
    assert main(["loadtest", "--base-url", server.base_url, "--concurrency", "2",
                 "--requests", "3", "--max-output-tokens", "3", "--no-progress",
                 "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "throughput" in out and "TTFT (ms)" in out
    data = json.loads(path.read_text())
    assert data["num_ok"] == 3 and data["settings"]["concurrency"] == 2
    assert main(["loadtest", "--base-url", "http://127.0.0.1:9", "--rate", "1",
                 "--requests", "1"]) == 2


def test_sweep_goodput_bursty_shared_prefix_against_the_server(server, tmp_path, capsys):
    """vLLM-style run on the real server: two rates, gamma arrivals, two shared prefixes of 16
    tokens, SLOs loose enough for every request; one summary a rate, vLLM's names in each."""
    path = tmp_path / "sweep.json"
    assert main(["loadtest", "--base-url", server.base_url, "--rate", "20,40",
                 "--requests", "4", "--max-output-tokens", "4", "--burstiness", "0.5",
                 "--prefix-tokens", "16", "--num-prefixes", "2", "--goodput", "ttft:60000",
                 "tpot:60000", "e2el:60000", "--no-progress", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("inter-token (ms)") == 2 and out.count("goodput:") == 2
    data = json.loads(path.read_text())
    assert data["rates"] == [20.0, 40.0] and data["num_ok"] == 8
    for run, rate in zip(data["sweep"], (20.0, 40.0)):
        assert run["settings"]["rate"] == rate and run["settings"]["prefix_tokens"] == 16
        assert run["completed"] == 4 and run["failed"] == 0
        assert run["request_goodput"] == pytest.approx(run["request_throughput"])
        assert all(p["prompt_len"] > 16 for p in run["requests"])
        gaps = [g for p in run["requests"] for g in p["itl_s"]]
        assert len(gaps) > 0 and run["mean_itl_ms"] == pytest.approx(1e3 * sum(gaps) / len(gaps))
        assert 0 < run["median_ttft_ms"] <= run["median_e2el_ms"]


def test_cli_ramp_up_against_the_server(server, tmp_path, capsys):
    """vLLM's ramp-up on the real server: exponential from 20 to 80 requests/s over 4
    requests; the ramp-up and the peaks in the summary and in the JSON, our names and vLLM's."""
    path = tmp_path / "ramp.json"
    assert main(["loadtest", "--base-url", server.base_url, "--ramp-up-strategy", "exponential",
                 "--ramp-up-start-rps", "20", "--ramp-up-end-rps", "80", "--requests", "4",
                 "--max-output-tokens", "4", "--no-progress", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "poisson arrivals, exponential ramp-up from 20 to 80 req/s" in out
    assert "peak:" in out and "requests in flight" in out
    data = json.loads(path.read_text())
    assert data["num_ok"] == 4 and data["settings"]["rate"] is None
    assert (data["ramp_up_strategy"], data["ramp_up_start_rps"], data["ramp_up_end_rps"]) == (
        "exponential", 20.0, 80.0)
    assert data["settings"]["ramp_up_strategy"] == "exponential"
    assert 1 <= data["max_concurrent_requests"] == data["peak_concurrent_requests"] <= 4
    assert 1 <= data["max_output_tokens_per_s"] == data["peak_output_tokens_per_s"] <= 16
