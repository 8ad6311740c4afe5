"""Scheme names -> what to do: ``"int4-g128"`` means 4-bit integers, groups of 128, zero point.

Grammar (the names the course uses first):

* ``int8-absmax`` = ``int8-tensor`` (symmetric, one scale per tensor);
  ``int8-zeropoint`` = ``int8-tensor-asym``;
* ``int{b}-{tensor|channel|g{G}}[-sym|-asym]``, ``b`` in 2..8; default symmetric (absmax) for
  ``tensor`` / ``channel``, asymmetric (zero point) for groups;
* ``fp8-e4m3`` / ``fp8-e5m2`` (one scale per tensor), ``…-channel`` (one per output row);
* ``nf4`` (blocks of 64, as in QLoRA) or ``nf4-g{G}``;
* for :func:`quantize_model` also ``gptq-<int scheme>``, ``awq-<int scheme>`` and
  ``int8-dynamic`` (int8 weights per channel and int8 activations per token, computed on the fly).

Chapter 03.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ALIASES = {"int8-absmax": "int8-tensor-sym", "int8-zeropoint": "int8-tensor-asym"}

#: the schemes the bench and the notebook walk through, mildest first
STANDARD_SCHEMES = ("int8-absmax", "int8-zeropoint", "int8-channel", "fp8-e4m3", "fp8-e5m2",
                    "int4-g128", "nf4", "int4-channel", "int3-g128")

_INT = re.compile(r"^int([2-8])-(tensor|channel|g([1-9]\d*))(?:-(sym|asym))?$")
_FP8 = re.compile(r"^fp8-(e4m3|e5m2)(?:-(tensor|channel))?$")
_NF4 = re.compile(r"^nf4(?:-g([1-9]\d*))?$")


@dataclass(frozen=True)
class Scheme:
    """A parsed weight-quantization scheme."""

    name: str
    kind: str                 # "int" | "fp8" | "nf4"
    bits: int
    granularity: str | int    # "tensor" | "channel" | group size
    symmetric: bool = True
    fp8_format: str | None = None


def parse_scheme(name: str) -> Scheme:
    """Parse a tensor-level scheme name; ``KeyError`` says what is allowed."""
    if not isinstance(name, str):
        raise KeyError(f"scheme must be a string, got {name!r}")
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if m := _INT.match(key):
        bits, gran, g, sym = int(m[1]), m[2], m[3], m[4]
        granularity = int(g) if g else gran
        symmetric = (sym == "sym") if sym else not g
        return Scheme(name, "int", bits, granularity, symmetric)
    if m := _FP8.match(key):
        return Scheme(name, "fp8", 8, m[2] or "tensor", True, f"fp8-{m[1]}")
    if m := _NF4.match(key):
        return Scheme(name, "nf4", 4, int(m[1]) if m[1] else 64, True)
    raise KeyError(f"unknown quantization scheme {name!r}; use e.g. {', '.join(STANDARD_SCHEMES)}, "
                   "int{2..8}-{tensor|channel|g<G>}[-sym|-asym], fp8-{e4m3|e5m2}[-channel], nf4[-g<G>]")
