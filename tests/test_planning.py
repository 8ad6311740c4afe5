"""Chapter 10's planner: requirements → traffic → memory → hardware → cost → checklist, and the
common mistakes. Numbers worked by hand in the docstrings."""

import math

import pytest

from llminfra.calc.memory import kv_budget, kv_bytes_per_token, weight_bytes
from llminfra.planning import (MISTAKES, DraftPlan, PlanPrices, ServiceRequirements, compare_gpus,
                               find_mistakes, gpus_for_memory, plan_deployment, traffic)
from llminfra.specs import get_gpu

PRICES = PlanPrices(3.0, 15.0, 3.0)


def test_traffic_worked_example():
    """100,000 requests/day, peak 3×, 500 output tokens at TPOT 0.1 s, TTFT 2 s: λ = 3.472/s,
    W = 52 s, L = ceil(180.6) = 181; peak output 1,736 tokens/s."""
    t = traffic(ServiceRequirements(100_000, 1000, 500))
    assert t.peak_requests_per_s == pytest.approx(3.4722, rel=1e-4)
    assert t.request_duration_s == 52.0 and t.peak_concurrency == 181
    assert t.peak_output_tokens_per_s == pytest.approx(1736.11, rel=1e-5)


def test_gpus_needed_worked_example():
    """Llama-2-13B bf16, 32 × 4,096 tokens on A100-80GB: 133.4e9 B vs 77.31e9 usable → 2."""
    w, k = weight_bytes("llama-2-13b", "bf16"), kv_bytes_per_token("llama-2-13b", "bf16")
    m = get_gpu("a100-80gb").memory_bytes
    assert k == 819_200
    assert gpus_for_memory(w, k, 4096, 32, m) == 2
    assert gpus_for_memory(w, k, 4096, 0, m) == 1
    # exactly full: no extra GPU for a boundary case
    assert gpus_for_memory(0.9 * 100, 1, 0, 0, 100, 0.1) == 1
    assert gpus_for_memory(90 + 1, 1, 1, 0, 100, 0.1) == 2


@pytest.mark.parametrize("concurrency", [1, 7, 30, 64])
def test_gpus_needed_agrees_with_kv_budget(concurrency):
    """One question, one answer: the smallest n with kv_budget(n).max_sequences ≥ C is
    gpus_for_memory with the same activations."""
    model, gpu, ctx = "llama-2-13b", "a100-40gb", 2048
    b1 = kv_budget(model, gpu, context=ctx)
    n = gpus_for_memory(b1.weight_bytes, b1.kv_bytes_per_token, ctx, concurrency,
                    get_gpu(gpu).memory_bytes, activation_bytes=b1.activation_bytes)
    assert kv_budget(model, gpu, context=ctx, num_gpus=n).max_sequences >= concurrency
    if n > 1:
        assert kv_budget(model, gpu, context=ctx, num_gpus=n - 1).max_sequences < concurrency


def test_gpus_needed_rejects_bad_input():
    with pytest.raises(ValueError, match="weight_bytes"):
        gpus_for_memory(-1, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="concurrency"):
        gpus_for_memory(1, 1, 1, 2.5, 1)
    with pytest.raises(ValueError, match="reserve_fraction"):
        gpus_for_memory(1, 1, 1, 1, 1, 1.0)


def test_plan_picks_fewest_gpus_that_meet_targets():
    req = ServiceRequirements(100_000, 1000, 500)
    p = plan_deployment(req, "h100", PRICES)
    assert p.ttft_estimate_s <= req.ttft_target_s and p.tpot_estimate_s <= req.tpot_target_s
    assert p.total_gpus == p.replicas * p.tensor_parallel >= 1
    assert p.max_sequences_per_replica * p.replicas >= p.peak_concurrency
    assert p.replicas * p.replica_tokens_per_s >= p.peak_output_tokens_per_s
    assert 0 < p.utilization <= 1
    groups = {r["group"] for r in p.checklist}
    assert groups == {"memory", "performance", "cost and operations"}


