"""Tests written against two mutants of core rules that survived every test touching them
(issue 54, §8); each test fails on the mutant named in its docstring (checked by applying it).

* The bonus token of speculative sampling — the one more token a verification yields when every
  draft is kept — must be drawn from the target's distribution *after the last draft*, p_γ
  (Leviathan et al. 2023, arXiv:2211.17192, Algorithm 1; Chen et al. 2023, arXiv:2302.01318,
  Algorithm 2). Drawn from p_{γ-1} instead, it is still a valid token from a valid
  distribution, so a test must make the two rows differ.
* RMSNorm divides by sqrt(mean(x²) + ε) (Zhang & Sennrich 2019, arXiv:1910.07467, eq. 4), not
  by sqrt(mean(x²)) + ε: the two agree to 1e-3 for activations of rms ~1, the usual test input,
  and part by about 5 % at rms 0.01 with ε = 1e-5 — so the test uses small activations."""

import math

import pytest
import torch
import torch.nn.functional as F

from llminfra.engine.spec_decode import accept_greedy, rejection_sample
from llminfra.model.transformer import RMSNorm

V = 12


def one_hot_rows(tokens):
    p = torch.zeros(len(tokens), V, dtype=torch.float64)
    p[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return p


@pytest.mark.parametrize("with_q", [False, True])
def test_the_bonus_token_comes_from_the_position_after_the_last_draft(with_q):
    """Every draft is kept (p puts all its mass on it), and p_γ puts all its mass on token 9,
    which no other row holds: the bonus is 9 for every seed. The mutant ``p[k - 1]`` draws the
    last draft again (5), ``p[0]`` the first (3)."""
    drafts = [3, 7, 5]
    p = torch.cat([one_hot_rows(drafts), one_hot_rows([9])])
    q = one_hot_rows(drafts) if with_q else None
    for seed in range(20):
        out = rejection_sample(p, drafts, torch.Generator().manual_seed(seed), q)
        assert out == drafts + [9], (seed, out)


def test_the_bonus_token_follows_the_last_distribution_in_frequency():
    """p_γ = (0.25 on token 1, 0.75 on token 2), the row before it all on token 2: over 4,000
    seeded verifications the bonus is token 1 a quarter of the time (the mutant: never).
    Binomial sd = sqrt(4000 · 0.25 · 0.75) ≈ 27, the band ±150 is over 5 sd."""
    drafts = [4, 2]
    p = torch.cat([one_hot_rows(drafts), torch.zeros(1, V, dtype=torch.float64)])
    p[2, 1], p[2, 2] = 0.25, 0.75
    g = torch.Generator().manual_seed(54)
    bonus = [rejection_sample(p, drafts, g)[-1] for _ in range(4000)]
    assert abs(bonus.count(1) - 1000) < 150 and set(bonus) == {1, 2}


def test_the_greedy_bonus_is_the_target_choice_after_the_last_draft():
    """All drafts kept: the bonus is target_argmax[γ] (8), not target_argmax[γ - 1] (6)."""
    assert accept_greedy([5, 6, 8], [5, 6]) == [5, 6, 8]
    assert accept_greedy([5, 6, 8], [5, 1]) == [5, 6]          # first mismatch: correction


def test_rmsnorm_adds_eps_inside_the_square_root():
    """Worked by hand: x = 0.01 everywhere (rms 0.01, mean(x²) = 1e-4), ε = 1e-5, g = 1:
    y = 0.01 / sqrt(1e-4 + 1e-5) = 1 / sqrt(1.1) = 0.953463 (the mutant, 0.01 / (0.01 + 1e-5),
    gives 0.999001, 4.8 % off)."""
    norm = RMSNorm(8, eps=1e-5)
    y = norm(torch.full((2, 8), 0.01))
    assert torch.allclose(y, torch.full_like(y, 1 / math.sqrt(1.1)), rtol=1e-5, atol=0)


@pytest.mark.parametrize("rms", [1e-3, 1e-2, 1.0])
def test_rmsnorm_equals_its_formula_and_the_fused_op_at_small_activations(rms):
    """Random x of a given rms, random gains: the module equals the formula in float64 and
    PyTorch's fused ``F.rms_norm`` (the fast runner's), to 1e-5 relative."""
    g = torch.Generator().manual_seed(int(-math.log10(rms)))
    x = torch.randn(3, 5, 64, generator=g) * rms
    norm = RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64, generator=g) + 0.5)
        y = norm(x)
    x64 = x.double()
    want = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    assert torch.allclose(y.double(), want, rtol=1e-5, atol=0)
    fused = F.rms_norm(x, (64,), norm.weight.detach(), 1e-5)
    assert torch.allclose(y, fused, rtol=1e-5, atol=1e-7)
