"""The planner's latency model (llminfra.planning.predict) against the AIConfigurator record it
was fitted to: the held-back points within ±25 %, the record's bounds equal to the roofline's
today, sane directions, clear errors, and plan_deployment using it."""

import json
from pathlib import Path

import pytest

import llminfra
from llminfra.calc.roofline import ttft_s
from llminfra.planning import (PlanPrices, ServiceRequirements, plan_deployment,
                               predict_latency)
from llminfra.planning.efficiency_fit import held_back
from llminfra.planning.predict import load_efficiencies

DATA = Path(llminfra.__file__).parent / "data"
RECORD = json.loads((DATA / "compare_planner.json").read_text())
TABLE = load_efficiencies()
KEYS = ("scenario", "model", "dtype", "gpu", "tp", "batch", "isl", "osl")
ESTIMATED = [p for p in RECORD["points"] if "aic_error" not in p]


def _predict(p: dict) -> dict:
    return predict_latency(p["model"], p["gpu"], tensor_parallel=p["tp"], batch=p["batch"],
                           input_tokens=p["isl"], output_tokens=p["osl"], dtype=p["dtype"])


def test_the_held_back_points_are_the_rule_s_and_not_fitted_on():
    """The table names the points its fit did not see; they are what efficiency_fit's rule
    holds back from this record (every scenario point, a quarter of the grid), none of them
    among the points it was fitted on."""
    stored = [tuple(h[k] for k in KEYS) for h in TABLE["held_back"]]
    rule = [tuple(p[k] for k in KEYS) for p, h in zip(ESTIMATED, held_back(ESTIMATED)) if h]
    assert stored == rule
    assert {s for s, *_ in stored} >= {"grid", "capstone", "public chatbot"}
    assert TABLE["fitted_on"]["points"] == len(ESTIMATED) - len(stored) > len(stored)
    assert TABLE["fitted_to"]["aiconfigurator"] == RECORD["environment"]["aiconfigurator"]


def test_held_back_points_within_25_percent_of_aiconfigurator():
    """TTFT and TPOT of every held-back point within ±25 % of AIConfigurator's estimate (the
    issue's target); the flat 50 % the planner used before misses most of them."""
    held = {tuple(h[k] for k in KEYS) for h in TABLE["held_back"]}
    points = [p for p in ESTIMATED if tuple(p[k] for k in KEYS) in held]
    misses, flat_misses = [], 0
    for p in points:
        got = _predict(p)
        for key in ("ttft", "tpot"):
            ratio = got[f"{key}_s"] / (p[f"aic_{key}_ms"] / 1e3)
            if not 0.75 <= ratio <= 1.25:
                misses.append(f"{key} {ratio:.3f} at {dict((k, p[k]) for k in KEYS)}")
            flat = p[f"bound_{key}_ms"] / 0.5 / p[f"aic_{key}_ms"]
            flat_misses += not 0.75 <= flat <= 1.25
    assert len(points) > 200
    assert not misses, "\n".join(misses)
    assert flat_misses > len(points)


def test_the_record_s_bounds_are_today_s_roofline():
    """Each recorded bound is what llminfra.calc.roofline gives now (a changed step model
    would make the record, and the efficiencies fitted to it, stale)."""
    for p in ESTIMATED[::7]:
        got = _predict(p)
        assert got["ttft_bound_s"] * 1e3 == pytest.approx(p["bound_ttft_ms"], rel=1e-9)
        assert got["tpot_bound_s"] * 1e3 == pytest.approx(p["bound_tpot_ms"], rel=1e-9)


MODELS = ("llama-3-8b", "llama-3-70b", "qwen3-30b-a3b", "mistral-7b")
GPUS = ("h100", "h200", "a100-80gb", "l40s", "mi300x")
#: (GPU, tensor-parallel size) whose decode all-reduces fall off a cliff past a million values
#: (tokens x hidden size): AIConfigurator's own tokens a second fall there as the batch grows
CLIFFS = {("l40s", 8)}


def test_the_cliff_is_aiconfigurator_s():
    """On each of CLIFFS AIConfigurator's record itself has Llama-3-70B decode fewer tokens a
    second at batch 128 (a million values an all-reduce) than at batch 64: the fit follows it,
    and test_directions does not ask the throughput to rise past batch 64 there."""
    for gpu, tp in CLIFFS:
        tpot = {p["batch"]: p["aic_tpot_ms"] for p in ESTIMATED
                if (p["model"], p["gpu"], p["tp"], p["isl"], p["scenario"])
                == ("llama-3-70b", gpu, tp, 1024, "grid")}
        assert 128 / tpot[128] < 64 / tpot[64], (gpu, tp, tpot)


