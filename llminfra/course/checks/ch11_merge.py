"""Answer checker for chapter 11's merge of two partial attention results — what ring
attention repeats on every hop (Liu, Zaharia, Abbeel 2023, Ring Attention, arXiv:2310.01889;
the rescaling of Dao et al. 2022, FlashAttention, arXiv:2205.14135, Algorithm 1).

As every checker of :mod:`llminfra.course.checks.ch11` (which re-exports this one): named cases
from one seed (every edge the exercise names first, then random ones), compared with
:func:`llminfra.attention.merge_partials`; a mismatch names the case, the seed to replay it and
the usual mistake the answer matches: a plain average of the outputs, ``exp(lse)`` without the
max subtracted (overflow), the max instead of the log-sum-exp, weights that do not sum to one.
"""

from __future__ import annotations

import math
import random

import torch

from llminfra.attention import merge_partials
from llminfra.course.checking import Case, CheckFailed, checker, first_matching, run_checks, seeded
from llminfra.course.checking import torch_generator as _gen

__all__ = ["check_merge"]


def _partial(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, lse)`` of attention over one key set: scores ``(..., S)``, values ``(..., S, d)``."""
    return torch.softmax(scores, -1).unsqueeze(-2).matmul(values).squeeze(-2), \
        torch.logsumexp(scores, -1)


def _partials(rng: random.Random, lead: tuple, d: int, scale: float = 1.0,
              offset: float = 0.0) -> tuple:
    """Two partial results over disjoint random key sets: ``(o_a, lse_a, o_b, lse_b)`` with o
    ``(*lead, d)`` and lse ``lead``, float64; scores ~ offset + scale·N(0, 1)."""
    g = _gen(rng)
    out = []
    for S in (rng.randint(1, 12), rng.randint(1, 12)):
        scores = offset + scale * torch.randn(*lead, S, generator=g, dtype=torch.float64)
        values = torch.randn(*lead, S, d, generator=g, dtype=torch.float64)
        out.extend(_partial(scores, values))
    return tuple(out)


def _merge_cases(rng: random.Random) -> list[Case]:
    """The worked example, equal lse, an empty side (lse = -inf, o = 0) on some rows of each
    side, scores ~1e4 (exp overflows), (batch, heads, tokens, d) shapes; then random."""
    f64 = dict(dtype=torch.float64)
    worked = (torch.tensor([[1.0]], **f64), torch.tensor([0.0], **f64),
              torch.tensor([[3.0]], **f64), torch.tensor([math.log(2.0)], **f64))
    o_a, lse_a, o_b, _ = _partials(rng, (5,), 4)
    equal = (o_a, lse_a, o_b, lse_a.clone())
    o_a, lse_a, o_b, lse_b = _partials(rng, (6,), 3)
    empty_a, empty_b = torch.tensor([True, False, False, True, False, False]), \
        torch.tensor([False, True, False, False, False, True])
    o_a, o_b = o_a.masked_fill(empty_a[:, None], 0.0), o_b.masked_fill(empty_b[:, None], 0.0)
    lse_a = lse_a.masked_fill(empty_a, -math.inf)
    lse_b = lse_b.masked_fill(empty_b, -math.inf)
    cases = [Case("the worked example: one row, d=1", worked),
             Case("equal lse on both sides: 5 rows, d=4", equal),
             Case("one side empty (lse = -inf, o = 0) on some rows, a on some, b on others: "
                  "6 rows, d=3", (o_a, lse_a, o_b, lse_b)),
             Case("very large scores (lse ~ 1e4): 4 rows, d=8", _partials(rng, (4,), 8, 3.0, 1e4),
                  nonfinite_hint="exp(lse) overflows when lse ~ 1e4: subtract the max "
                                 "m = max(lse_a, lse_b) before exp"),
             Case("batch 2, heads 3, tokens 5, d=4", _partials(rng, (2, 3, 5), 4))]
    for _ in range(6):
        lead = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
        scale = rng.choice([1.0, 5.0, 30.0])
        cases.append(Case(f"random partials of shape {lead + (4,)}, scores ~N(0, {scale:g}²)",
                          _partials(rng, lead, 4, scale)))
    return cases


def _merge_reference(o_a, lse_a, o_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = merge_partials(o_a, lse_a.unsqueeze(-1), o_b, lse_b.unsqueeze(-1))
    return o, lse.squeeze(-1)


def _merge_answer(expected, got):
    """A pair ``(o, lse)``; a list of two is fine."""
    if not isinstance(got, (list, tuple)) or len(got) != 2:
        raise CheckFailed(f"merge: return a pair (o, lse), got {type(got).__name__}")
    return tuple(got)


def _merge_variants(o_a, lse_a, o_b, lse_b) -> tuple[dict, dict]:
    """The usual mistakes, as ``({hint: wrong o}, {hint: wrong lse})``."""
    m = torch.maximum(lse_a, lse_b)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(lse_a - m_safe)[..., None], torch.exp(lse_b - m_safe)[..., None]
    lse = _merge_reference(o_a, lse_a, o_b, lse_b)[1]
    wrong_o = {"a plain average of o_a and o_b ignores how much softmax mass each side holds: "
               "weight each side by exp(lse_side − lse)": (o_a + o_b) / 2,
               "divide by the sum of the weights, w_a + w_b (each partial o is normalised over "
               "its own keys only; the merged weights must sum to 1)": o_a * w_a + o_b * w_b}
    wrong_lse = {"the union's lse is log(e^lse_a + e^lse_b) = m + log(e^(lse_a − m) + "
                 "e^(lse_b − m)), not the max m": m,
                 "the union's lse is m + log(e^(lse_a − m) + e^(lse_b − m)): add back the max m":
                     lse - m_safe}
    return wrong_o, wrong_lse


def _merge_hint(args, kw, expected, got) -> str:
    o_want, lse_want = expected
    o_got, lse_got = got
    for name, g, e in (("o", o_got, o_want), ("lse", lse_got, lse_want)):
        if not torch.is_tensor(g):
            return f"return {name} as a tensor, got {type(g).__name__}"
        if tuple(g.shape) != tuple(e.shape):
            return (f"{name} has shape {tuple(g.shape)}, expected {tuple(e.shape)} (o: (..., d) "
                    "like o_a, lse: (...) like lse_a)")
    g64 = o_got.double()
    if not bool(torch.isfinite(g64).all()) or not bool(
            (torch.isfinite(lse_got) | torch.isinf(lse_want)).all()):
        return ("the result has inf / nan: exp(lse) overflows for large scores; subtract the "
                "max m = max(lse_a, lse_b) before exp (for a row where one side is empty, m is "
                "the other side's lse)")
    wrong_o, wrong_lse = _merge_variants(*args)
    o_hint = first_matching(g64, wrong_o, o_want, rel=1e-7, abs_=1e-9)
    if o_hint:
        return o_hint
    lse_hint = first_matching(lse_got.double(), wrong_lse, lse_want, rel=1e-7, abs_=1e-9)
    return lse_hint or ("o = (o_a·e^(lse_a − m) + o_b·e^(lse_b − m)) / l and lse = m + log l, "
                        "with m = max(lse_a, lse_b) and l = e^(lse_a − m) + e^(lse_b − m)")


@checker
def check_merge(fn, seed: int | None = None) -> int:
    """Check ``fn(o_a, lse_a, o_b, lse_b) -> (o, lse)`` (o ``(..., d)``, lse ``(...)``) against
    :func:`llminfra.attention.merge_partials`. ``o_a=[[1.]], lse_a=[0.], o_b=[[3.]],
    lse_b=[log 2]`` → ``([[2.3333]], [log 3 = 1.0986])``."""
    seed, rng = seeded(seed)
    return run_checks("merge", fn, _merge_reference, _merge_cases(rng), rel=1e-7, abs_=1e-9,
                      hint=_merge_hint, seed=seed, replay="ch11.check_merge", pure=True,
                      normalize=_merge_answer)
