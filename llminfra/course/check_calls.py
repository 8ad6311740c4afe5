"""One call of the learner's function on one case, and what counts against it: an exception
(its own, shortened; the exercise's stub is :class:`NotAttempted`, torch's missing kernel a
:class:`CheckFailed`), NaN or inf made from finite numbers, an input changed in place.

Rules 1, 2 and 8 of :mod:`llminfra.course.checking`; taught in chapter 00 (how exercises are
checked).
"""

from __future__ import annotations

import linecache
import os

from llminfra.course.check_failures import STUB_MESSAGE, CheckFailed, NotAttempted, error_text
from llminfra.course.check_inputs import Case, changed_input, copy_arg
from llminfra.course.code_origin import is_learners_stub, library_roots, stub_frame

__all__ = ["call_learner"]


def call_learner(learner, case: Case, name: str, where: str, pure: bool, owner, on_error=None):
    """The learner's answer on copies of the case's inputs; ``CheckFailed`` when it raised,
    made NaN from finite numbers (``case.nonfinite_hint``), or (``pure``) changed an input."""
    args = tuple(copy_arg(a) for a in case.args)
    kwargs = {k: copy_arg(v) for k, v in case.kwargs.items()}
    watch = _nonfinite_watch() if case.nonfinite_hint else None
    try:
        if watch is not None:
            with watch:
                got = learner(*args, **kwargs)
        else:
            got = learner(*args, **kwargs)
    except NotImplementedError as e:
        raise _not_implemented(e, name, where, owner) from None
    except NotAttempted:
        raise
    except CheckFailed as e:  # raised by a checker's own driver around the learner's code
        raise CheckFailed(f"{e}\n  {where}") from None
    except Exception as e:
        msg = f"{name} raised {error_text(e)}\n  {where}"
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
        changed = changed_input(case, args, kwargs, owner)
        if changed is not None:
            raise CheckFailed(f"{name}: your function changed its input `{changed}` in place\n"
                              f"  {where}\n  hint: leave the inputs as they are — work on a copy "
                              "(`.clone()` for a tensor, `list(x)` or `copy.deepcopy` otherwise)")
    return got


def _nonfinite_watch():
    """A torch function mode that records ops turning finite inputs into NaN / inf (a division
    by zero); an op without tensor inputs — ``torch.empty``, whose memory is whatever was
    there, or ``torch.full(…, nan)`` — is no such op, nor is one whose input is such memory."""
    import torch  # torch loads on first use: the course's modules import without it
    from torch.overrides import TorchFunctionMode

    class Watch(TorchFunctionMode):
        seen = None

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if self.seen is None and torch.is_tensor(out) and out.is_floating_point() \
                    and not getattr(func, "__name__", "").startswith(("empty", "new_empty")):
                inputs = [a for a in list(args) + list((kwargs or {}).values())
                          if torch.is_tensor(a) and not a.is_complex()]
                finite_in = bool(inputs) and all(bool(torch.isfinite(a).all()) for a in inputs)
                py_zero = bool(inputs) and any(
                    isinstance(a, (int, float)) and a == 0 for a in args[1:])
                if (finite_in or py_zero) and not bool(torch.isfinite(out).all()):
                    self.seen = getattr(func, "__name__", str(func))
            return out

    return Watch()


def _is_exercise_stub(e: NotImplementedError, frame) -> bool:
    """Was ``e`` raised by a stub — ``raise NotImplementedError(...)`` written in Python code
    outside the libraries — rather than by torch (an op with no kernel for a dtype, which
    raises from C++ inside the learner's line, or from torch's own Python code)?"""
    if frame is None:
        return e.args in ((STUB_MESSAGE,), ())
    filename = frame.f_code.co_filename
    if os.path.abspath(filename).startswith(library_roots()):
        return False
    line = linecache.getline(filename, frame.f_lineno, frame.f_globals).strip()
    if line:
        return line.startswith("raise NotImplementedError")
    return e.args in ((STUB_MESSAGE,), ())


def _not_implemented(e: NotImplementedError, name: str, where: str, owner) -> CheckFailed:
    """``NotAttempted`` for the exercise's own stub; a ``CheckFailed`` naming the other
    exercise's stub, or torch's missing kernel, otherwise."""
    frame = stub_frame(e)
    if not _is_exercise_stub(e, frame):
        return CheckFailed(f"{name}: torch raised {error_text(e)}\n  {where}\n  hint: that op "
                           "has no kernel for this dtype or device (not the exercise's stub): "
                           "convert first (.float(), .long()) or use another op")
    if frame is None or is_learners_stub(frame.f_code, owner):
        return NotAttempted(f"{name}: not implemented yet — replace the `raise "
                            "NotImplementedError(...)` with your code, run that cell, then "
                            "run this check again")
    return CheckFailed(f"{name}: `{frame.f_code.co_name}`, which your {name} calls, still "
                       f"raises NotImplementedError — finish that exercise first\n  {where}")
