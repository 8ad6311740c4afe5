"""The checker framework: try the learner's function on named cases against the package.

A checker builds its cases from one seed: the cases every instruction names (an all-zero group, a
grouped-query layout, a negative result to clip, a tie…) are always there, the rest drawn fresh
from the seed, so a hard-coded answer does not pass and every failure can be replayed with
``check_x(fn, seed=N)``. The learner's result is compared with the package's reference by
:func:`compare`, which accepts any type that holds the right value (a list, tuple, NumPy array or
tensor of the right numbers; an int, float, ``Fraction``, NumPy or 0-d tensor scalar) and, on a
mismatch, says where the first difference is and how large the largest one is — never a full
tensor. The first failing case raises :class:`CheckFailed` naming the case, the seed, the
mismatch and a hint; a stub that still raises ``NotImplementedError`` raises
:class:`NotAttempted`. Whatever goes wrong inside a checker itself is reported as
:class:`CheckFailed` too, never as a traceback from inside torch.

On success one line is printed that does not depend on the seed, so solution notebooks stay
deterministic under nbval. Taught in chapter 00 (how exercises are checked).
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterable

__all__ = ["CheckFailed", "NotAttempted", "Case", "run_checks", "compare", "first_matching",
           "as_like", "seeded", "fresh_rng", "torch_generator", "checker", "describe"]


class CheckFailed(AssertionError):
    """The learner's answer is wrong; the message says for which case, seed and how."""


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


# ------------------------------------------------------------------------- seeds
def seeded(seed: int | None = None) -> tuple[int, random.Random]:
    """``(seed, random.Random(seed))``; a fresh seed (0 … 999,999) when ``seed`` is None."""
    if seed is None:
        seed = random.SystemRandom().randrange(1_000_000)
    return seed, random.Random(seed)


def fresh_rng() -> random.Random:
    """A generator seeded from the OS (older checkers; new ones use :func:`seeded`)."""
    return random.Random()


def torch_generator(rng: random.Random):
    """A ``torch.Generator`` seeded from ``rng``: tensors replayable from the case seed, never
    the global torch random state."""
    import torch
    return torch.Generator().manual_seed(rng.randrange(2**31))


# ----------------------------------------------------------------- normalising values
def _torch():
    import torch
    return torch


def _is_tensor(x) -> bool:
    return _torch().is_tensor(x)


def _scalar(x) -> float | int | None:
    """A Python number for anything that holds one number, else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, (Fraction, numbers.Rational)):
        return float(x)
    if isinstance(x, numbers.Real):
        return float(x)
    if hasattr(x, "shape") and tuple(getattr(x, "shape")) in ((), (1,)) and hasattr(x, "item"):
        try:
            v = x.item()
        except Exception:  # noqa: BLE001 - an odd object is "not a number", not a crash
            return None
        return None if isinstance(v, (bool, complex)) else v
    return None


def _as_tensor(x):
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
    if _is_tensor(x) or type(x).__module__ == "numpy":
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
    return f"{v:.6g}" if isinstance(v, float) else repr(v)


def _eps_tolerance(dtype) -> tuple[float, float]:
    """torch.testing's default (rtol, atol) for a floating dtype; (0, 0) for integers."""
    torch = _torch()
    table = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
             torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}
    return table.get(dtype, (0.0, 0.0))