def test_plan_big_model_needs_tensor_parallelism():
    p = plan_deployment(ServiceRequirements(10_000, 2000, 500, model="llama-2-70b"), "a100-80gb", PRICES)
    assert p.tensor_parallel >= 2


def test_plan_respects_data_policy_and_compares_costs():
    req = ServiceRequirements(1_000, 2000, 500, data_may_leave=False)
    p = plan_deployment(req, "l40s", PRICES)
    assert p.recommendation.startswith("self-host")
    low = plan_deployment(ServiceRequirements(100, 2000, 500), "h100", PRICES)
    assert low.recommendation == "hosted API" and low.api_monthly_usd < low.selfhost_monthly_usd
    # 100 requests/day × 30 × (2000 · 3 + 500 · 15) / 1e6 = 40.5 USD
    assert low.api_monthly_usd == pytest.approx(40.5)


def test_plan_rejects_what_cannot_fit_and_bad_input():
    with pytest.raises(ValueError, match="does not fit"):
        plan_deployment(ServiceRequirements(100, 2000, 500, model="llama-2-70b", dtype="fp32"),
                        "rtx-3090", PRICES)
    with pytest.raises(ValueError, match="efficiency"):
        plan_deployment(ServiceRequirements(100, 10, 10), "h100", PRICES, efficiency=0)
    with pytest.raises(ValueError, match="peak_to_mean"):
        ServiceRequirements(100, 10, 10, peak_to_mean=0.5)
    with pytest.raises(ValueError, match="output_tokens"):
        ServiceRequirements(100, 10, 0)
    with pytest.raises(KeyError):
        ServiceRequirements(100, 10, 10, model="gpt-5")
    with pytest.raises(ValueError, match="gpu_hour_usd"):
        PlanPrices(1, 1, -1)


def test_compare_gpus_marks_what_does_not_fit():
    rows = compare_gpus(ServiceRequirements(1000, 1000, 200, model="llama-2-70b"),
                        ["rtx-3090", "h100"], PRICES)
    assert rows[0]["gpu"] == "rtx-3090"
    assert rows[1]["fits"] and rows[1]["total_gpus"] >= 2


BASE = dict(model="llama-2-13b", gpu="a100-80gb", context_tokens=2048, concurrency=4,
            expected_speedup=1.0, batch=8, utilization=0.6)


@pytest.mark.parametrize("code,change", [
    ("weights_only", dict(concurrency=64, context_tokens=4096)),
    ("headline_factor", dict(expected_speedup=24.0, measured_speedup=2.5)),
    ("throughput_over_ttft", dict(batch=256, prompt_tokens=4096, ttft_target_s=0.2)),
    ("naive_pipeline", dict(pipeline_stages=4, micro_batches=1)),
    ("low_utilization", dict(utilization=0.05)),
])
def test_each_mistake_alone(code, change):
    assert find_mistakes(DraftPlan(**BASE)) == set()
    assert find_mistakes(DraftPlan(**{**BASE, **change})) == {code}
    assert code in MISTAKES


def test_mistake_edges():
    """A speed-up measured on one's own set-up is not a mistake; a pipeline with enough
    micro-batches is not naive: 4 stages, 4 micro-batches → bubble 3/7 = 43 % < 50 %."""
    assert find_mistakes(DraftPlan(**{**BASE, "expected_speedup": 2.0,
                                      "measured_speedup": 2.5})) == set()
    assert find_mistakes(DraftPlan(**{**BASE, "pipeline_stages": 4, "micro_batches": 4})) == set()
    with pytest.raises(ValueError, match="DraftPlan"):
        find_mistakes({"model": "x"})
    assert math.isclose(3 / 7, 0.4286, rel_tol=1e-3)


