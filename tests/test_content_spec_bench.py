"""bench spec's two acceptance rates and the formula's prediction (chapter 05 §9, issue 42).

"kept / proposed" counts the drafts after a step's first rejection as not kept; the formula
E = (1 − α^{γ+1}) / (1 − α) needs the chance that a judged draft is kept, kept / (kept + misses).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import llminfra
from llminfra.bench import spec
from llminfra.engine import SpeculativeConfig
from llminfra.engine.spec_decode import expected_tokens_per_step
from llminfra.model import load_tiny

RECORDED = Path(llminfra.__file__).parent / "data" / "bench_spec_cpu.json"


def simulate(alpha: float, gamma: int, steps: int, gen: torch.Generator) -> tuple[int, int, int]:
    """``(kept, misses, proposed)`` of ``steps`` verifications of γ drafts, each kept with
    chance ``alpha`` independently until the first rejection."""
    kept = misses = 0
    for _ in range(steps):
        right = torch.rand(gamma, generator=gen) < alpha
        k = int(right.long().cumprod(0).sum())
        kept += k
        misses += int(k < gamma)
    return kept, misses, steps * gamma


@pytest.mark.parametrize("alpha,gamma", [(0.5, 4), (0.7, 6), (0.9, 2)])
def test_per_draft_acceptance_recovers_alpha_and_kept_over_proposed_does_not(alpha, gamma):
    """Independent drafts: kept / (kept + misses) estimates α; kept / proposed estimates
    (α + … + α^γ) / γ, which is smaller."""
    kept, misses, proposed = simulate(alpha, gamma, 20_000, torch.Generator().manual_seed(42))
    assert spec.per_draft_acceptance(kept, misses) == pytest.approx(alpha, abs=0.01)
    model_kept = sum(alpha ** j for j in range(1, gamma + 1)) / gamma
    assert kept / proposed == pytest.approx(model_kept, abs=0.01)
    assert kept / proposed < alpha - 0.02


def test_prediction_by_hand():
    """No verification: 1 token per step. 10 steps, 4 of them verifying γ = 2 at α = 0.5:
    E = 1 + 0.5 + 0.25 = 1.75 -> (6 + 4 · 1.75) / 10 = 1.3. A mean γ of 2.5 lies halfway
    between E(α, 2) and E(α, 3)."""
    assert spec.predicted_tokens_per_step(10, 0, 0, 0.3) == 1.0
    assert spec.predicted_tokens_per_step(10, 4, 8, 0.5) == pytest.approx(1.3)
    half = (expected_tokens_per_step(0.5, 2) + expected_tokens_per_step(0.5, 3)) / 2
    assert spec.predicted_tokens_per_step(4, 4, 10, 0.5) == pytest.approx(half)
    assert spec.per_draft_acceptance(3, 1) == 0.75 and spec.per_draft_acceptance(0, 0) is None


def test_serve_counts_the_misses():
    """On the tiny model with prompt lookup: misses ≤ verifications, α per draft ≥ kept /
    proposed, and the tokens yielded = generated + kept past the end."""
    model, tok = load_tiny()
    prompts = [tok.encode("the cat sat on the mat. the cat sat on the mat. the cat"),
               tok.encode("def f(x):\n    return x\ndef f(x):\n")]
    r = spec.serve(model, tok, prompts, SpeculativeConfig("ngram", num_speculative_tokens=3), 24)
    assert r["verifications"] > 0
    kept = round(r["acceptance_rate"] * r["draft_tokens"])
    assert 0 <= r["draft_misses"] <= r["verifications"]
    if kept + r["draft_misses"]:
        assert r["per_draft_acceptance"] >= r["acceptance_rate"] - 1e-12
    assert r["kept_past_end"] == kept + r["num_steps"] - r["generation_tokens"] >= 0
    plain = spec.serve(model, tok, prompts, None, 24)
    assert plain["tokens"] == r["tokens"] and plain["draft_misses"] is None


def test_recorded_rows_are_consistent():
    """Every recorded speculative row: α per draft = kept / (kept + misses), the prediction
    recomputes from it, misses ≤ verifications, and kept past the end closes the token count."""
    rec = json.loads(RECORDED.read_text())
    assert rec["misses_recounted"]["counters_equal"]
    for wname, rows in rec["workloads"].items():
        for cname, r in rows.items():
            if cname == "baseline":
                continue
            kept = round(r["acceptance_rate"] * r["draft_tokens"])
            assert math.isclose(r["acceptance_rate"] * r["draft_tokens"], kept, abs_tol=1e-6)
            assert 0 <= r["draft_misses"] <= r["verifications"], (wname, cname)
            assert r["per_draft_acceptance"] == pytest.approx(kept / (kept + r["draft_misses"]))
            assert r["predicted_tokens_per_step"] == pytest.approx(spec.predicted_tokens_per_step(
                r["num_steps"], r["verifications"], r["draft_tokens"], r["per_draft_acceptance"]))
            assert r["kept_past_end"] == kept + r["num_steps"] - r["generation_tokens"] >= 0
