"""The checker framework: try the learner's function on fresh random cases against the package.

A checker draws new cases on every call (so a hard-coded answer does not pass), compares the
learner's result with the package's reference, and on the first mismatch raises
:class:`CheckFailed` saying which input, what was expected and what came back. A stub that still
raises ``NotImplementedError`` fails with a message that says so. On success it prints one line
that does not depend on the cases drawn, so the solution notebooks stay deterministic under nbval.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Iterable


class CheckFailed(AssertionError):
    """The learner's answer is wrong; the message says for which input and how."""


def _close(expected: Any, got: Any, rel: float, abs_: float) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got or expected == got
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(float(got), float(expected), rel_tol=rel, abs_tol=abs_)
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(
            _close(expected[k], got[k], rel, abs_) for k in expected)
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(expected) == len(got) and all(_close(e, g, rel, abs_) for e, g in zip(expected, got))
    try:
        import torch
        if isinstance(expected, torch.Tensor):
            if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
                return False
            return bool(torch.allclose(got.double(), expected.double(), rtol=rel, atol=abs_))
    except ImportError:
        pass
    return expected == got


def _show(args: tuple, kwargs: dict) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return ", ".join(parts)


def run_checks(name: str, learner: Callable, reference: Callable,
               cases: Iterable[tuple[tuple, dict]], rel: float = 1e-9, abs_: float = 0.0,
               hint: Callable[[tuple, dict, Any, Any], str] | None = None) -> int:
    """Call ``learner(*args, **kwargs)`` and ``reference(...)`` on every case; raise
    :class:`CheckFailed` at the first disagreement (``hint`` may add a diagnosis).

    Returns the number of cases checked, after printing ``✓ name: N cases passed``.
    """
    if not callable(learner):
        raise CheckFailed(f"{name}: expected a function, got {type(learner).__name__}")
    n = 0
    for args, kwargs in cases:
        expected = reference(*args, **kwargs)
        try:
            got = learner(*args, **kwargs)
        except NotImplementedError as e:
            raise CheckFailed(f"{name}: not implemented yet ({e or 'the stub still raises'}); "
                              "replace the `raise NotImplementedError` with your code") from None
        except Exception as e:
            raise CheckFailed(f"{name}({_show(args, kwargs)}) raised "
                              f"{type(e).__name__}: {e}") from e
        if not _close(expected, got, rel, abs_):
            msg = (f"{name}({_show(args, kwargs)}) returned {got!r}, expected {expected!r}")
            if hint is not None:
                extra = hint(args, kwargs, expected, got)
                if extra:
                    msg += f" — {extra}"
            raise CheckFailed(msg)
        n += 1
    print(f"✓ {name}: {n} random cases passed")
    return n


def fresh_rng() -> random.Random:
    """A generator seeded from the OS: new cases every call."""
    return random.Random()


def torch_generator(rng: random.Random):
    """A ``torch.Generator`` seeded from ``rng``: fresh tensors per check, never the global
    torch random state."""
    import torch
    return torch.Generator().manual_seed(rng.randrange(2**31))
