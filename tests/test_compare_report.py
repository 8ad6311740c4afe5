"""``llminfra.bench.compare_report``: the plan's bound beside the engines (chapter 10), compared
like with like: a mean request's bound against the engines' means, the output layer once per
prompt, and a compute roof the engines cannot beat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llminfra
from llminfra.bench.compare_report import plan_beside_measured, plan_bound, replan
from llminfra.calc.roofline import Roofline, step_time_s

DATA = Path(llminfra.__file__).parent / "data"


def _server(fmt: str, ttft: tuple[float, float], tpot: tuple[float, float]) -> dict:
    """One server's run at one concurrency: (mean, p50) of TTFT and TPOT."""
    return {"format": fmt, "concurrency": {"2": {
        "num_ok": 4, "prompt_tokens": 4 * 50, "output_tokens_per_s": 100.0,
        "ttft_s": {"mean": ttft[0], "p50": ttft[1]}, "tpot_s": {"mean": tpot[0], "p50": tpot[1]}}}}


def test_the_bound_of_a_mean_request_meets_the_means():
    """Efficiencies divide the bound (mean prompt of 200 / 4 = 50 tokens) by the mean TTFT and
    TPOT, not the medians; an int4 server is not an fp32 engine and is left out."""
    roof = Roofline("cpu", 1e11, 2e10)
    results = {"ours": _server("fp32", (0.5, 0.1), (0.04, 0.01)),
               "theirs": _server("fp32", (0.25, 0.2), (0.08, 0.02)),
               "ours w4a8": _server("int4", (0.1, 0.1), (0.01, 0.01))}
    out = plan_beside_measured("smollm2-135m", roof, results, 8)
    bound = plan_bound("smollm2-135m", roof, 2, 50, 8)
    assert out["2"]["bound"] == bound and set(out["2"]["measured"]) == {"ours", "theirs"}
    for label, (ttft, tpot) in {"ours": (0.5, 0.04), "theirs": (0.25, 0.08)}.items():
        m = out["2"]["measured"][label]
        assert (m["ttft_s"], m["tpot_s"], m["statistic"]) == (ttft, tpot, "mean")
        assert m["efficiency"]["ttft"] == pytest.approx(bound["ttft_s"] / ttft)
        assert m["efficiency"]["tpot"] == pytest.approx(bound["tpot_s"] / tpot)
        assert m["efficiency"]["throughput"] == pytest.approx(100.0 / bound["output_tokens_per_s"])


def test_a_prompt_meets_the_output_layer_once():
    """The TTFT bound is the step with ``logits="last"``: fewer FLOPs than every prompt token
    through SmolLM2's 49,152 × 576 output layer, so a shorter bound on a compute-bound roof."""
    roof = Roofline("cpu", 1e10, 1e12)                    # compute-bound: the FLOPs decide
    got = plan_bound("smollm2-135m", roof, 1, 100, 16)
    assert got["ttft_s"] == step_time_s("smollm2-135m", roof, [(100, 100)], dtype="fp32",
                                        logits="last")
    every = step_time_s("smollm2-135m", roof, [(100, 100)], dtype="fp32")
    assert got["ttft_s"] == pytest.approx(every - 2 * 49_152 * 576 * 99 / 1e10)


def test_the_recorded_engines_sit_under_the_corrected_bound():
    """The recorded ``make compare-engines`` run against its bound on a roof of the servers'
    threads × one core's panel-kernel rate (the recorded ``bench roofline`` run): no engine's
    mean TTFT, mean TPOT or throughput beats it (the run's own bound, on torch's matmul, had
    the engines' median TTFT under it at one client)."""
    rec = json.loads((DATA / "compare_engines_cpu.json").read_text())
    roofs = json.loads((DATA / "bench_roofline_cpu.json").read_text())["compute_roof_by_threads"]
    ran = rec["plan"]["roofline"]
    roof = Roofline("cpu", ran["threads"] * roofs["1"]["flops_per_s"], ran["copy_bytes_per_s"])
    out = replan(rec, roof)
    assert set(out) == set(rec["plan"]["beside_measured"])
    for c, row in out.items():
        assert set(row["measured"]) == {"vllm", "llama.cpp", "llminfra"}
        for label, m in row["measured"].items():
            assert all(0 < e <= 1 for e in m["efficiency"].values()), (c, label, m["efficiency"])
    old = rec["plan"]["beside_measured"]["1"]
    assert old["measured"]["llminfra"]["efficiency"]["ttft"] > 1     # what was wrong
