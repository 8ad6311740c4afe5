"""Answer checkers for chapter 05's speculative-decoding exercises: greedy acceptance of
drafts against the target's tokens, and the expected tokens a verification step yields.

As every checker of :mod:`llminfra.course.checks.ch05` (which re-exports these): named cases
from one seed (every category the exercise names first, then random ones), compared with
:mod:`llminfra.engine.spec_decode`; a mismatch names the case, the seed to replay it and the
usual mistake the answer matches (a draft kept after the first mismatch, the bonus token
forgotten, γ terms instead of γ + 1, ``1 + γ·α`` instead of a sum of powers).
"""

from __future__ import annotations

import random

from llminfra.course.checking import Case, checker, first_matching, run_checks, seeded
from llminfra.engine.spec_decode import accept_greedy, expected_tokens_per_step

__all__ = ["check_accept_greedy", "check_expected_tokens"]


def _accept_cases(rng: random.Random) -> list[Case]:
    """Every draft kept (the bonus token), the first rejected, a mismatch in the middle, a
    later draft that matches again after a mismatch (it must not count), no drafts; then
    random ones."""
    cases = [Case("every draft kept", ([5, 6, 7, 8], [5, 6, 7])),
             Case("the first draft rejected", ([2, 6, 7], [9, 6])),
             Case("a mismatch in the middle", ([5, 6, 1, 8], [5, 6, 7])),
             Case("a draft matches again after a mismatch", ([5, 1, 7, 8], [5, 6, 7])),
             Case("no drafts (gamma = 0)", ([4], []))]
    for _ in range(8):
        g = rng.randint(1, 6)
        target = [rng.randint(0, 4) for _ in range(g + 1)]
        drafts = [t if rng.random() < 0.7 else rng.randint(0, 4) for t in target[:g]]
        cases.append(Case("random drafts and target tokens", (target, drafts)))
    return cases


def _accept_hint(args, kw, expected, got) -> str:
    target, drafts = args
    kept = len(expected) - 1
    matches = [d for t, d in zip(target, drafts) if t == d]
    all_kept = kept == len(drafts)
    wrong = {"add the target's own token after the kept drafts: the correction at the first "
             "mismatch": None if all_kept else expected[:-1],
             "when every draft is kept, the target's token after the last draft comes too "
             "(a step yields gamma + 1 tokens then)": drafts if all_kept else None,
             "stop at the FIRST mismatch: a later draft that matches was drafted after a wrong "
             "token, so it cannot be kept": matches + [target[len(matches)]],
             "at the mismatch the target's token replaces the draft (do not keep the draft)":
                 drafts[:kept + 1] if kept < len(drafts) else None}
    return first_matching(got, {k: v for k, v in wrong.items() if v is not None}, expected) \
        or "keep drafts while draft i == target_argmax[i]; then append target_argmax[kept]"


@checker
def check_accept_greedy(fn, seed: int | None = None) -> int:
    """Check ``fn(target_argmax, drafts) -> tokens`` against
    :func:`llminfra.engine.spec_decode.accept_greedy`. ([7, 3, 9], [7, 4]) -> [7, 3]."""
    seed, rng = seeded(seed)
    return run_checks("accept_greedy", fn, accept_greedy, _accept_cases(rng),
                      hint=_accept_hint, seed=seed, replay="ch05.check_accept_greedy")


def _expected_cases(rng: random.Random) -> list[Case]:
    """The worked example, alpha = 0 (every draft rejected), alpha = 1 (every draft kept: the
    closed form divides 0 by 0), gamma = 0; then random ones."""
    cases = [Case("the worked example", (0.5, 2)), Case("alpha = 0", (0.0, 4)),
             Case("alpha = 1", (1.0, 5)), Case("gamma = 0", (0.8, 0))]
    cases += [Case("random alpha and gamma", (round(rng.uniform(0.05, 0.95), 3),
                                              rng.randint(1, 8))) for _ in range(8)]
    return cases


def _expected_hint(args, kw, expected, got) -> str:
    a, g = args
    if a == 1.0:
        return "at alpha = 1 every draft is kept: gamma + 1 tokens (the closed form is 0 / 0)"
    wrong = {"the sum has gamma + 1 terms, 1 + alpha + ... + alpha**gamma: the exponent in the "
             "closed form is gamma + 1": (1 - a ** g) / (1 - a),
             "count the target's own token too: every step yields at least one":
                 a * (1 - a ** g) / (1 - a),
             "the drafts are kept as a prefix (draft i only if all before it were): a sum of "
             "powers, not 1 + gamma * alpha": 1 + g * a}
    return first_matching(got, wrong, expected) or \
        "E = (1 - alpha**(gamma + 1)) / (1 - alpha), and gamma + 1 at alpha = 1"


@checker
def check_expected_tokens(fn, seed: int | None = None) -> int:
    """Check ``fn(alpha, gamma) -> expected tokens per step`` against
    :func:`llminfra.engine.spec_decode.expected_tokens_per_step`. (0.5, 2) -> 1.75."""
    seed, rng = seeded(seed)
    return run_checks("expected_tokens", fn, expected_tokens_per_step, _expected_cases(rng),
                      rel=1e-9, abs_=1e-12, hint=_expected_hint, seed=seed,
                      replay="ch05.check_expected_tokens",
                      on_error=lambda args, kw, e: _expected_hint(args, kw, None, None)
                      if args[0] == 1.0 else "")
