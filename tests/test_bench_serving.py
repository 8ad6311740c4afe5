"""bench serving: the suite is registered, serves a workload through the real engine, and its
table and targets read the result (timings are not checked here: only in the bench run)."""

import pytest
import torch

from llminfra.bench import SUITES, load_suite
from llminfra.bench import serving
from llminfra.model import ByteTokenizer, ModelConfig, Transformer
from llminfra.sim.workload import WorkloadRequest

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=64)


def test_registered():
    assert SUITES["serving"] == "llminfra.bench.serving"
    assert load_suite("serving") is serving


def test_serve_and_decode_rate(one_thread):
    model = Transformer(CFG).eval()
    work = [WorkloadRequest(0.0, 5, 3), WorkloadRequest(0.01, 9, 4)]
    done, engine = serving.serve(model, ByteTokenizer(), work, [[1] * 5, [2] * 9],
                                    record=True, max_num_seqs=2, max_num_batched_tokens=16)
    assert sorted(o.metrics.num_output_tokens for o in done) == [3, 4]
    assert engine.step_log and engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    assert serving.decode_rate(model, 4, 2) > 0


def test_targets_and_table_read_the_result():
    r = {"throughput_tokens_per_s": {"static": 100.0, "dynamic": 120.0, "continuous": 250.0},
         "ttft_p50_s": dict.fromkeys(serving.POLICIES, 0.1),
         "ttft_p99_s": dict.fromkeys(serving.POLICIES, 0.5),
         "decode_tokens_per_s": {"tiny": {"1": 50.0, "4": 150.0, "16": 400.0, "64": 800.0},
                                 "bench-100m": {"1": 10.0, "4": 30.0, "16": 45.0, "64": 60.0}},
         "decode_floor_s": {"tiny": 0.001, "bench-100m": 0.05},
         "chunked_prefill": {"short_ttft_p50_s_on": 0.2, "short_ttft_p50_s_off": 0.9,
                             "long_ttft_p50_s_on": 0.8, "long_ttft_p50_s_off": 0.5},
         "simulator_calibration": {"overhead_s": 0.004, "residual_rms_s": 0.002,
                                   "relative_error_median": 0.1,
                                   "simulated_throughput_tokens_per_s": 240.0,
                                   "measured_throughput_tokens_per_s": 250.0}}
    t = serving.targets(r)
    assert t["continuous_over_static"] == 2.5 and t["continuous_over_static_met"]
    assert t["bench100m_b16_over_b1"] == 4.5 and not t["bench100m_b16_over_b1_met"]
    assert t["bench100m_b1_over_floor"] == 2.0 and t["bench100m_b1_over_floor_met"]
    r["targets"] = t
    table = serving.format_table(r)
    assert "continuous" in table and "250" in table and "4.5" in table


def test_http_vs_engine_target_read_from_the_result():
    """The key the server helper adds: HTTP tokens/s over in-process tokens/s, target >= 0.7."""
    http = {"http_vs_engine": 0.65, "concurrency": 16, "http_output_tokens_per_s": 65.0,
            "engine_output_tokens_per_s": 100.0}
    r = {"throughput_tokens_per_s": {"static": 1.0, "dynamic": 1.0, "continuous": 2.0},
         "decode_tokens_per_s": {"bench-100m": {"1": 1.0, "16": 5.0}},
         "decode_floor_s": {"bench-100m": 1.0}, "http": http}
    t = serving.targets(r)
    assert t["http_vs_engine"] == 0.65 and not t["http_vs_engine_met"]


@pytest.mark.slow
def test_http_vs_engine_runs_the_server_both_ways(one_thread):
    """The real measurement, small: the same requests in process and over HTTP, with the
    server's engine in a process of its own and in a thread; every run returns every token."""
    from llminfra.bench.serving_http import run_http_vs_engine
    r = run_http_vs_engine(num_requests=4, concurrency=2, max_output_tokens=4)
    assert r["output_tokens"] == 16
    for key in ("http_vs_engine", "http_vs_engine_thread"):
        assert 0 < r[key] < 10, (key, r)
    assert r["http_vs_engine"] == r["http_output_tokens_per_s"] / r["engine_output_tokens_per_s"]
    assert r["engine_output_tokens_per_s"] == max(r["engine_output_tokens_per_s_runs"])


def test_compare_policies_keeps_each_policys_best_run(one_thread):
    model = Transformer(CFG).eval()
    work = [WorkloadRequest(0.0, 5, 3), WorkloadRequest(0.0, 9, 6), WorkloadRequest(0.0, 4, 2)]
    prompts = [[1] * 5, [2] * 9, [3] * 4]
    res = serving.compare_policies(model, ByteTokenizer(), work, prompts, repeats=2)
    for p in serving.POLICIES:
        assert len(res["runs"][p]) == 2
        assert res["summary"][p]["throughput_tokens_per_s"] == max(res["runs"][p])
    assert res["step_log"], "the continuous run's step log is kept"
    try:
        serving.compare_policies(model, ByteTokenizer(), work, prompts, repeats=0)
    except ValueError as e:
        assert "repeats" in str(e)
    else:
        raise AssertionError("repeats=0 accepted")


def test_run_measures_on_one_thread_and_restores_the_setting(monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []
    monkeypatch.setattr(serving, "_run", lambda quick: seen.append(torch.get_num_threads()) or {})
    try:
        serving.run(quick=True)
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
