"""Numbers on the command line: argparse ``type=`` checkers that name the allowed range.

``parser.add_argument("--rate", type=number(0, low_open=True, unit="requests per second"))``
turns ``--rate nan`` into ``llminfra loadtest: argument --rate: must be a finite number of
requests per second > 0, got 'nan'`` (exit status 2) instead of a traceback, or a run that
hangs, far from the option that caused it. argparse adds the option's name; the checker says
what is allowed. A bare ``type=float`` lets ``nan``, ``inf`` and negatives through, a bare
``type=int`` zero and negatives. Used by :mod:`llminfra.cli`.

And numbers out: :func:`json_text` writes strict JSON (no ``NaN``), to a ``--json`` path that
:func:`json_path` checked before the command ran.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path


def _fmt(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def integer(low: int, high: int | None = None, *, unit: str = ""):
    """An argparse type: an int in ``low..high`` (no upper end when ``high`` is None)."""
    what = f"an integer{' number of ' + unit if unit else ''}"
    allowed = f"in {_fmt(low)}..{_fmt(high)}" if high is not None else f">= {_fmt(low)}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} {allowed}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {what} {allowed}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


def number(low: float, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, unit: str = ""):
    """An argparse type: a finite float in the range from ``low`` to ``high`` (each end
    included unless ``low_open`` / ``high_open``; no upper end when ``high`` is None)."""
    what = f"a finite number{' of ' + unit if unit else ''}"
    if high is None:
        allowed = f"{'>' if low_open else '>='} {_fmt(low)}"
    else:
        allowed = (f"in {'(' if low_open else '['}{_fmt(low)}, {_fmt(high)}"
                   f"{')' if high_open else ']'}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} {allowed}, got {text!r}") from None
        too_low = value <= low if low_open else value < low
        too_high = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be {what} {allowed}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def number_list(low: float, high: float | None = None, *, low_open: bool = False,
                high_open: bool = False, unit: str = "", single: bool = True):
    """An argparse type: comma-separated :func:`number` s (``"1,2,4"`` → ``[1.0, 2.0, 4.0]``),
    each checked as :func:`number` checks one; with ``single`` a text without a comma is the
    bare float (``"2"`` → ``2.0``). An empty list is refused."""
    one = number(low, high, low_open=low_open, high_open=high_open, unit=unit)

    def parse(text: str):
        if single and "," not in text:
            return one(text)
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            what = f"number{' of ' + unit if unit else ''}"
            raise argparse.ArgumentTypeError(f"needs at least one {what}, comma-separated "
                                             f"(e.g. 1,2,4), got {text!r}")
        return [one(t) for t in items]

    parse.__name__ = "number_list"
    return parse


def json_path(text: str) -> Path:
    """``--json PATH`` checked before a benchmark runs: not a directory, its folder creatable
    and writable (``ValueError`` naming the path otherwise)."""
    path = Path(text)
    if path.is_dir():
        raise ValueError(f"--json {path} is a directory; give a file path, "
                         f"e.g. {path / 'bench.json'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--json {path}: cannot create its folder ({e.strerror})") from e
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"--json {path} is not writable")
    return path


def json_text(obj) -> str:
    """``json.dumps`` with NaN and infinities written as ``null`` (strict JSON: a summary with
    no successful request has no latency, and ``NaN`` is not JSON outside Python)."""
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x
    return json.dumps(clean(obj), indent=2, allow_nan=False) + "\n"
