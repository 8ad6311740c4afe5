"""The ramp-up of the request rate (vLLM's ``--ramp-up-strategy``): the rates by hand, fixed
schedules by hand, the random schedule's gaps at the first and last requests and its shape
(linear against exponential), bad settings refused by name, and a run through a mock server."""

import math

import httpx
import pytest
import torch

from llminfra import cli_serving
from llminfra.cli import main
from llminfra.serving.loadtest import run_loadtest
from llminfra.serving.loadtest_stats import format_summary
from llminfra.serving.loadtest_workload import (RAMP_UP_STRATEGIES, RampUp,
                                                check_request_settings, gamma_arrivals,
                                                loadtest_requests, ramp_up_arrivals)


def test_ramp_up_rates_by_hand():
    """p = i / (n − 1). Linear 2 → 10 over 5 requests: 2, 4, 6, 8, 10. Exponential 1 → 16:
    1·16^p = 1, 2, 4, 8, 16. One request: the start rate."""
    assert RampUp("linear", 2, 10).rates(5) == [2, 4, 6, 8, 10]
    assert RampUp("exponential", 1, 16).rates(5) == pytest.approx([1, 2, 4, 8, 16], rel=1e-12)
    assert RampUp("linear", 3, 7).rates(1) == RampUp("exponential", 3, 7).rates(1) == [3]
    # the middle request: the mean of the ends (linear), their geometric mean (exponential)
    assert RampUp("linear", 1, 100).rates(21)[10] == 50.5
    assert RampUp("exponential", 1, 100).rates(21)[10] == pytest.approx(10.0, rel=1e-12)
    assert RAMP_UP_STRATEGIES == cli_serving.RAMP_UP_STRATEGIES == ("linear", "exponential")


def test_fixed_ramp_up_schedules_by_hand():
    """Fixed gaps 1/r_i, request 0 at t = 0. Linear 1 → 3 over 3 requests: rates 1, 2, 3,
    times 0, 1/2, 1/2 + 1/3. Exponential 1 → 4: rates 1, 2, 4, times 0, 0.5, 0.75. The
    first gap is at the second request's rate, the last at the end rate."""
    g = torch.Generator().manual_seed(0)
    lin = ramp_up_arrivals(3, RampUp("linear", 1, 3), g, arrivals="fixed")
    assert lin == pytest.approx([0.0, 0.5, 0.5 + 1 / 3], abs=1e-15)
    exp = ramp_up_arrivals(3, RampUp("exponential", 1, 4), g, arrivals="fixed")
    assert exp == pytest.approx([0.0, 0.5, 0.75], abs=1e-15)
    # through loadtest_requests: the same times; lengths as with no rate (drawn first)
    reqs = loadtest_requests(3, 5, 256, arrivals="fixed", ramp_up=RampUp("linear", 1, 3))
    assert [r.arrival_time_s for r in reqs] == lin
    assert [(r.prompt_len, r.output_len) for r in reqs] == [
        (r.prompt_len, r.output_len) for r in loadtest_requests(3, 5, 256)]


def test_a_flat_ramp_is_gamma_arrivals_draw_for_draw():
    for b in (0.5, 1.0, 3.0):
        flat = ramp_up_arrivals(200, RampUp("linear", 4.0, 4.0), torch.Generator().manual_seed(9),
                                burstiness=b)
        assert flat == gamma_arrivals(200, 4.0, b, torch.Generator().manual_seed(9))


N = 20_001          # p = 1/2 exactly at the middle request, 10,000


def _schedule(strategy, seed=0):
    ramp = RampUp(strategy, 1.0, 100.0)
    t = torch.tensor(ramp_up_arrivals(N, ramp, torch.Generator().manual_seed(seed)),
                     dtype=torch.float64)
    return ramp, torch.tensor(ramp.rates(N), dtype=torch.float64), t