@pytest.mark.parametrize("model", MODELS)
def test_directions(model):
    """Slower than the bound, never faster; a bigger batch (4× steps, the knots' spacing) never
    lowers a sequence's TPOT nor the TTFT, and raises the tokens a second (up to batch 64 on
    CLIFFS); a longer prompt takes longer to its first token. On fitted GPUs and on one outside
    the fit (mi300x, fallback)."""
    for gpu in GPUS:
        for tp in (1, 2, 8):
            prev = None
            for batch in (1, 4, 16, 64, 256):
                r = predict_latency(model, gpu, tensor_parallel=tp, batch=batch,
                                    input_tokens=1024, output_tokens=256)
                assert r["ttft_s"] >= r["ttft_bound_s"] and r["tpot_s"] >= r["tpot_bound_s"]
                assert 0 < r["prefill_efficiency"] <= 1 and 0 < r["decode_efficiency"] <= 1
                if prev:
                    assert r["tpot_s"] >= prev["tpot_s"], (gpu, tp, batch)
                    assert r["ttft_s"] > prev["ttft_s"], (gpu, tp, batch)
                    if batch <= 64 or (gpu, tp) not in CLIFFS:
                        assert batch / r["tpot_s"] > (batch / 4) / prev["tpot_s"], (gpu, tp,
                                                                                   batch)
                prev = r
            ttfts = [predict_latency(model, gpu, tensor_parallel=tp, batch=1, input_tokens=n,
                                     output_tokens=128)["ttft_s"] for n in (64, 256, 1024, 4096)]
            assert ttfts == sorted(ttfts), (gpu, tp, ttfts)


def test_bad_input_is_named():
    kw = dict(tensor_parallel=1, batch=1, input_tokens=100, output_tokens=10)
    with pytest.raises(KeyError, match="gpt-5"):
        predict_latency("gpt-5", "h100", **kw)
    with pytest.raises(KeyError, match="h900"):
        predict_latency("llama-3-8b", "h900", **kw)
    with pytest.raises(ValueError, match=r"tensor_parallel must be one of \[1, 2, 4, 8\]"):
        predict_latency("llama-3-8b", "h100", **{**kw, "tensor_parallel": 3})
    with pytest.raises(ValueError, match="tensor_parallel"):
        predict_latency("llama-3-8b", "h100", **{**kw, "tensor_parallel": True})
    for name, bad in (("batch", 0), ("input_tokens", 2.5), ("output_tokens", -1)):
        with pytest.raises(ValueError, match=name):
            predict_latency("llama-3-8b", "h100", **{**kw, name: bad})
    with pytest.raises(TypeError):
        predict_latency("llama-3-8b", "h100", 1, 1, 100, 10)        # keywords only


def test_plan_deployment_uses_the_prediction():
    """The plan's TTFT is one prompt's on an idle replica and its TPOT the one at its batch,
    both predict_latency's; an explicit efficiency still divides the plain bounds."""
    req = ServiceRequirements(50_000, 1500, 300, model="llama-3-8b")
    prices = PlanPrices(3.0, 15.0, 2.69)
    plan = plan_deployment(req, "h100", prices)
    kw = dict(tensor_parallel=plan.tensor_parallel, input_tokens=1500, output_tokens=300)
    assert plan.ttft_estimate_s == pytest.approx(
        predict_latency("llama-3-8b", "h100", batch=1, **kw)["ttft_s"], rel=1e-12)
    assert plan.tpot_estimate_s == pytest.approx(predict_latency(
        "llama-3-8b", "h100", batch=plan.batch_per_replica, **kw)["tpot_s"], rel=1e-12)
    flat = plan_deployment(req, "h100", prices, efficiency=0.5)
    assert flat.ttft_estimate_s != pytest.approx(plan.ttft_estimate_s, rel=1e-3)
    assert flat.ttft_estimate_s == pytest.approx(ttft_s(
        "llama-3-8b", "h100", 1500, logits="last", tensor_parallel=flat.tensor_parallel) / 0.5)
    with pytest.raises(ValueError, match="efficiency must be None"):
        plan_deployment(req, "h100", prices, efficiency=1.5)


def test_refit_only_needs_no_aiconfigurator_but_a_fit_path(capsys):
    """``--refit-only`` reads the record instead of running AIConfigurator, so it asks for
    ``--fit`` only; without it ``--aic-python`` is required. Both are refused before any work."""
    from llminfra.planning.compare_planner import main
    record = str(DATA / "compare_planner.json")
    with pytest.raises(SystemExit):
        main(["--refit-only", "--json", record])
    assert "--refit-only needs --fit" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--json", record])
    assert "--aic-python is required" in capsys.readouterr().err
