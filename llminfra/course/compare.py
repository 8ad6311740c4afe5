"""Compare a learner's answer with the expected value, whatever type holds it.

:func:`compare` accepts any type that holds the right value — a list, tuple, NumPy array or
tensor of the right numbers; an int, float, ``Fraction``, ``Decimal``, NumPy or 0-d tensor
scalar — and, on a mismatch, returns one line saying where the first difference is and how
large the largest one is, never a full tensor. Two rules decide what "holds the right value"
means:

* **Lower precision.** An answer stored in float32, float16 or bfloat16 (a tensor, a NumPy
  array or scalar, a 0-d tensor) can only hold the expected value rounded to its dtype: float32
  keeps about 7 significant digits, so a check at ``rel=1e-9`` would reject every right float32
  answer. In a tolerance-based check (``rel`` or ``abs_`` above 0) such an answer is judged
  with its own dtype's relative tolerance, torch.testing's default (float32: 1.3e-6, about 11
  units in the last place); a tensor also gets that dtype's absolute tolerance, a scalar keeps
  the check's own ``abs_``. This accepts the right value rounded to the dtype, not any
  computation done in it: a float32 difference of two nearby numbers loses more digits than
  that and still fails. An exact check (``rel = abs_ = 0``) stays exact.
* **Counts.** An ``int`` expected value is a count (bytes, parameters, tokens, GPUs): it is
  matched exactly, whatever ``rel`` says, by an answer of any type whose value is that whole
  number (``12``, ``12.0``, ``np.float32(12)``, ``Decimal("12")``, ``Fraction(24, 2)``), or
  by a Python / float64 float within float64 rounding of it (a right formula computed through
  a division, ``s·b·h·(34 + 5·a·s/h)``, may land a few units in the last place off: 64 at most,
  7e-15 relative); any other fraction is rejected, however close (half a byte on 10**10
  bytes). float32 holds whole numbers exactly only up to 2**24 (float16: 2**11, bfloat16:
  2**8), so a larger count in those dtypes is not the right value; the message says so.
* **Kinds.** An answer that is not even the expected kind of value (a dict, a string with
  units, an array where one number is due, None) is told what to return
  (:func:`~llminfra.course.answer_kinds.kind_mismatch`), never handed to a checker's hint that
  would crash on it (:mod:`llminfra.course.answer_kinds`, which also converts an answer to the
  expected kind for a hint's arithmetic).
:func:`first_matching` names the known mistake an answer equals. Used by
:mod:`llminfra.course.checking`; taught in chapter 00 (how exercises are checked).
"""

from __future__ import annotations

import math
import numbers
from decimal import Decimal
from typing import Any

__all__ = ["compare", "first_matching", "describe", "scalar_value", "as_tensor", "is_tensor"]


def _torch():
    import torch
    return torch


def is_tensor(x) -> bool:
    return _torch().is_tensor(x)


#: torch.testing's default (rtol, atol) of each floating dtype, by name (NumPy's or torch's)
_TOLERANCE = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
              "float64": (1e-7, 1e-7)}
#: the largest whole number up to which every whole number is exact in each dtype
_EXACT_WHOLE = {"float16": 2**11, "bfloat16": 2**8, "float32": 2**24}


def _low_precision(x) -> str | None:
    """``"float32"``, ``"float16"`` or ``"bfloat16"`` when ``x`` (a NumPy or torch scalar or
    array) is stored in that dtype, else None."""
    name = str(getattr(x, "dtype", "")).replace("torch.", "")
    return name if name in _EXACT_WHOLE else None


def scalar_value(x) -> float | int | None:
    """A Python number for anything that holds one number, else None: an int when the value
    is a whole number held exactly (an int, a ``Fraction`` of denominator 1, a whole
    ``Decimal``), else a float."""
    if isinstance(x, bool):
        return None
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Rational):
        return int(x) if x.denominator == 1 else float(x)
    if isinstance(x, Decimal):
        if not x.is_finite():
            return None if x.is_snan() else float(x)
        return int(x) if x == x.to_integral_value() else float(x)
    if isinstance(x, numbers.Real):
        return float(x)
    if hasattr(x, "shape") and tuple(getattr(x, "shape")) in ((), (1,)) and hasattr(x, "item"):
        try:
            v = x.item()
        except Exception:  # noqa: BLE001 - an odd object is "not a number", not a crash
            return None
        return None if isinstance(v, (bool, complex)) else v
    return None


