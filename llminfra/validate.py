"""Argument guards shared by every layer: one wording for "this must be a positive integer"
(a count), for "this must be an integer >= 0" (an offset or an optional amount), and for "this
must be a finite number > 0" (or >= 0: a rate, a price, a time).

A leaf module: it imports nothing from llminfra, so ``specs``, ``calc``, ``attention`` and
every layer above may use it (tests/test_repository_rules.py allows it everywhere).

Rule: a count (layers, heads, blocks, tokens, GPUs, ...) is a Python ``int`` ``>= 1``. ``bool``
is refused although it subclasses ``int`` (``True`` is not a count), floats are refused even
when whole (``2.0``: a float where a count belongs is usually a computed value that lost its
meaning), and so are NumPy integers (``numpy.int64(4)``): the package stores counts in
dataclasses that are printed, hashed and serialised, where a NumPy scalar misbehaves; pass
``int(x)``. Used across the course; the guard itself is taught in no chapter.
"""

from __future__ import annotations

import math


def positive_int(name: str, value, *, where: str = "") -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) ``>= 1``; else ``ValueError``.

    The message is ``f"{where}{name} must be a positive integer, got {value!r}"``: ``name``
    is the argument's name, ``where`` an optional prefix naming its owner (``"PagedKVCache: "``,
    ``"ModelConfig."``).

    >>> positive_int("num_blocks", 8)
    8
    >>> positive_int("n_layers", 0, where="ModelConfig.")
    Traceback (most recent call last):
    ...
    ValueError: ModelConfig.n_layers must be a positive integer, got 0
    >>> positive_int("batch", 2.0)
    Traceback (most recent call last):
    ...
    ValueError: batch must be a positive integer, got 2.0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value, *, where: str = "") -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) ``>= 0``; else ``ValueError``.

    Same rule as :func:`positive_int` but 0 is allowed (a start position, a number of new
    tokens, a retry budget). Message: ``f"{where}{name} must be an integer >= 0, got {value!r}"``.

    >>> non_negative_int("start_pos", 0)
    0
    >>> non_negative_int("gamma", -1)
    Traceback (most recent call last):
    ...
    ValueError: gamma must be an integer >= 0, got -1
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}{name} must be an integer >= 0, got {value!r}")
    return value


def _real(value) -> bool:
    """An ``int`` or ``float`` (NumPy floats subclass ``float``), not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_finite(name: str, value, *, where: str = "") -> float:
    """Return ``float(value)`` if it is a real number (``int`` or ``float``, not ``bool``)
    ``> 0`` and finite; else ``ValueError``: ``f"{where}{name} must be a finite number > 0,
    got {value!r}"``. A rate, a price, a time or a size (``True`` is not 1 second, ``inf`` is
    not a price).

    >>> positive_finite("tokens_per_s", 250)
    250.0
    >>> positive_finite("peak_flops", float("inf"))
    Traceback (most recent call last):
    ...
    ValueError: peak_flops must be a finite number > 0, got inf
    """
    if not _real(value) or not math.isfinite(value) or not value > 0:
        raise ValueError(f"{where}{name} must be a finite number > 0, got {value!r}")
    return float(value)


def non_negative_finite(name: str, value, *, where: str = "") -> float:
    """As :func:`positive_finite`, 0 allowed: ``f"{where}{name} must be a finite number >= 0,
    got {value!r}"``.

    >>> non_negative_finite("overhead_s", 0)
    0.0
    """
    if not _real(value) or not math.isfinite(value) or not value >= 0:
        raise ValueError(f"{where}{name} must be a finite number >= 0, got {value!r}")
    return float(value)
