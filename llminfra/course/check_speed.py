"""Where an exercise's point is speed: a right answer timed against the reference, and a note
"right, but N× slower than …" under its ✓ line when it is much slower (:class:`Speed`).

Rule 6 of :mod:`llminfra.course.checking`. The timing runs on one thread (threads fighting
over a shared CPU time nothing but the fight) and takes the best of a few calls; the factor is
generous, so a loaded machine does not make a right answer slow. Taught in chapter 00 (how
exercises are checked).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from llminfra.course.check_calls import call_learner
from llminfra.course.check_failures import CheckFailed
from llminfra.course.check_inputs import Case, copy_arg

__all__ = ["Speed", "speed_note"]


@dataclass(frozen=True)
class Speed:
    """Where an exercise's point is speed: after every case passed, the answer is timed against
    the reference on ``case`` (inputs large enough to time), and an answer more than ``factor``
    times slower gets ``note: right, but N× slower than <against> — the chapter's point is
    <point>`` under its ✓ line (a failure instead when ``fail``: only where the exercise text
    says so). ``factor`` is generous: a loaded machine does not make a right answer slow."""

    case: Case
    against: str
    point: str
    factor: float = 20.0
    fail: bool = False


def _best_time(fn, case: Case, repeats: int = 3, budget_s: float = 0.5) -> float:
    """The shortest of up to ``repeats`` timed calls (fewer when one call exceeds the budget)."""
    best = math.inf
    for _ in range(repeats):
        args = tuple(copy_arg(a) for a in case.args)
        kwargs = {k: copy_arg(v) for k, v in case.kwargs.items()}
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
        if best > budget_s:
            break
    return best


def speed_note(speed: Speed, name: str, learner, reference, owner) -> str:
    """The note (or, with ``speed.fail``, a raised ``CheckFailed``) for a right answer that is
    much slower than the reference; empty when it is not."""
    import torch  # torch loads on first use: the course's modules import without it
    where = f"timing case: {speed.case.name}"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # threads fighting over a shared CPU time nothing but the fight
    try:
        call_learner(learner, speed.case, name, where, False, owner)  # warm up (must not raise)
        _best_time(reference, speed.case, repeats=1)
        ratio = (_best_time(learner, speed.case, repeats=1)
                 / max(_best_time(reference, speed.case, repeats=3), 1e-9))
        if ratio > speed.factor / 2:  # a closer look: the best of five each
            ratio = (_best_time(learner, speed.case, repeats=5)
                     / max(_best_time(reference, speed.case, repeats=5), 1e-9))
    finally:
        torch.set_num_threads(threads)
    if ratio <= speed.factor:
        return ""
    text = (f"right, but {ratio:.0f}× slower than {speed.against} — the chapter's point is "
            f"{speed.point}")
    if speed.fail:
        raise CheckFailed(f"{name}: {text}\n  {where}")
    return text