def as_tensor(x):
    torch = _torch()
    if torch.is_tensor(x):
        return x.detach().as_subclass(torch.Tensor)
    try:
        import numpy as np
        if isinstance(x, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(x))
    except ImportError:
        pass
    if isinstance(x, (list, tuple)):
        try:
            return torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def describe(x) -> str:
    """A short description of a value: shape and dtype for arrays, the repr for numbers."""
    if is_tensor(x) or type(x).__module__ == "numpy":
        shape = tuple(getattr(x, "shape", ()))
        dtype = str(getattr(x, "dtype", "")).replace("torch.", "")
        if shape == ():
            return f"{x.item()!r} ({type(x).__name__} {dtype})"
        return f"{type(x).__name__} of shape {shape}, {dtype}"
    if isinstance(x, (list, tuple)) and len(x) > 8:
        return f"{type(x).__name__} of {len(x)} items starting {list(x[:4])!r}…"
    text = repr(x)
    return text if len(text) <= 120 else text[:117] + "…"


def _fmt(v) -> str:
    """Six significant digits for a float, all digits for a whole number (bytes, counts)."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return repr(int(v))
    return f"{v:.6g}" if isinstance(v, float) else repr(v)


def _eps_tolerance(dtype) -> tuple[float, float]:
    """torch.testing's default (rtol, atol) for a floating dtype; (0, 0) for integers."""
    return _TOLERANCE.get(str(dtype).replace("torch.", ""), (0.0, 0.0))


def _compare_tensors(expected, got, rel: float, abs_: float, where: str) -> str | None:
    torch = _torch()
    t = as_tensor(got)
    if t is None:
        return f"{where}expected a tensor of shape {tuple(expected.shape)}, got {describe(got)}"
    if t.is_complex():
        return f"{where}expected real numbers, got a complex tensor"
    if tuple(t.shape) != tuple(expected.shape):
        return f"{where}shape {tuple(t.shape)}, expected {tuple(expected.shape)}"
    if t.numel() == 0:
        return None
    e64, g64 = expected.detach().double().cpu(), t.double().cpu()
    if (rel or abs_) and t.is_floating_point() and (
            not expected.is_floating_point() or t.element_size() < expected.element_size()):
        lr, la = _eps_tolerance(t.dtype)  # a lower-precision answer gets its own dtype's slack
        rel, abs_ = max(rel, lr), max(abs_, la)
    diff = (g64 - e64).abs()
    diff = torch.where(torch.isnan(diff) | torch.isinf(g64), torch.full_like(diff, math.inf), diff)
    diff = torch.where((g64 == e64), torch.zeros_like(diff), diff)  # equal infinities
    bad = diff > abs_ + rel * e64.abs()
    if not bool(bad.any()):
        return None
    idx = lambda flat: tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), t.shape))
    first = int(bad.flatten().nonzero()[0])
    worst = int(diff.flatten().argmax())
    fi, wi = idx(first), idx(worst)
    return (f"{where}first mismatch at index {fi}: got {_fmt(g64[fi].item())}, expected "
            f"{_fmt(e64[fi].item())}; largest difference {_fmt(diff[wi].item())} at index {wi}; "
            f"{int(bad.sum())} of {bad.numel()} values differ")


def compare(expected: Any, got: Any, rel: float = 1e-9, abs_: float = 0.0,
            where: str = "") -> str | None:
    """None when ``got`` holds the value ``expected``; else one line saying where it differs.

    Numbers match within ``rel``/``abs_`` whatever their type (an answer in float32 or lower
    within its dtype's tolerance, an ``int`` expected value exactly: see the module docstring);
    sequences, arrays and tensors match element-wise whatever their container; dicts by keys.
    Never raises on odd input and never prints a whole tensor.
    """
    try:
        return _compare(expected, got, rel, abs_, where)
    except Exception as e:  # noqa: BLE001 - the comparison itself must never crash a check
        return f"{where}could not compare {describe(got)} with the expected value ({type(e).__name__}: {e})"


