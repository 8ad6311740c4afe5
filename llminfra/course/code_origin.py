"""Whose code is a frame of a traceback: the learner's, the package's (a checker's own
wrapper), or a library's (Python's, torch's, NumPy's)?

A checker asks to tell "not attempted" from a bug: a ``NotImplementedError`` raised by the
checked function's own stub (:func:`is_learners_stub`) means the exercise is not done yet, one
raised by another exercise it calls names that one; and to show a learner only the frames of
*their* code when it raised (:func:`in_package_file`, :func:`library_roots`). Used by
:mod:`llminfra.course.checking`; taught in chapter 00 (how exercises are checked).
"""

from __future__ import annotations

import os


def stub_frame(exc: BaseException):
    """The innermost frame of ``exc``'s traceback (where ``raise NotImplementedError`` ran)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


def in_package(code) -> bool:
    """Is ``code`` part of the llminfra package (a checker's wrapper, not the learner's)?"""
    return in_package_file(code.co_filename)


def in_package_file(filename: str) -> bool:
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.abspath(filename).startswith(package + os.sep)


def is_learners_stub(code, owner) -> bool:
    """The stub that raised is the checked function's own (not another exercise it calls).
    When ``owner`` is itself a checker's wrapper, any function outside the package counts."""
    owned = _owned_codes(owner)
    if code in owned:
        return True
    return bool(owned) and all(in_package(c) for c in owned) and not in_package(code)


def _owned_codes(target) -> set:
    codes = set()
    members = [target] + ([v for v in vars(target).values()] if isinstance(target, type) else [])
    for m in members:
        code = getattr(getattr(m, "__func__", m), "__code__", None)
        if code is not None:
            codes.add(code)
    return codes


def library_roots() -> tuple[str, ...]:
    """The folders of Python's standard library and installed packages (torch, NumPy …)."""
    import sysconfig
    return tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                  for k in ("stdlib", "platstdlib", "purelib", "platlib")})
