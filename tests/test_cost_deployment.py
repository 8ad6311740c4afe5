"""The four deployments and the decision helper (llminfra.calc.deployment), worked by hand."""

import pytest

from llminfra.calc.deployment import (OPTIONS, Prices, Requirements, deployment_options,
                                      gpus_needed, rank_deployments)

#: prices used below; inputs of the test, not market prices
PRICES = Prices(api_usd_per_million=5.4, rent_usd_per_gpu_hour=2.0, own_usd_per_gpu_hour=1.2,
                tokens_per_s_per_gpu=1000)


def test_table_has_the_four_options_and_every_column():
    rows = deployment_options()
    assert [r["option"] for r in rows] == list(OPTIONS)
    for r in rows:
        assert set(r) == {"option", "name", "cost", "operations", "data_residency",
                          "model_choice", "wins_when"}
    rows[0]["cost"] = "changed"            # a copy: the next call is unchanged
    assert deployment_options()[0]["cost"] != "changed"


def test_gpus_needed_by_hand():
    """One GPU at 1,000 tokens/s, u = 0.5 serves 1.296e9 tokens in 30 days: 1e9 -> 1 GPU,
    2e9 -> 2, 0 -> still 1 (one replica at least); replicas of 2 GPUs: 3e9 -> 2 replicas ->
    4 GPUs (each replica serves 2.592e9)."""
    assert gpus_needed(1e9, 1000, 0.5) == 1
    assert gpus_needed(2e9, 1000, 0.5) == 2
    assert gpus_needed(0, 1000, 0.5) == 1
    assert gpus_needed(3e9, 1000, 0.5, gpus_per_replica=2) == 4


def test_small_volume_ranks_the_api_first():
    """75 M tokens a month (source 000's example): API 75 · 5.4 = 405 USD; one rented GPU
    2 · 720 = 1,440 USD; owned 1.2 · 720 = 864 USD. With a GPU team: api, own, rented."""
    ranked = rank_deployments(Requirements(75e6, has_gpu_team=True), PRICES)
    assert [r.option for r in ranked] == ["api", "own", "rented", "local"]
    assert ranked[0].monthly_cost_usd == pytest.approx(405)
    assert ranked[1].monthly_cost_usd == pytest.approx(864)
    assert ranked[2].monthly_cost_usd == pytest.approx(1440)
    assert not ranked[3].feasible and "one person" in ranked[3].reasons[0]


def test_large_steady_volume_ranks_self_hosting_first():
    """5e9 tokens a month at u = 0.8: one GPU serves 1000 · 0.8 · 2,592,000 = 2.0736e9, so
    3 GPUs: owned 3 · 1.2 · 720 = 2,592 USD, rented 4,320 USD, API 5,000 · 5.4 = 27,000 USD."""
    ranked = rank_deployments(Requirements(5e9, has_gpu_team=True, utilization=0.8), PRICES)
    assert [r.option for r in ranked[:3]] == ["own", "rented", "api"]
    assert ranked[0].n_gpus == 3
    assert ranked[0].monthly_cost_usd == pytest.approx(2592)
    assert ranked[2].monthly_cost_usd == pytest.approx(27_000)


def test_hard_constraints_and_missing_team():
    """Data may not leave, or an open model is needed: the API is infeasible, with the reason.
    No GPU team: self-hosting stays feasible but follows a cheaper-to-run option."""
    ranked = rank_deployments(Requirements(75e6, data_may_leave=False, needs_open_weights=True,
                                           has_gpu_team=True), PRICES)
    api = next(r for r in ranked if r.option == "api")
    assert not api.feasible
    assert [r.option for r in ranked] == ["own", "rented", "api", "local"]  # feasible first
    assert any("data may not leave" in s for s in api.reasons)
    assert any("open-weights" in s for s in api.reasons)
    assert ranked[0].option == "own"
    no_team = rank_deployments(Requirements(5e9, utilization=0.8), PRICES)
    assert no_team[0].option == "api"
    assert any("no team" in s for s in no_team[1].reasons)
    solo = rank_deployments(Requirements(1e6, single_user=True, data_may_leave=False), PRICES)
    assert solo[0].option == "local" and solo[0].monthly_cost_usd == 0


def test_bad_requirements_are_named():
    with pytest.raises(ValueError, match="utilization must be in"):
        Requirements(1e6, utilization=0)
    with pytest.raises(ValueError, match="monthly_tokens must be >= 0"):
        Requirements(-5)
    with pytest.raises(ValueError, match="gpus_per_replica must be a positive integer"):
        Prices(5.4, 2, 1.2, 1000, gpus_per_replica=0)
    with pytest.raises(ValueError, match="tokens_per_s_per_gpu must be > 0"):
        Prices(5.4, 2, 1.2, 0)
    with pytest.raises(ValueError, match="req must be a Requirements"):
        rank_deployments({"monthly_tokens": 1}, PRICES)


def test_reasons_read_as_sentences_at_any_volume():
    """No exponent in the reasons a learner reads: 2,250,000 M tokens, thousands of GPUs grouped."""
    huge = {o.option: o for o in rank_deployments(Requirements(2.25e12, has_gpu_team=True),
                                                   PRICES)}
    assert huge["api"].reasons[0].startswith("2,250,000 M tokens x ")
    rented = huge["rented"]
    assert rented.n_gpus >= 1000 and rented.reasons[0].startswith(f"{rented.n_gpus:,} GPU(s) at ")
    small = {o.option: o for o in rank_deployments(Requirements(43.02e6), PRICES)}
    assert small["api"].reasons[0].startswith("43.02 M tokens x ")
    assert not any("e+" in r for o in (*huge.values(), *small.values()) for r in o.reasons)