def _compare(expected, got, rel, abs_, where):
    if got is None:
        return f"{where}returned None: did you forget `return`?"
    if isinstance(expected, bool):
        g = got.item() if hasattr(got, "item") and getattr(got, "shape", None) == () else got
        if g in (True, False) and bool(g) == expected and not isinstance(g, float):
            return None
        return f"{where}got {describe(got)}, expected {expected}"
    if isinstance(expected, numbers.Real):
        g = scalar_value(got)
        if g is None:
            return f"{where}expected a number, got {describe(got)}"
        if isinstance(g, float) and not math.isfinite(g):
            return f"{where}got {g}, expected {_fmt(expected)}"
        low = _low_precision(got)
        if isinstance(expected, numbers.Integral):
            return _compare_count(int(expected), g, low, where)
        if low and (rel or abs_):
            rel = max(rel, _TOLERANCE[low][0])  # the right value rounded to the answer's dtype
        if math.isclose(g, expected, rel_tol=rel, abs_tol=abs_) or g == expected:
            return None
        return f"{where}got {_fmt(g)}, expected {_fmt(expected)} (difference {_fmt(g - expected)})"
    if is_tensor(expected):
        return _compare_tensors(expected, got, rel, abs_, where)
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{where}expected a dict with keys {sorted(expected)}, got {describe(got)}"
        if set(expected) != set(got):
            return f"{where}keys {sorted(map(str, got))}, expected {sorted(map(str, expected))}"
        for k in expected:
            problem = _compare(expected[k], got[k], rel, abs_, f"{where}[{k!r}] ")
            if problem:
                return problem
        return None
    if isinstance(expected, (list, tuple)):
        if all(isinstance(e, numbers.Real) and not isinstance(e, bool) for e in expected):
            items = got
            if hasattr(got, "tolist") and not isinstance(got, (list, tuple)):
                # a 1-D array's items keep its dtype (float32 judged as float32)
                items = list(got) if getattr(got, "ndim", None) == 1 else got.tolist()
            if not isinstance(items, (list, tuple)):
                return f"{where}expected a sequence of {len(expected)} numbers, got {describe(got)}"
            if len(items) != len(expected):
                return f"{where}{len(items)} items, expected {len(expected)}"
            problems = [_compare(e, g, rel, abs_, "") for e, g in zip(expected, items)]
            bad = [i for i, p in enumerate(problems) if p is not None]
            if not bad:
                return None
            i = bad[0]
            return (f"{where}first mismatch at index {i}: {problems[i]}; {len(bad)} of "
                    f"{len(expected)} items differ")
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"{where}expected a {type(expected).__name__} of {len(expected)} items, got {describe(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            problem = _compare(e, g, rel, abs_, f"{where}item {i}: ")
            if problem:
                return problem
        return None
    return None if expected == got else f"{where}got {describe(got)}, expected {describe(expected)}"


def _compare_count(expected: int, g: int | float, low: str | None, where: str) -> str | None:
    """An exact match of a whole number ``g`` (any type's value) with the count ``expected``."""
    if g == expected:
        return None
    if isinstance(g, float) and not low and abs(g - expected) <= _rounding(expected):
        return None  # the whole number, computed through floats (s·b·h·(34 + 5·a·s/h))
    if isinstance(g, float) and not g.is_integer():
        return f"{where}got {g!r}, expected the whole number {expected}: a count has no fraction"
    text = f"{where}got {_fmt(g)}, expected {_fmt(expected)} (difference {_fmt(g - expected)})"
    if low and abs(expected) > _EXACT_WHOLE[low]:
        text += (f"; {low} holds whole numbers exactly only up to {_EXACT_WHOLE[low]:,}: "
                 "compute counts with Python ints (or int64)")
    return text


def _rounding(count: int) -> float:
    """How far a float64 computation of ``count`` may land from it by rounding alone: 64 units
    in the last place of ``count`` (a formula of a few dozen operations; 7e-15 relative) —
    below 2**53, where float64 holds every whole number, under half a unit, so the nearest
    whole number is still ``count``."""
    ulps = 64 * math.ulp(float(count))
    return min(ulps, 0.25) if abs(count) < 2**53 else ulps


def first_matching(got: Any, variants: dict[str, Any], expected: Any, rel: float = 1e-9,
                   abs_: float = 0.0) -> str:
    """The messages of the wrong ``variants`` (message -> wrong value) that ``got`` equals and
    ``expected`` does not, joined by "; or " (a hint names the bug the answer actually has)."""
    hits = []
    for message, value in variants.items():
        try:
            if compare(value, got, rel, abs_) is None and compare(value, expected, rel, abs_) is not None:
                hits.append(message)
        except Exception:  # noqa: BLE001
            continue
    return "; or ".join(hits)