@pytest.mark.parametrize("strategy", RAMP_UP_STRATEGIES)
def test_poisson_ramp_up_gaps_have_their_rates_at_the_first_and_last_requests(strategy):
    """Gap i is exponential with rate r_i, so gap_i · r_i is exponential with mean 1 wherever
    the ramp is: near the start (r ≈ 1/s) and near the end (r ≈ 100/s) alike, 4,000 gaps each
    (standard error 1/√4000 ≈ 1.6 %). The rates run from exactly 1 to 100 requests/s."""
    ramp, r, t = _schedule(strategy)
    z = t.diff() * r[1:]
    assert t[0] == 0.0 and (z >= 0).all()
    assert r[0].item() == 1.0 and r[-1].item() == pytest.approx(100.0, rel=1e-12)
    assert z[:4000].mean().item() == pytest.approx(1.0, rel=0.08)
    assert z[-4000:].mean().item() == pytest.approx(1.0, rel=0.08)
    # the first gaps are ~100 times the last ones
    assert (t.diff()[:4000].mean() / t.diff()[-4000:].mean()).item() > 5
    # deterministic with the seed, another seed another schedule
    assert t.tolist() == _schedule(strategy)[2].tolist() != _schedule(strategy, seed=1)[2].tolist()


def test_linear_and_exponential_shapes():
    """The time to reach the middle request is Σ 1/r_i over its first half, in expectation:
    linear rates climb to 50.5/s by then, exponential ones only to 10/s, so the exponential
    schedule spends about 5 times as long there (≈ 3,900 s against ≈ 790 s); each observed
    half matches its own sum within 5 % (10,000 gaps: standard error 1 %)."""
    mid = N // 2
    half = {}
    for strategy in RAMP_UP_STRATEGIES:
        ramp, r, t = _schedule(strategy)
        expected = (1 / r[1:mid + 1]).sum().item()
        assert t[mid].item() == pytest.approx(expected, rel=0.05)
        assert ramp.span_s(N) == pytest.approx((1 / r[1:]).sum().item(), rel=1e-12)
        half[strategy] = t[mid].item()
    assert _schedule("linear")[1][mid].item() == 50.5
    assert _schedule("exponential")[1][mid].item() == pytest.approx(10.0, rel=1e-12)
    assert half["exponential"] > 3 * half["linear"]


