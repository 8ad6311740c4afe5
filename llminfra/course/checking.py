"""The checker framework: try the learner's function on named cases against the package.

A checker builds its cases from one seed: the cases every instruction names (an all-zero group, a
grouped-query layout, a negative result to clip, a tie…) are always there, the rest drawn fresh
from the seed, so a hard-coded answer does not pass and every failure can be replayed with
``check_x(fn, seed=N)``. The learner's result is compared with the package's reference by
:func:`compare`, which accepts any type that holds the right value (a list, tuple, NumPy array or
tensor of the right numbers; an int, float, ``Fraction``, ``Decimal``, NumPy or 0-d tensor
scalar; a float32 answer at float32's precision, a count exactly) and, on a mismatch, says where
the first difference is and how large the largest one is — never a full tensor
(:mod:`llminfra.course.compare`). The first failing case raises :class:`CheckFailed` naming the
case, the seed, the mismatch and a hint. Whatever goes wrong inside a checker itself is reported
as :class:`CheckFailed` too, never as a traceback from inside torch.

The rules :func:`run_checks` holds every checker to (issue 53):

1. the answer gets copies of the inputs, and changing one in place fails ("your function
   changed its input `x` in place"), unless a checker passes ``pure=False``;
2. a right answer is not judged by how it allocates: the NaN watch of ``Case.nonfinite_hint``
   ignores ``torch.empty``'s uninitialised memory;
3. where the reference returns a tensor (the exercise asks for one) the answer must be a tensor:
   a NumPy array or a list of the right numbers is told the type expected;
4. / 5. the cases that separate right from wrong are fixed and in every run, and random cases
   drawn fresh from the seed decide too (``tests/test_checks_rules.py`` gives every checker one
   verdict over 50 seeds, and fails an answer that remembers earlier runs);
6. where speed is the lesson, :class:`Speed` times a right answer against the reference and
   notes "right, but N× slower than …";
7. ``mistakes``: the usual wrong formulas are tried on every case, and the one the answer's
   values match is named;
8. only the exercise's own stub, ``raise NotImplementedError("your code here")``, is
   :class:`NotAttempted` (``status == "not attempted"``, ``ename`` ``NotAttempted`` in a
   notebook's output); torch's ``NotImplementedError`` (an op without a kernel for a dtype) is
   an attempt that failed, a :class:`CheckFailed` (``status == "failed"``);
9. every message is at most :data:`MAX_LINES` lines; a tensor in the learner's own exception is
   summarised by shape and dtype (:func:`error_text`).

The machinery sits beside this module, one concept each: :mod:`~llminfra.course.check_failures`
(the exceptions and the rules of a message), :mod:`~llminfra.course.check_inputs` (cases, the
copies handed to the answer, inputs changed in place), :mod:`~llminfra.course.check_calls` (one
call of the answer: the stub, the NaN watch), :mod:`~llminfra.course.check_diagnosis` (the type
expected, the named mistake, the hint) and :mod:`~llminfra.course.check_speed` (:class:`Speed`).
This module holds the seeds and :func:`run_checks`, and every name a checker imports.

On success one line is printed that does not depend on the seed, so solution notebooks stay
deterministic under nbval. Taught in chapter 00 (how exercises are checked).
"""

from __future__ import annotations

import functools
import logging
import random
from typing import Any, Callable, Iterable

from llminfra.course.answer_kinds import as_like
from llminfra.course.check_calls import call_learner
from llminfra.course.check_diagnosis import (matching_mistake, mismatch_hint, number_for_sequence,
                                             type_problem)
from llminfra.course.check_failures import (MAX_LINES, STUB_MESSAGE, CasesPassed, CheckFailed,
                                            NotAttempted, error_text, fit_message,
                                            render_check_failure)
from llminfra.course.check_inputs import Case, as_case, copy_arg
from llminfra.course.check_speed import Speed, speed_note
from llminfra.course.compare import compare, describe, first_matching

log = logging.getLogger(__name__)

__all__ = ["CheckFailed", "NotAttempted", "CasesPassed", "Case", "Speed", "run_checks",
           "compare", "first_matching", "as_like", "seeded", "fresh_rng", "torch_generator",
           "checker", "describe", "fit_message", "error_text", "STUB_MESSAGE", "MAX_LINES",
           "render_check_failure"]


# ------------------------------------------------------------------------- seeds
def seeded(seed: int | None = None) -> tuple[int, random.Random]:
    """``(seed, random.Random(seed))``; a fresh seed (0 … 999,999) when ``seed`` is None,
    logged at INFO (the test suite shows it beside any failure: ``conftest.py``)."""
    if seed is None:
        seed = random.SystemRandom().randrange(1_000_000)
        log.info("fresh checker seed %d (replay with seed=%d)", seed, seed)
    return seed, random.Random(seed)


