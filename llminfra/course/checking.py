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
case, the seed, the mismatch and a hint; a stub that still raises ``NotImplementedError`` raises
:class:`NotAttempted`. Whatever goes wrong inside a checker itself is reported as
:class:`CheckFailed` too, never as a traceback from inside torch.

On success one line is printed that does not depend on the seed, so solution notebooks stay
deterministic under nbval. Taught in chapter 00 (how exercises are checked).
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from llminfra.course.answer_kinds import as_like, kind_mismatch
from llminfra.course.code_origin import in_package_file, is_learners_stub, library_roots, stub_frame
from llminfra.course.compare import compare, describe, first_matching

log = logging.getLogger(__name__)

__all__ = ["CheckFailed", "NotAttempted", "CasesPassed", "Case", "run_checks", "compare",
           "first_matching", "as_like", "seeded", "fresh_rng", "torch_generator", "checker",
           "describe"]


class CheckFailed(AssertionError):
    """The learner's answer is wrong; the message says for which case, seed and how.

    In Jupyter it shows as that message alone (:meth:`_render_traceback_`), not as a traceback
    through the checker; when the learner's own code raised, the frames of their code follow.
    """

    def _render_traceback_(self) -> list[str]:
        """What IPython prints instead of the traceback (its hook for exceptions that format
        themselves; a plain ``python`` run still shows the whole traceback)."""
        return render_check_failure(self)


class CasesPassed(int):
    """The number of cases a checker passed: an ``int`` (``check_x(f) == 8``) that a notebook
    does not display again under the checker's cell — its ``✓ name: 8 random cases passed``
    line already says it, and a stray ``Out[n]: 8`` below it read as a second result."""

    def _ipython_display_(self) -> None:
        """Show nothing (IPython calls this instead of printing the value)."""


class NotAttempted(CheckFailed):
    """The learner's own function is still the stub (it raises ``NotImplementedError``)."""


@dataclass(frozen=True)
class Case:
    """One input of a checker, shown in messages by ``name`` (shapes and options, no numbers).

    ``nonfinite_hint``: when set, the learner's function runs under a watch that fails the case
    (with this text) if any torch operation turns finite inputs into NaN or inf — a division by
    zero that an undefined float-to-int cast would otherwise hide.
    """

    name: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    nonfinite_hint: str | None = None

    def __repr__(self) -> str:
        return self.name


def _torch():
    import torch
    return torch


_RED, _RESET = "\x1b[0;31m", "\x1b[0m"


def render_check_failure(exc: CheckFailed) -> list[str]:
    """``CheckFailed: <diagnosis, case, replay call, hint>``, then — only when the learner's
    code raised — the lines of *their* code that ran into it (frames outside the package)."""
    lines = [f"{_RED}{type(exc).__name__}{_RESET}: {exc}"]
    cause = exc.__cause__
    if cause is not None and not isinstance(cause, CheckFailed):
        import traceback
        roots = library_roots()
        frames = [f for f in traceback.extract_tb(cause.__traceback__)
                  if not in_package_file(f.filename)
                  and not os.path.abspath(f.filename).startswith(roots)]
        if frames:
            lines.append("where your code raised it:")
            lines.extend(s.rstrip("\n") for s in traceback.format_list(frames))
    return lines


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


# ------------------------------------------------------------------- calling the learner
def _copy_args(value):
    torch = _torch()
    if torch.is_tensor(value):
        return value.detach().clone()
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an uncopyable argument is passed as it is
        return value


def _nonfinite_watch():
    """A torch function mode that records ops turning finite inputs into NaN / inf."""
    torch = _torch()
    from torch.overrides import TorchFunctionMode

    class Watch(TorchFunctionMode):
        seen = None

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if self.seen is None and torch.is_tensor(out) and out.is_floating_point():
                inputs = [a for a in list(args) + list((kwargs or {}).values())
                          if torch.is_tensor(a) and a.is_floating_point()]
                finite_in = all(bool(torch.isfinite(a).all()) for a in inputs)
                py_zero = any(isinstance(a, (int, float)) and a == 0 for a in args[1:])
                if (finite_in or py_zero) and not bool(torch.isfinite(out).all()):
                    self.seen = getattr(func, "__name__", str(func))
            return out

    return Watch()