@pytest.mark.parametrize("args, needle", [
    (("step", 1, 2), "ramp-up strategy must be one of linear, exponential, got 'step'"),
    (("linear", 0, 2), "ramp-up start_rps must be a finite number of requests per second > 0"),
    (("linear", -1.0, 2), "start_rps"),
    (("linear", math.nan, 2), "start_rps"),
    (("exponential", 1, math.inf), "end_rps"),
    (("linear", True, 2), "start_rps"),
    (("linear", "1", 2), "start_rps"),
    (("exponential", 3, 2), "ramp-up start_rps 3 is above end_rps 2: the rate ramps up"),
])
def test_bad_ramp_ups_are_refused_by_name(args, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        RampUp(*args)


def test_ramp_up_settings_that_do_not_go_together():
    ramp = RampUp("linear", 1.0, 2.0)
    with pytest.raises(ValueError, match="give it without a rate"):
        check_request_settings(10, 0, rate=1.0, ramp_up=ramp)
    with pytest.raises(ValueError, match="one day"):
        check_request_settings(10, 0, ramp_up=RampUp("linear", 1e-300, 1e-299))
    with pytest.raises(ValueError, match="burstiness 0.5 shapes the gaps"):
        check_request_settings(10, 0, ramp_up=ramp, arrivals="fixed", burstiness=0.5)
    check_request_settings(10, 0, ramp_up=ramp, burstiness=0.5)      # gamma gaps: allowed
    with pytest.raises(ValueError, match="must be a RampUp"):
        check_request_settings(10, 0, ramp_up=("linear", 1.0, 2.0))
    for kwargs in (dict(concurrency=2), dict(rate=1.0), dict(rate=[1.0, 2.0])):
        with pytest.raises(ValueError, match="exactly one of rate"):
            run_loadtest("http://127.0.0.1:9", ramp_up=ramp, progress=False, **kwargs)


LT = ["loadtest", "--base-url", "http://127.0.0.1:9"]
RAMP = ["--ramp-up-strategy", "linear"]


@pytest.mark.parametrize("args, needle", [
    (LT + RAMP + ["--concurrency", "2"],
     "argument --concurrency: not allowed with argument --ramp-up-strategy"),
    (LT + ["--rate", "2"] + RAMP, "argument --ramp-up-strategy: not allowed with argument --rate"),
    (LT + ["--sweep-rates", "1,2"] + RAMP, "not allowed with argument --sweep-rates"),
    (LT + ["--ramp-up-strategy", "step"], "argument --ramp-up-strategy: invalid choice"),
    (LT + RAMP, "--ramp-up-strategy linear needs both --ramp-up-start-rps and "
                "--ramp-up-end-rps (missing --ramp-up-start-rps and --ramp-up-end-rps)"),
    (LT + RAMP + ["--ramp-up-end-rps", "5"], "(missing --ramp-up-start-rps)"),
    (LT + ["--rate", "1", "--ramp-up-start-rps", "1"],
     "--ramp-up-start-rps needs --ramp-up-strategy linear|exponential (in place of --rate)"),
    (LT + ["--concurrency", "1", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2"],
     "--ramp-up-start-rps and --ramp-up-end-rps need --ramp-up-strategy"),
    (LT + RAMP + ["--ramp-up-start-rps", "0", "--ramp-up-end-rps", "2"],
     "argument --ramp-up-start-rps: must be a finite number of requests per second > 0"),
    (LT + RAMP + ["--ramp-up-start-rps", "1", "--ramp-up-end-rps", "nan"],
     "argument --ramp-up-end-rps: must be a finite number"),
    (LT + RAMP + ["--ramp-up-start-rps", "-1", "--ramp-up-end-rps", "2"],
     "argument --ramp-up-start-rps"),
    (LT + RAMP + ["--ramp-up-start-rps", "5", "--ramp-up-end-rps", "2"],
     "--ramp-up-start-rps 5 is above --ramp-up-end-rps 2: the rate ramps up"),
    (LT + RAMP + ["--ramp-up-start-rps", "1e-300", "--ramp-up-end-rps", "1e-299"], "one day"),
    (LT + RAMP + ["--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2", "--arrivals", "fixed",
                  "--burstiness", "2"], "burstiness 2.0 shapes the gaps"),
])
def test_cli_ramp_up_mistakes_are_one_line(args, needle, capsys):
    """Refused before any request: the address leads nowhere."""
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err and err.count("\n") == 1 and "Traceback" not in err


def _mock_server():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 256}]})
        body = "".join(f"data: {x}\n\n" for x in ('{"choices": [{"text": "a"}]}', "[DONE]"))
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})
    return httpx.MockTransport(handler)


def test_ramp_up_run_through_a_mock_server():
    """Fixed gaps from 100 to 400 requests/s over 3 requests (1/250 s, then 1/400 s): the
    settings carry the ramp-up under our names and vLLM's, and the summary says so."""
    r = run_loadtest("http://mock", ramp_up=RampUp("linear", 100.0, 400.0), num_requests=3,
                     arrivals="fixed", progress=False, transport=_mock_server())
    assert r["num_ok"] == 3 and r["max_concurrent_requests"] >= 1
    assert (r["ramp_up_strategy"], r["ramp_up_start_rps"], r["ramp_up_end_rps"]) == (
        "linear", 100.0, 400.0)
    s = r["settings"]
    assert (s["rate"], s["concurrency"], s["arrivals"], s["burstiness"]) == (
        None, None, "fixed", 1.0)
    assert (s["ramp_up_strategy"], s["ramp_up_start_rps"], s["ramp_up_end_rps"]) == (
        "linear", 100.0, 400.0)
    sent = [q["sent_s"] for q in r["requests"]]
    assert sent[1] >= 1 / 250 and sent[2] >= 1 / 250 + 1 / 400
    assert "fixed arrivals, linear ramp-up from 100 to 400 req/s" in format_summary(r)
    plain = run_loadtest("http://mock", rate=100.0, num_requests=1, progress=False,
                         transport=_mock_server())
    assert "ramp_up_strategy" not in plain and plain["settings"]["ramp_up_strategy"] is None
