"""Number formats bit by bit: round a real number to a format, and show its encoding.

The layout data (sign / exponent / mantissa bits, range) lives in :mod:`llminfra.specs.formats`;
here it is *used*: a float format with ``e`` exponent and ``m`` mantissa bits and bias
``b = 2**(e-1) - 1`` holds

* normal numbers ``(-1)**s · 2**(E - b) · (1 + M / 2**m)`` for stored exponent ``1 <= E``,
* subnormals ``(-1)**s · 2**(1 - b) · (M / 2**m)`` for ``E = 0``,

so rounding ``x`` means: find its binade ``2**floor(log2|x|)`` (never below ``2**(1-b)``),
round to the nearest multiple of that binade's step ``2**(floor(log2|x|) - m)`` (ties to even),
and saturate / overflow past the largest finite value. :func:`round_to_format` does exactly
that in software and a test checks it against torch's own casts (fp16, bf16, fp8 e4m3 / e5m2).

Sources: IEEE 754-2008; bf16 (Kalamkar et al., 2019, arXiv:1905.12322); fp8 (Micikevicius et
al., 2022, arXiv:2209.05433); nf4 (Dettmers et al., 2023, arXiv:2305.14314). Chapter 03.
"""

from __future__ import annotations

import math

import torch

from llminfra.specs.formats import NumberFormat, get_format
from llminfra.quant.nf4 import nf4_code

#: torch dtypes of the float formats torch stores natively
TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
    "fp8-e4m3": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2,
}

#: formats the number-format widget shows, in order
SHOWN_FORMATS = ("fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "int8", "int4", "nf4")


def _float_round(x: torch.Tensor, fmt: NumberFormat) -> torch.Tensor:
    """Software round-to-nearest-even of float64 ``x`` into float format ``fmt``."""
    m, bias = fmt.mantissa_bits, fmt.bias
    a = x.abs()
    exp = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a))))
    exp = torch.clamp(exp, min=1 - bias)            # subnormals share the lowest binade's step
    step = torch.pow(2.0, exp - m)
    r = torch.round(a / step) * step                # torch.round: ties to even
    big = r > fmt.max
    if fmt.ieee_special:                            # overflow -> inf (IEEE)
        r = torch.where(big, torch.full_like(r, math.inf), r)
    else:                                           # e4m3fn has no inf: overflow -> NaN
        r = torch.where(big, torch.full_like(r, math.nan), r)
    r = torch.where(torch.isinf(a), a, r)
    return torch.copysign(r, x)


def round_to_format(x: torch.Tensor | float, fmt_name: str) -> torch.Tensor:
    """Nearest value of format ``fmt_name`` to each element of ``x`` (float64 result).

    Floats: binade step ``2**(floor(log2|x|) - m)``, ties to even, overflow to inf (NaN for
    e4m3). ``int8`` / ``int4``: nearest integer, clamped to ``[-2**(b-1), 2**(b-1) - 1]``.
    ``nf4``: nearest of the 16 NF4 code values (inputs are taken as already scaled to [-1, 1]).
    Example: ``round_to_format(0.1, "bf16") == 0.10009765625`` (7 mantissa bits).
    """
    fmt = get_format(fmt_name)
    x = torch.as_tensor(x, dtype=torch.float64)
    if fmt.kind == "float":
        return _float_round(x, fmt)
    if fmt.kind == "int":
        return torch.clamp(torch.round(x), fmt.min, fmt.max)
    code = nf4_code(torch.float64)
    return code[(x.clamp(-1, 1).unsqueeze(-1) - code).abs().argmin(-1)]


def float_fields(value: float, fmt_name: str) -> tuple[int, int, int]:
    """``(sign, stored_exponent, mantissa)`` bit fields of an *exactly representable* finite
    ``value`` in float format ``fmt_name`` (round it first with :func:`round_to_format`)."""
    fmt = get_format(fmt_name)
    if fmt.kind != "float":
        raise ValueError(f"{fmt_name!r} is not a float format; float formats: {list(TORCH_DTYPES)}")
    if not math.isfinite(value):
        raise ValueError(f"value must be finite to have fields, got {value!r}")
    sign = 1 if math.copysign(1.0, value) < 0 else 0
    a, m, bias = abs(value), fmt.mantissa_bits, fmt.bias
    if a == 0:
        return sign, 0, 0
    e = math.floor(math.log2(a))
    if e < 1 - bias:                                 # subnormal
        return sign, 0, int(round(a / 2.0 ** (1 - bias - m)))
    return sign, e + bias, int(round((a / 2.0 ** e - 1) * 2 ** m))


def encode(value: float, fmt_name: str) -> dict:
    """How ``value`` is stored in ``fmt_name``: bit string, stored value, rounding error.

    Returns ``{"format", "bits" (e.g. "0 01111 0000000000"), "stored", "abs_error",
    "rel_error"}``. Integers show two's complement; nf4 shows the 4-bit code index.
    """
    fmt = get_format(fmt_name)
    stored = float(round_to_format(value, fmt_name))
    if fmt.kind == "float" and math.isfinite(stored):
        s, e, mant = float_fields(stored, fmt_name)
        bits = f"{s} {e:0{fmt.exponent_bits}b} {mant:0{fmt.mantissa_bits}b}"
    elif fmt.kind == "int":
        bits = format(int(stored) & (2 ** fmt.bits - 1), f"0{fmt.bits}b")
    elif fmt.kind == "lookup":
        idx = int((nf4_code(torch.float64) - stored).abs().argmin())
        bits = format(idx, "04b")
    else:
        bits = "special (inf / NaN)"
    err = abs(stored - value) if math.isfinite(stored) else math.inf
    rel = err / abs(value) if value != 0 else (0.0 if err == 0 else math.inf)
    return {"format": fmt_name, "bits": bits, "stored": stored, "abs_error": err, "rel_error": rel}


def encode_all(value: float, formats: tuple[str, ...] = SHOWN_FORMATS) -> list[dict]:
    """:func:`encode` of ``value`` in every format of ``formats`` (the widget's table)."""
    return [encode(value, f) for f in formats]


def finfo_comparison(fmt_name: str) -> dict:
    """Range computed from the bits next to ``torch.finfo`` of the matching torch dtype.

    Returns ``{"max": (from_bits, torch), "min_normal": (...), "eps": (...)}``.
    """
    if fmt_name not in TORCH_DTYPES:
        raise KeyError(f"torch has no dtype for {fmt_name!r}; it has: {list(TORCH_DTYPES)}")
    fmt, fi = get_format(fmt_name), torch.finfo(TORCH_DTYPES[fmt_name])
    return {"max": (fmt.max, float(fi.max)), "min_normal": (fmt.min_normal, float(fi.smallest_normal)),
            "eps": (fmt.eps, float(fi.eps))}
