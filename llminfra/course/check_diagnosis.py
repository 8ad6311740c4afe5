"""What the learner reads under a wrong answer: the type or shape to return instead, the usual
mistake whose values the answer matches, or the checker's own hint.

Rules 3 and 7 of :mod:`llminfra.course.checking`: where the reference returns a tensor the
answer must be one (:func:`type_problem`); one number returned where a list is due is named
(:func:`number_for_sequence`); the usual wrong formulas (``mistakes=``) are tried on every case
and the one the answer matches is the hint (:func:`matching_mistake`). Taught in chapter 00
(how exercises are checked).
"""

from __future__ import annotations

import numbers

from llminfra.course.answer_kinds import as_like, kind_mismatch
from llminfra.course.check_inputs import Case, copy_arg
from llminfra.course.compare import compare, describe, is_tensor, scalar_value

__all__ = ["type_problem", "number_for_sequence", "matching_mistake", "mismatch_hint"]


def _shape_problem(expected, got) -> str | None:
    """What to return instead when a tensor in ``got`` has another shape than ``expected``'s
    (a hint's arithmetic assumes the shape: it is not asked then)."""
    if is_tensor(expected) and is_tensor(got) and got.shape != expected.shape:
        return f"return a tensor of shape {tuple(expected.shape)}, not {tuple(got.shape)}"
    if isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)) \
            and len(got) == len(expected):
        for i, (e, g) in enumerate(zip(expected, got)):
            inner = _shape_problem(e, g)
            if inner is not None:
                return f"item {i}: {inner}" if len(expected) > 1 else inner
    return None


def type_problem(expected, got) -> str | None:
    """Where the reference returns a tensor the answer must be one (an exercise that asks for a
    tensor): a NumPy array or a list of the right numbers is named, with what to return."""
    if is_tensor(expected):
        if is_tensor(got):
            return None
        dtype = str(expected.dtype).replace("torch.", "")
        return (f"expected a torch.Tensor (shape {tuple(expected.shape)}, {dtype}), got "
                f"{describe(got)}: return a tensor (torch.as_tensor(x) converts an array or list)")
    if isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)) \
            and len(got) == len(expected):
        for i, (e, g) in enumerate(zip(expected, got)):
            inner = type_problem(e, g)
            if inner is not None:
                return f"item {i}: {inner}"
    return None


def number_for_sequence(expected, got, where: str = "") -> str | None:
    """One number returned where a list is due (a count of the list, or one of its items)."""
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple, str, bytes)) and getattr(got, "ndim", 0) == 0 \
                and scalar_value(got) is not None:
            what = "number" if all(isinstance(e, numbers.Number) for e in expected) else "item"
            return (f"{where}returned one number, {describe(got)}, where a list of "
                    f"{len(expected)} {what}{'s' * (len(expected) != 1)} is due: return the "
                    "list itself, not its length "
                    "or one of its items")
        if isinstance(got, (list, tuple)) and len(got) == len(expected):
            for i, (e, g) in enumerate(zip(expected, got)):
                inner = number_for_sequence(e, g, f"{where}item {i}: ")
                if inner is not None:
                    return inner
    return None


def matching_mistake(mistakes: dict, learner, cases: list, rel: float, abs_: float,
                     normalize, reference) -> str:
    """The usual mistake (a key of ``mistakes``) whose formula gives the answer's values on
    every case where it differs from the reference's — or on most of them, two thirds at
    least; empty when none does. The answer is called again on every case (on copies)."""
    scores = {}
    for case in cases:
        try:
            expected = reference(*case.args, **case.kwargs)
            got = learner(*(copy_arg(a) for a in case.args),
                          **{k: copy_arg(v) for k, v in case.kwargs.items()})
            if normalize is not None:
                got = normalize(expected, got)
        except Exception:  # noqa: BLE001 - a case the answer cannot do says nothing
            continue
        if compare(expected, got, rel, abs_) is None:
            continue
        try:
            values = (mistakes(*case.args, **case.kwargs) if callable(mistakes) else
                      {why: _or_none(wrong, case) for why, wrong in mistakes.items()})
        except Exception:  # noqa: BLE001 - formulas that do not apply to this case
            continue
        for why, value in values.items():
            try:  # closer than the check's tolerance: formulas a few ppm apart stay apart
                hit = value is not None and compare(value, got, min(rel, 1e-9),
                                                    min(abs_, 1e-12)) is None
            except Exception:  # noqa: BLE001
                hit = False
            seen, hits = scores.get(why, (0, 0))
            scores[why] = (seen + 1, hits + hit)
    def score(kv):
        return kv[1][1] / kv[1][0], kv[1][1]
    ranked = sorted(scores.items(), key=score, reverse=True)
    if not ranked or ranked[0][1][1] < max(1, 2 * ranked[0][1][0] / 3):
        return ""
    tied = [why for why, seen_hits in ranked if score((why, seen_hits)) == score(ranked[0])]
    return "; or ".join(tied[:2])  # the answer's values cannot tell these apart


def _or_none(formula, case: Case):
    try:
        return formula(*case.args, **case.kwargs)
    except Exception:  # noqa: BLE001 - a formula that does not apply to this case
        return None


def mismatch_hint(hint, case: Case, expected, got) -> str:
    """What the learner reads under a mismatch: the checker's ``hint`` names the bug; on an
    answer of the wrong kind (a dict, "12 GB", an array for one number …) or shape that its
    arithmetic cannot take, or where it has nothing to say, what to return instead."""
    if isinstance(got, bool) and not isinstance(expected, bool):
        return kind_mismatch(expected, got) or ""  # True is not the number 1 here
    extra = ""
    if hint is not None:
        try:
            extra = hint(case.args, case.kwargs, expected, as_like(expected, got))
        except Exception as e:  # noqa: BLE001 - a broken hint must not hide the mismatch
            extra = (_shape_problem(expected, as_like(expected, got))
                     or kind_mismatch(expected, got)
                     or f"(no hint: the checker's hint failed with {type(e).__name__}: {e})")
    return (extra or kind_mismatch(expected, got)
            or _shape_problem(expected, as_like(expected, got)) or "")
