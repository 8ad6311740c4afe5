"""What a checker raises and how it reads: :class:`CheckFailed`, :class:`NotAttempted`, the
pass count :class:`CasesPassed`, and the rules of a message — at most :data:`MAX_LINES` lines
(:func:`fit_message`), a tensor in the learner's own exception summarised by shape and dtype
(:func:`error_text`), and in Jupyter only the lines of the learner's own code under it
(:func:`render_check_failure`).

Rules 8 and 9 of :mod:`llminfra.course.checking`; taught in chapter 00 (how exercises are
checked).
"""

from __future__ import annotations

import os
import traceback

from llminfra.course.code_origin import in_package_file, library_roots
from llminfra.course.compare import describe, is_tensor

__all__ = ["CheckFailed", "NotAttempted", "CasesPassed", "STUB_MESSAGE", "MAX_LINES",
           "fit_message", "error_text", "render_check_failure"]


class CheckFailed(AssertionError):
    """The learner's answer is wrong; the message says for which case, seed and how, in at
    most :data:`MAX_LINES` lines (:func:`fit_message`).

    ``status`` is what a grader records: ``"failed"`` here, ``"not attempted"`` only on
    :class:`NotAttempted` (the exercise's own stub). In Jupyter it shows as that message alone
    (:meth:`_render_traceback_`), not as a traceback through the checker; when the learner's
    own code raised, the frames of their code follow.
    """

    status = "failed"

    def __init__(self, message: object = "") -> None:
        super().__init__(fit_message(str(message)))

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
    """The learner's own function is still the exercise's stub: ``raise
    NotImplementedError("your code here")`` as :mod:`llminfra.course.exercises` writes it (or a
    bare ``raise NotImplementedError`` line in their code). A ``NotImplementedError`` that torch
    raises (an op with no kernel for a dtype) is a :class:`CheckFailed`, the answer attempted."""

    status = "not attempted"


#: the message of the stub ``exercises/`` holds in place of each solution
STUB_MESSAGE = "your code here"
#: a checker's message is at most this many lines (the diagnosis, the case, the hint)
MAX_LINES = 3
_MAX_LINE_CHARS = 400


def fit_message(text: str) -> str:
    """``text`` in at most :data:`MAX_LINES` lines: later lines are joined onto the last one,
    and a line longer than a few hundred characters is cut (with "…")."""
    lines = [line.rstrip() for line in text.strip("\n").split("\n") if line.strip()]
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES - 1] + ["  " + "; ".join(x.strip() for x in lines[MAX_LINES - 1:])]
    return "\n".join(x if len(x) <= _MAX_LINE_CHARS else x[:_MAX_LINE_CHARS - 1] + "…"
                     for x in lines)


def error_text(e: BaseException) -> str:
    """``Type: message`` of an exception the learner's code raised, on one short line: a tensor
    or array among its arguments (``assert ok, t``) is summarised by shape and dtype."""
    args = getattr(e, "args", ())
    if any(_is_array(a) for a in args):
        text = ", ".join(describe(a) if _is_array(a) else str(a) for a in args)
    else:
        text = str(e)
    text = " ".join(text.split())
    if len(text) > 160:
        text = text[:159] + "…"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _is_array(x) -> bool:
    return is_tensor(x) or type(x).__module__ == "numpy" and hasattr(x, "shape")


_RED, _RESET = "\x1b[0;31m", "\x1b[0m"


def render_check_failure(exc: CheckFailed) -> list[str]:
    """``CheckFailed: <diagnosis, case, replay call, hint>``, then — only when the learner's
    code raised — the lines of *their* code that ran into it (frames outside the package)."""
    lines = [f"{_RED}{type(exc).__name__}{_RESET}: {exc}"]
    cause = exc.__cause__
    if cause is not None and not isinstance(cause, CheckFailed):
        roots = library_roots()
        frames = [f for f in traceback.extract_tb(cause.__traceback__)
                  if not in_package_file(f.filename)
                  and not os.path.abspath(f.filename).startswith(roots)]
        if frames:  # the innermost line of theirs: the message stays short
            lines.append("where your code raised it:")
            lines.extend(s.rstrip("\n") for s in traceback.format_list(frames[-1:]))
    return lines
