"""A checker's inputs: the :class:`Case` (named by shapes and options, never numbers), the copies
the learner's function is handed, and whether it changed one of them in place.

Rule 1 of :mod:`llminfra.course.checking`: the answer gets copies of the inputs, the originals
stay in the case, and after the call every copy is compared with its original
(:func:`changed_input`) — element by element for tensors and arrays (NaN equal to NaN), item by
item for containers, by attributes for other objects. Taught in chapter 00 (how exercises are
checked).
"""

from __future__ import annotations

import copy
import inspect
import numbers
from dataclasses import dataclass, field

from llminfra.course.compare import describe, is_tensor

__all__ = ["Case", "as_case", "copy_arg", "changed_input"]


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


def as_case(c) -> Case:
    """``c`` itself when it is a :class:`Case`; an ``(args, kwargs)`` pair as a case named by
    its arguments (shape and dtype of an array, the repr of a number:
    :func:`~llminfra.course.compare.describe`)."""
    if isinstance(c, Case):
        return c
    args, kwargs = c
    return Case(", ".join([describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]),
                tuple(args), dict(kwargs))


def copy_arg(value):
    """A copy of one input to hand the learner: a tensor detached and cloned, anything else
    deep-copied (an argument that cannot be copied is passed as it is)."""
    if is_tensor(value):
        return value.detach().clone()
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an uncopyable argument is passed as it is
        return value


def changed_input(case: Case, args: tuple, kwargs: dict, owner) -> str | None:
    """The name of the first input the learner's call changed (``args`` and ``kwargs`` are the
    copies it was handed, ``case`` keeps the originals), or None."""
    names = _arg_names(owner, len(args))
    for i, (before, after) in enumerate(zip(case.args, args)):
        if not _same(before, after):
            return names[i]
    for k, before in case.kwargs.items():
        if not _same(before, kwargs[k]):
            return k
    return None


def _arg_names(fn, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    if params and params[0] == "self" and isinstance(fn, type):
        params = params[1:]
    return (params + [f"argument {i}" for i in range(len(params), n)])[:max(n, len(params))]


def _same(before, after, depth: int = 0) -> bool:
    """Does ``after`` (what the learner was handed) still hold ``before`` (a copy kept aside)?
    Tensors and arrays element by element (NaN equal to NaN), containers item by item, other
    objects by their attributes."""
    import torch  # torch loads on first use: the course's modules import without it
    if depth > 6 or before is after:
        return True
    if torch.is_tensor(before):
        return (torch.is_tensor(after) and after.shape == before.shape
                and after.dtype == before.dtype
                and bool(torch.equal(before, after) or (before.is_floating_point() and torch.allclose(
                    before, after, rtol=0, atol=0, equal_nan=True))))
    if type(before).__module__ == "numpy" and hasattr(before, "shape"):
        import numpy as np
        try:
            return (getattr(after, "shape", None) == before.shape
                    and bool(np.array_equal(before, after, equal_nan=before.dtype.kind in "fc")))
        except TypeError:
            return bool(np.array_equal(before, after))
    if isinstance(before, (list, tuple)):
        return (type(after) is type(before) and len(after) == len(before)
                and all(_same(b, a, depth + 1) for b, a in zip(before, after)))
    if isinstance(before, dict):
        return (isinstance(after, dict) and before.keys() == after.keys()
                and all(_same(before[k], after[k], depth + 1) for k in before))
    if isinstance(before, (set, frozenset, str, bytes, numbers.Number, type(None))):
        return before == after or (before != before and after != after)  # NaN
    if hasattr(before, "__dict__") and not callable(before):
        return type(after) is type(before) and _same(vars(before), vars(after), depth + 1)
    try:
        return bool(before == after)
    except Exception:  # noqa: BLE001 - an object that cannot compare is taken as unchanged
        return True
