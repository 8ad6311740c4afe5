"""Numbers on the command line: argparse ``type=`` checkers that name the allowed range.

``parser.add_argument("--rate", type=number(0, low_open=True, unit="requests per second"))``
turns ``--rate nan`` into ``llminfra loadtest: argument --rate: must be a finite number of
requests per second > 0, got 'nan'`` (exit status 2) instead of a traceback, or a run that
hangs, far from the option that caused it. argparse adds the option's name; the checker says
what is allowed. A bare ``type=float`` lets ``nan``, ``inf`` and negatives through, a bare
``type=int`` zero and negatives. Used by :mod:`llminfra.cli`.
"""

from __future__ import annotations

import argparse
import math


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