def _call(learner, case: Case, name: str, where: str, pure: bool, owner, on_error=None):
    args = tuple(_copy_args(a) for a in case.args)
    kwargs = {k: _copy_args(v) for k, v in case.kwargs.items()}
    watch = _nonfinite_watch() if case.nonfinite_hint else None
    try:
        if watch is not None:
            with watch:
                got = learner(*args, **kwargs)
        else:
            got = learner(*args, **kwargs)
    except NotImplementedError as e:
        frame = stub_frame(e)
        if frame is None or is_learners_stub(frame.f_code, owner):
            raise NotAttempted(f"{name}: not implemented yet — replace the `raise "
                               "NotImplementedError(...)` with your code, run that cell, then "
                               "run this check again") from None
        raise CheckFailed(f"{name}: `{frame.f_code.co_name}`, which your {name} calls, still "
                          f"raises NotImplementedError — finish that exercise first "
                          f"({where})") from None
    except NotAttempted:
        raise
    except CheckFailed as e:  # raised by a checker's own driver around the learner's code
        raise CheckFailed(f"{e}\n  {where}") from None
    except Exception as e:
        msg = f"{name} raised {type(e).__name__}: {e}\n  {where}"
        extra = ""
        if on_error is not None:
            try:
                extra = on_error(case.args, case.kwargs, e)
            except Exception:  # noqa: BLE001
                extra = ""
        raise CheckFailed(msg + (f"\n  hint: {extra}" if extra else "")) from e
    if watch is not None and watch.seen:
        raise CheckFailed(f"{name}: {case.nonfinite_hint} (torch.{watch.seen} produced NaN or "
                          f"inf from finite inputs)\n  {where}")
    if pure:
        torch = _torch()
        names = _arg_names(owner, len(args))
        for i, (before, after) in enumerate(zip(case.args, args)):
            if torch.is_tensor(before) and (after.shape != before.shape
                                            or not torch.equal(after, before)):
                raise CheckFailed(f"{name} modified its input `{names[i]}` in place: the "
                                  f"instructions say to leave it unchanged (work on a "
                                  f"`.clone()`)\n  {where}")
    return got


def _arg_names(fn, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    return (params + [f"argument {i}" for i in range(len(params), n)])[:max(n, len(params))]


def _as_case(c) -> Case:
    if isinstance(c, Case):
        return c
    args, kwargs = c
    return Case(", ".join([describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]),
                tuple(args), dict(kwargs))


def _mismatch_hint(hint, case: Case, expected, got) -> str:
    """What the learner reads under a mismatch: the checker's ``hint`` names the bug; on an
    answer of the wrong kind (a dict, "12 GB", an array for one number …) that its arithmetic
    cannot take, or where it has nothing to say, what kind of value to return instead."""
    if isinstance(got, bool) and not isinstance(expected, bool):
        return kind_mismatch(expected, got) or ""  # True is not the number 1 here
    extra = ""
    if hint is not None:
        try:
            extra = hint(case.args, case.kwargs, expected, as_like(expected, got))
        except Exception as e:  # noqa: BLE001 - a broken hint must not hide the mismatch
            extra = kind_mismatch(expected, got) or (
                f"(no hint: the checker's hint failed with {type(e).__name__}: {e})")
    return extra or kind_mismatch(expected, got) or ""


def run_checks(name: str, learner: Callable, reference: Callable,
               cases: Iterable[Case | tuple[tuple, dict]], rel: float = 1e-9, abs_: float = 0.0,
               hint: Callable[[tuple, dict, Any, Any], str] | None = None,
               seed: int | None = None, replay: str | None = None, pure: bool = False,
               normalize: Callable[[Any, Any], Any] | None = None, owner: Any = None,
               on_error: Callable[[tuple, dict, Exception], str] | None = None) -> int:
    """Call ``learner`` and ``reference`` on every case; raise :class:`CheckFailed` at the first
    disagreement, naming the case, the seed, where the values differ and ``hint(args, kwargs,
    expected, got)`` (a diagnosis; a hint that fails says so instead).

    ``pure``: the learner must not modify tensor arguments. ``normalize(expected, got)`` may
    convert or validate the answer first (raise :class:`CheckFailed` for a wrong type).
    ``replay``: how to call this checker again (``"ch02.check_largest_batch"``), with ``seed``.
    ``owner``: the learner's own function or class when ``learner`` wraps it (a
    ``NotImplementedError`` raised there means "not attempted"; elsewhere it names the stub).
    ``on_error(args, kwargs, exception)``: a hint when the learner's code raises.
    Returns the number of cases checked, after printing ``✓ name: N random cases passed``.
    """
    if not callable(learner):
        raise CheckFailed(f"{name}: expected a function, got {describe(learner)}")
    cases = [_as_case(c) for c in cases]
    n = 0
    for k, case in enumerate(cases, 1):
        where = f"case {k} of {len(cases)}: {case.name}"
        if seed is not None:
            where += f" (seed {seed}; replay: {replay or 'check'}(your_function, seed={seed}))"
        try:
            expected = reference(*case.args, **case.kwargs)
        except Exception as e:  # noqa: BLE001
            raise CheckFailed(f"{name}: the checker's reference failed on {where} "
                              f"({type(e).__name__}: {e}); please report this") from None
        got = _call(learner, case, name, where, pure, learner if owner is None else owner,
                    on_error)
        try:
            if normalize is not None:
                got = normalize(expected, got)
        except CheckFailed as e:
            raise CheckFailed(f"{e}\n  {where}") from None
        problem = compare(expected, got, rel, abs_)
        if problem is None:
            n += 1
            continue
        extra = _mismatch_hint(hint, case, expected, got)
        raise CheckFailed(f"{name}: {problem}\n  {where}"
                          + (f"\n  hint: {extra}" if extra else ""))
    print(f"✓ {name}: {n} random cases passed")
    return CasesPassed(n)


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
