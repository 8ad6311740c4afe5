"""The colocated vs disaggregated simulator: the transfer time and goodput worked by hand; the
design wins with long prompts under a tight TPOT SLO against an unchunked colocated engine,
chunked prefill closes that gap, a slow link and a decode-heavy load make it lose; every
request is timed; bad input is refused."""

import math

import pytest
import torch

from llminfra.calc.communication import Interconnect
from llminfra.sim.disagg import (RequestTiming, compare_designs, kv_transfer_s,
                                 simulate_colocated, simulate_disaggregated,
                                 slo_goodput)
from llminfra.sim.workload import WorkloadRequest, poisson_arrivals

MODEL, GPU = "llama-3-8b", "h100"
UNCHUNKED = dict(enable_chunked_prefill=False, max_num_batched_tokens=8192)


def _work(n, rate, prompt, output, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [WorkloadRequest(t, prompt, output) for t in poisson_arrivals(n, rate, g)]


@pytest.fixture(scope="module")
def long_prompts():
    return _work(200, 40, 3000, 200)


def test_kv_transfer_worked_by_hand():
    """Llama-2-7B bf16: 2·32·32·128·2 = 524,288 B/token; 1,000 tokens over 25 GB/s =
    0.02097152 s; + 1 ms latency."""
    assert kv_transfer_s("llama-2-7b", 1000, 25e9) == pytest.approx(0.02097152)
    assert kv_transfer_s("llama-2-7b", 1000, "infiniband-hdr", latency_s=1e-3) == \
        pytest.approx(0.02197152)
    assert kv_transfer_s("llama-2-7b", 1000, Interconnect("x", 50e9, "test")) == \
        pytest.approx(0.01048576)


def test_slo_goodput_worked_by_hand():
    """4 requests, last finish at 2 s: TTFT 0.1/0.1/0.1/0.9 (SLO 0.5), TPOT 0.01/0.03/None/
    0.01 (SLO 0.02): requests 0 and 2 meet both → 2 / 2 s = 1 req/s, 0.5 per GPU on 2."""
    t = [RequestTiming(0.0, 0.1, 0.01, 1.0), RequestTiming(0.5, 0.1, 0.03, 1.5),
         RequestTiming(1.0, 0.1, None, 0.1), RequestTiming(1.0, 0.9, 0.01, 1.0)]
    g = slo_goodput(t, 0.5, 0.02, num_gpus=2)
    assert g["slo_attainment"] == 0.5 and g["duration_s"] == 2.0
    assert g["goodput_rps"] == 1.0 and g["goodput_rps_per_gpu"] == 0.5
    assert g["tpot_p50_s"] == pytest.approx(0.01)


def test_disaggregation_wins_long_prompts_tight_tpot(long_prompts):
    r = compare_designs(MODEL, GPU, long_prompts, num_prefill=2, num_decode=2,
                        ttft_slo_s=1.0, tpot_slo_s=0.012, **UNCHUNKED)
    co, dis = r["colocated"], r["disaggregated"]
    assert dis["tpot_p90_s"] < co["tpot_p90_s"]          # no prefill inside a decode step
    assert dis["ttft_p50_s"] > co["ttft_p50_s"]          # half the GPUs read prompts
    assert r["goodput_ratio"] > 1.5


def test_chunked_prefill_closes_the_gap(long_prompts):
    r = compare_designs(MODEL, GPU, long_prompts, num_prefill=2, num_decode=2,
                        ttft_slo_s=1.0, tpot_slo_s=0.012)
    assert r["goodput_ratio"] < 1.2


def test_slow_link_costs_tpot(long_prompts):
    fast = simulate_disaggregated(MODEL, GPU, long_prompts[:80], num_prefill=2, num_decode=2,
                                  **UNCHUNKED)
    slow = simulate_disaggregated(MODEL, GPU, long_prompts[:80], num_prefill=2, num_decode=2,
                                  interconnect=1.25e9, **UNCHUNKED)    # 10 Gb/s Ethernet
    assert slow[0].transfer_s == pytest.approx(3000 * 131072 / 1.25e9)
    f, s = slo_goodput(fast, 1.0, 0.009), slo_goodput(slow, 1.0, 0.009)
    assert s["tpot_p50_s"] > f["tpot_p50_s"] and s["goodput_rps"] < f["goodput_rps"]
    assert [x.ttft_s for x in slow] == [x.ttft_s for x in fast]     # the link is after TTFT


@pytest.mark.slow
def test_decode_heavy_load_leaves_prefill_gpus_idle():
    work = _work(150, 40, 200, 1000)
    r = compare_designs(MODEL, GPU, work, num_prefill=3, num_decode=1, ttft_slo_s=0.5,
                        tpot_slo_s=0.009, **UNCHUNKED)
    assert r["goodput_ratio"] < 1.0
    assert r["disaggregated"]["tpot_p50_s"] > r["colocated"]["tpot_p50_s"]


def test_every_request_timed_and_one_token_requests():
    work = [WorkloadRequest(0.01 * k, 64 + 32 * k, 1 if k % 3 == 0 else 9) for k in range(12)]
    for timings in (simulate_colocated(MODEL, GPU, work, num_gpus=2),
                    simulate_disaggregated(MODEL, GPU, work, num_prefill=1, num_decode=1)):
        assert len(timings) == len(work)
        for w, t in zip(work, timings):
            assert t.arrival_s == w.arrival_time_s and t.ttft_s > 0 and t.e2e_s >= t.ttft_s
            assert (t.tpot_s is None) == (w.output_len == 1)
            assert t.tpot_s is None or t.tpot_s > 0


def test_bad_input():
    work = _work(4, math.inf, 16, 4)
    with pytest.raises(ValueError, match="multiple of tensor_parallel"):
        simulate_colocated(MODEL, GPU, work, num_gpus=3, tensor_parallel=2)
    with pytest.raises(ValueError, match="num_prefill"):
        simulate_disaggregated(MODEL, GPU, work, num_prefill=0, num_decode=1)
    with pytest.raises(KeyError, match="unknown interconnect"):
        simulate_disaggregated(MODEL, GPU, work, num_prefill=1, num_decode=1,
                               interconnect="carrier-pigeon")
    with pytest.raises(ValueError, match="SLOs must be > 0"):
        slo_goodput([RequestTiming(0, 1, 1, 2)], 0, 1)
    with pytest.raises(ValueError, match="no request timings"):
        slo_goodput([], 1, 1)