def fresh_rng() -> random.Random:
    """A generator seeded from the OS (older checkers; new ones use :func:`seeded`)."""
    return random.Random()


def torch_generator(rng: random.Random):
    """A ``torch.Generator`` seeded from ``rng``: tensors replayable from the case seed, never
    the global torch random state."""
    import torch
    return torch.Generator().manual_seed(rng.randrange(2**31))


# ------------------------------------------------------------------------- the run
def run_checks(name: str, learner: Callable, reference: Callable,
               cases: Iterable[Case | tuple[tuple, dict]], rel: float = 1e-9, abs_: float = 0.0,
               hint: Callable[[tuple, dict, Any, Any], str] | None = None,
               seed: int | None = None, replay: str | None = None, pure: bool = True,
               normalize: Callable[[Any, Any], Any] | None = None, owner: Any = None,
               on_error: Callable[[tuple, dict, Exception], str] | None = None,
               speed: Speed | None = None,
               mistakes: dict[str, Callable] | Callable[..., dict] | None = None) -> int:
    """Call ``learner`` and ``reference`` on every case; raise :class:`CheckFailed` at the first
    disagreement, naming the case, the seed, where the values differ and ``hint(args, kwargs,
    expected, got)`` (a diagnosis; a hint that fails says so instead).

    The rules every checker follows (issue 53): the learner gets copies of the inputs and
    fails when it changed one (``pure``, on unless an exercise's point is to change it); where
    the reference returns a tensor the answer must be a tensor; a ``NotImplementedError`` is
    "not attempted" only from the exercise's stub; every message is at most three lines;
    ``speed`` times a right answer where speed is the lesson (:class:`Speed`);
    ``mistakes`` (what to say → the usual wrong formula, called like the reference; or one
    function of the case's arguments returning that dict of values) are tried on every case,
    and the one the answer matches on all of them (or the most) is the hint.

    ``normalize(expected, got)`` may convert or validate the answer first (raise
    :class:`CheckFailed` for a wrong type). ``replay``: how to call this checker again
    (``"ch02.check_largest_batch"``), with ``seed``. ``owner``: the learner's own function or
    class when ``learner`` wraps it (a ``NotImplementedError`` raised there means "not
    attempted"; elsewhere it names the stub). ``on_error(args, kwargs, exception)``: a hint
    when the learner's code raises. Returns the number of cases checked, after printing
    ``✓ name: N random cases passed``.
    """
    if not callable(learner):
        raise CheckFailed(f"{name}: expected a function, got {describe(learner)}")
    cases = [as_case(c) for c in cases]
    owner = learner if owner is None else owner
    n = 0
    for k, case in enumerate(cases, 1):
        where = f"case {k} of {len(cases)}: {case.name}"
        if seed is not None:
            where += f" (seed {seed}; replay: {replay or 'check'}(your_function, seed={seed}))"
        expected = _reference_value(reference, case, name, where)
        got = call_learner(learner, case, name, where, pure, owner, on_error)
        try:
            if normalize is not None:
                got = normalize(expected, got)
        except CheckFailed as e:
            raise CheckFailed(f"{e}\n  {where}") from None
        wrong_type = type_problem(expected, got) or number_for_sequence(expected, got)
        problem = wrong_type or compare(expected, got, rel, abs_)
        if problem is None:
            n += 1
            continue
        extra = "" if wrong_type and type_problem(expected, got) else (
            matching_mistake(mistakes, learner, cases, rel, abs_, normalize, reference)
            if mistakes else "") or mismatch_hint(hint, case, expected, got)
        raise CheckFailed(f"{name}: {problem}\n  {where}"
                          + (f"\n  hint: {extra}" if extra else ""))
    note = speed_note(speed, name, learner, reference, owner) if speed is not None else ""
    print(f"✓ {name}: {n} random cases passed" + (f"\n  note: {note}" if note else ""))
    return CasesPassed(n)


def _reference_value(reference: Callable, case: Case, name: str, where: str):
    """The reference's value on copies of the case's inputs; a reference that fails is the
    checker's bug, reported as such."""
    try:
        return reference(*(copy_arg(a) for a in case.args),
                         **{key: copy_arg(v) for key, v in case.kwargs.items()})
    except Exception as e:  # noqa: BLE001
        raise CheckFailed(f"{name}: the checker's reference failed on {where} "
                          f"({type(e).__name__}: {e}); please report this") from None


def checker(fn: Callable) -> Callable:
    """Decorate a ``check_*`` function: anything but :class:`CheckFailed` that escapes it (a
    bug in the checker meeting an unexpected answer) becomes a :class:`CheckFailed` that says so."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CheckFailed:
            raise
        except Exception as e:  # noqa: BLE001
            raise CheckFailed(f"{fn.__name__}: the checker could not judge this answer "
                              f"({type(e).__name__}: {e}); look at the type and shape of what "
                              "your function returns") from e
    return wrapped
