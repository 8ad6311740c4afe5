"""What *kind* of value a learner's answer is, beside whether its value is right
(:mod:`llminfra.course.compare`).

:func:`kind_mismatch` tells a learner whose answer is not even the expected kind of value — a
dict, a string with units, a tuple or an array where one number is due, None — what to return
instead, so that a checker's hint, which does arithmetic on the answer, never crashes on it;
:func:`as_like` converts an answer that holds the expected kind (a NumPy scalar, a 0-d tensor,
an array for a list) to it for that arithmetic. Used by :mod:`llminfra.course.checking`;
taught in chapter 00 (how exercises are checked).
"""

from __future__ import annotations

import numbers
import re
from typing import Any

from llminfra.course.compare import as_tensor, describe, is_tensor, scalar_value

__all__ = ["kind_mismatch", "as_like"]


def _is_number(x) -> bool:
    return scalar_value(x) is not None


def _size(x) -> int | None:
    try:
        return len(x)
    except TypeError:
        return None


def kind_mismatch(expected: Any, got: Any) -> str | None:
    """What to tell a learner whose answer is not even the expected *kind* of value (a dict,
    a string with units, a tuple or an array where one number is due, None …), or None when
    it is (then a checker's own hint, which does arithmetic on the answer, may run). Never
    raises."""
    try:
        return _kind_mismatch(expected, got)
    except Exception:  # noqa: BLE001 - an odd object still gets a plain message
        return f"return {_kind_name(expected)}, not {type(got).__name__}"


def _a(noun: str) -> str:
    """``a list``, ``an ndarray``; a number or a quoted value keeps no article."""
    if not noun[:1].isalpha():
        return noun
    return ("an " if noun[0].lower() in "aeiou" or noun.startswith("ndarray") else "a ") + noun


def _kind_name(expected) -> str:
    if isinstance(expected, bool):
        return "True or False"
    if isinstance(expected, numbers.Integral):
        return "one whole number (an int)"
    if isinstance(expected, numbers.Real):
        return "one number (an int or a float)"
    if is_tensor(expected):
        return f"a tensor of shape {tuple(expected.shape)}"
    if isinstance(expected, dict):
        return f"a dict with keys {sorted(map(str, expected))}"
    if isinstance(expected, (list, tuple)):
        return f"a {type(expected).__name__} of {len(expected)} items"
    return f"a {type(expected).__name__}"


def _kind_mismatch(expected, got) -> str | None:
    want = _kind_name(expected)
    if got is None:
        return f"the function must return {want}"
    if isinstance(expected, bool):
        return None
    if isinstance(expected, numbers.Real):
        if _is_number(got):
            return None
        if isinstance(got, bool):
            return f"return {want}, not {got}"
        if isinstance(got, str):
            units = re.match(r"\s*[-+]?(\d|\.\d)", got) is not None
            return (f"return {want}, not the string {got!r}" + (
                ": the unit is in the exercise's name and docstring (bytes, GiB, tokens/s …); "
                "return the plain number" if units else ""))
        if isinstance(got, dict):
            return f"return {want}, not a dict (keys {sorted(map(str, got))[:5]})"
        n = _size(got)
        if hasattr(got, "shape") or n is None:
            return f"return {want}, not {_a(describe(got))}"
        return (f"return {want}, not {_a(type(got).__name__)} of {n} value"
                + ("s (the exercise wants a single value)" if n != 1 else
                   ": return its item (x[0])"))
    if is_tensor(expected):
        if as_tensor(got) is not None:
            return None
        return f"return {want} (a torch.Tensor), not {describe(got)}"
    if isinstance(expected, dict):
        return None if isinstance(got, dict) else f"return {want}, not {describe(got)}"
    if isinstance(expected, (list, tuple)):
        if isinstance(got, (str, bytes, dict, set, frozenset, bool)) or _size(got) is None \
                and not hasattr(got, "tolist"):
            return f"return {want}, not {describe(got)}"
        items = got.tolist() if hasattr(got, "tolist") and not isinstance(got, (list, tuple)) \
            else got
        if not isinstance(items, (list, tuple)):
            return f"return {want}, not {describe(got)}"
        for i, (e, g) in enumerate(zip(expected, items)):
            if e is None:
                continue
            inner = _kind_mismatch(e, g)
            if inner is not None:
                return f"item {i}: {inner}"
        return None
    return None


def as_like(expected: Any, got: Any) -> Any:
    """``got`` converted to ``expected``'s kind when it holds such a value (a Python number for
    a number, a list for a list of numbers, a plain tensor for a tensor), else unchanged — so a
    hint can do arithmetic on it without NumPy overflow or dtype clashes."""
    try:
        if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
            v = scalar_value(got)
            return got if v is None else v
        if isinstance(expected, (list, tuple)) and hasattr(got, "tolist") and not isinstance(got, (list, tuple)):
            return got.tolist()
        if is_tensor(expected):
            t = as_tensor(got)
            return got if t is None else t
        if isinstance(expected, tuple) and isinstance(got, (list, tuple)) and len(got) == len(expected):
            return tuple(as_like(e, g) for e, g in zip(expected, got))
    except Exception:  # noqa: BLE001
        pass
    return got