def test_workload_from_means_matches_the_means_and_the_rate():
    import statistics
    import torch
    from llminfra.sim.workload import workload_from_means
    w = workload_from_means(4000, torch.Generator().manual_seed(1), mean_prompt=800,
                            mean_output=200, rate_per_s=4.0)
    assert statistics.mean(r.prompt_len for r in w) == pytest.approx(800, rel=0.05)
    assert statistics.mean(r.output_len for r in w) == pytest.approx(200, rel=0.05)
    assert w[-1].arrival_time_s / (len(w) - 1) == pytest.approx(0.25, rel=0.05)
    again = workload_from_means(4000, torch.Generator().manual_seed(1), mean_prompt=800,
                                mean_output=200, rate_per_s=4.0)
    assert again == w
    with pytest.raises(ValueError, match="mean_output"):
        workload_from_means(1, torch.Generator(), mean_prompt=10, mean_output=0)


def test_simulated_peak_continuous_beats_static_on_ttft():
    """Same seeded peak workload, same GPU: iteration-level admission keeps TTFT low; every
    request finishes."""
    from llminfra.planning import simulate_peak
    req = ServiceRequirements(50_000, 1500, 300, ttft_target_s=1.0)
    cont = simulate_peak(req, "h100", num_requests=60, policy="continuous")
    stat = simulate_peak(req, "h100", num_requests=60, policy="static")
    assert cont["num_requests"] == stat["num_requests"] == 60
    assert cont["ttft_s"]["p99"] < stat["ttft_s"]["p99"]
    assert cont == simulate_peak(req, "h100", num_requests=60, policy="continuous")


def test_each_gpu_is_priced_at_its_own_example_price():
    """A price per GPU type comes before the one for every GPU; the monthly rent is that price ×
    GPUs × 730 h; a GPU with no price at all is a KeyError naming it and the priced ones, and in
    compare_gpus a row with its layout, a NaN cost and that note."""
    from llminfra.calc.cost import gpu_rental_monthly_cost
    from llminfra.planning.plan import EXAMPLE_GPU_HOUR_USD
    req = ServiceRequirements(50_000, 1500, 300, model="llama-3-8b")
    by_gpu = PlanPrices(3.0, 15.0, None, gpu_hour_usd_by_gpu=EXAMPLE_GPU_HOUR_USD)
    for gpu in ("h100", "l40s", "rtx-4090"):
        p = plan_deployment(req, gpu, by_gpu)
        assert p.gpu_hour_usd == EXAMPLE_GPU_HOUR_USD[gpu]
        assert p.selfhost_monthly_usd == pytest.approx(
            gpu_rental_monthly_cost(EXAMPLE_GPU_HOUR_USD[gpu], p.total_gpus))
    assert len({plan_deployment(req, g, by_gpu).gpu_hour_usd for g in ("h100", "l40s")}) == 2
    mixed = PlanPrices(3.0, 15.0, 9.0, gpu_hour_usd_by_gpu={"l40s": 1.0})
    assert (mixed.gpu_hour("l40s"), mixed.gpu_hour("h100")) == (1.0, 9.0)
    with pytest.raises(KeyError, match="no GPU-hour price for 'mi300x'.*'h100'"):
        plan_deployment(req, "mi300x", by_gpu)
    rows = {r["gpu"]: r for r in compare_gpus(req, ["h100", "mi300x"], by_gpu)}
    assert rows["h100"]["gpu_hour_usd"] == 2.69 and "note" not in rows["h100"]
    assert rows["mi300x"]["fits"] and math.isnan(rows["mi300x"]["selfhost_usd_per_month"])
    assert rows["mi300x"]["total_gpus"] >= 1 and "mi300x" in rows["mi300x"]["note"]
    with pytest.raises(ValueError, match="give a GPU-hour price"):
        PlanPrices(3.0, 15.0)
    with pytest.raises(ValueError, match=r"gpu_hour_usd_by_gpu\['h100'\]"):
        PlanPrices(3.0, 15.0, gpu_hour_usd_by_gpu={"h100": float("nan")})
    with pytest.raises(KeyError):
        PlanPrices(3.0, 15.0, gpu_hour_usd_by_gpu={"no-such-gpu": 1.0})