def _compare_tensors(expected, got, rel: float, abs_: float, where: str) -> str | None:
    torch = _torch()
    t = _as_tensor(got)
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

    Numbers match within ``rel``/``abs_`` whatever their type; sequences, arrays and tensors
    match element-wise whatever their container (a lower-precision float tensor gets its dtype's
    tolerance); dicts by keys. Never raises on odd input and never prints a whole tensor.
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
        g = _scalar(got)
        if g is None:
            return f"{where}expected a number, got {describe(got)}"
        if isinstance(g, float) and not math.isfinite(g):
            return f"{where}got {g}, expected {_fmt(expected)}"
        if math.isclose(g, expected, rel_tol=rel, abs_tol=abs_) or g == expected:
            return None
        return f"{where}got {_fmt(g)}, expected {_fmt(expected)} (difference {_fmt(g - expected)})"
    if _is_tensor(expected):
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
            items = got.tolist() if hasattr(got, "tolist") and not isinstance(got, (list, tuple)) else got
            if not isinstance(items, (list, tuple)):
                return f"{where}expected a sequence of {len(expected)} numbers, got {describe(got)}"
            if len(items) != len(expected):
                return f"{where}{len(items)} items, expected {len(expected)}"
            bad = [i for i, (e, g) in enumerate(zip(expected, items))
                   if _compare(e, g, rel, abs_, "") is not None]
            if not bad:
                return None
            i = bad[0]
            return (f"{where}first mismatch at index {i}: got {describe(items[i])}, expected "
                    f"{expected[i]!r}; {len(bad)} of {len(expected)} items differ")
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"{where}expected a {type(expected).__name__} of {len(expected)} items, got {describe(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            problem = _compare(e, g, rel, abs_, f"{where}item {i}: ")
            if problem:
                return problem
        return None
    return None if expected == got else f"{where}got {describe(got)}, expected {describe(expected)}"


def as_like(expected: Any, got: Any) -> Any:
    """``got`` converted to ``expected``'s kind when it holds such a value (a Python number for
    a number, a list for a list of numbers, a plain tensor for a tensor), else unchanged — so a
    hint can do arithmetic on it without NumPy overflow or dtype clashes."""
    try:
        if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
            v = _scalar(got)
            return got if v is None else v
        if isinstance(expected, (list, tuple)) and hasattr(got, "tolist") and not isinstance(got, (list, tuple)):
            return got.tolist()
        if _is_tensor(expected):
            t = _as_tensor(got)
            return got if t is None else t
        if isinstance(expected, tuple) and isinstance(got, (list, tuple)) and len(got) == len(expected):
            return tuple(as_like(e, g) for e, g in zip(expected, got))
    except Exception:  # noqa: BLE001
        pass
    return got


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


# ------------------------------------------------------------------- calling the learner
def _copy_args(value):
    torch = _torch()
    if torch.is_tensor(value):
        return value.detach().clone()
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an uncopyable argument is passed as it is
        return value


def _stub_frame(exc: BaseException):
    """The innermost frame of ``exc``'s traceback (where ``raise NotImplementedError`` ran)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


def _owned_codes(target) -> set:
    codes = set()
    members = [target] + ([v for v in vars(target).values()] if isinstance(target, type) else [])
    for m in members:
        code = getattr(getattr(m, "__func__", m), "__code__", None)
        if code is not None:
            codes.add(code)
    return codes


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
        frame = _stub_frame(e)
        if frame is None or frame.f_code in _owned_codes(owner):
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


def run_checks(name: str, learner: Callable, reference: Callable,
               cases: Iterable[Case | tuple[tuple, dict]], rel: float = 1e-9, abs_: float = 0.0,
               hint: Callable[[tuple, dict, Any, Any], str] | None = None,
               seed: int | None = None, replay: str | None = None, pure: bool = False,
               normalize: Callable[[Any, Any], Any] | None = None, owner: Any = None,
               on_error: Callable[[tuple, dict, Exception], str] | None = None) -> int:
    """Call ``learner`` and ``reference`` on every case; raise :class:`CheckFailed` at the first
    disagreement, naming the case, the seed, where the values differ and ``hint(args, kwargs,
    expected, got)`` (a diagnosis; its own errors are ignored).

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
        msg = f"{name}: {problem}\n  {where}"
        extra = ""
        if hint is not None:
            try:
                extra = hint(case.args, case.kwargs, expected, as_like(expected, got))
            except Exception as e:  # noqa: BLE001 - a broken hint must not hide the mismatch
                extra = f"(no hint: the checker's hint failed with {type(e).__name__}: {e})"
        if extra:
            msg += f"\n  hint: {extra}"
        raise CheckFailed(msg)
    print(f"✓ {name}: {n} random cases passed")
    return n


def checker(fn: Callable) -> Callable:
    """Decorate a ``check_*`` function: anything but :class:`CheckFailed` that escapes it (a
    bug in the checker meeting an unexpected answer) becomes a :class:`CheckFailed` that says so."""
    import functools

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
