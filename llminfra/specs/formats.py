"""Number formats as data: bits, sign / exponent / mantissa, bytes, range.

Ranges are computed from the bit layout, not typed in:

* IEEE-style floats: ``max = (2 - 2**-m) * 2**(2**(e-1) - 1)``, ``min_normal = 2**(2 - 2**(e-1))``,
  machine epsilon ``2**-m`` (e exponent bits, m mantissa bits, bias ``2**(e-1) - 1``).
* fp8 e4m3 (the "fn" variant of Micikevicius et al., 2022, arXiv:2209.05433) has no infinities
  and only one NaN pattern, so its top exponent holds numbers: ``max = 1.75 * 2**8 = 448``.
* Integers: ``[-2**(b-1), 2**(b-1) - 1]``.

Taught in chapters 02 and 03.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class NumberFormat:
    """A number format: its bit layout and the range that follows from it."""

    name: str
    kind: Literal["float", "int", "lookup"]
    bits: int
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    ieee_special: bool = True  # top exponent reserved for inf / NaN
    source: str = ""

    @property
    def bytes(self) -> float:
        return self.bits / 8

    @property
    def bias(self) -> int | None:
        return 2 ** (self.exponent_bits - 1) - 1 if self.kind == "float" else None

    @property
    def max(self) -> float:
        """Largest finite value."""
        if self.kind == "int":
            return float(2 ** (self.bits - 1) - 1)
        if self.kind == "lookup":
            return 1.0
        e, m, b = self.exponent_bits, self.mantissa_bits, self.bias
        if self.ieee_special:
            return (2 - 2.0 ** -m) * 2.0 ** (2 ** e - 2 - b)
        # e4m3fn: all-ones exponent is usable except mantissa all-ones (NaN)
        return (2 - 2.0 ** -(m - 1)) * 2.0 ** (2 ** e - 1 - b)

    @property
    def min(self) -> float:
        if self.kind == "int":
            return float(-(2 ** (self.bits - 1)))
        return -self.max

    @property
    def min_normal(self) -> float | None:
        """Smallest positive normal number (floats only)."""
        return 2.0 ** (1 - self.bias) if self.kind == "float" else None

    @property
    def eps(self) -> float | None:
        """Machine epsilon: the gap between 1 and the next representable number."""
        if self.kind == "float":
            return 2.0 ** -self.mantissa_bits
        return 1.0 if self.kind == "int" else None

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "bits": self.bits, "bytes": self.bytes,
                "sign_bits": self.sign_bits, "exponent_bits": self.exponent_bits,
                "mantissa_bits": self.mantissa_bits, "max": self.max, "min": self.min,
                "min_normal": self.min_normal, "eps": self.eps, "source": self.source}


_IEEE = "IEEE 754-2008"
_FP8 = "Micikevicius et al., 2022, 'FP8 Formats for Deep Learning', arXiv:2209.05433"

FORMATS: dict[str, NumberFormat] = {f.name: f for f in [
    NumberFormat("fp32", "float", 32, 1, 8, 23, source=_IEEE + " binary32"),
    NumberFormat("tf32", "float", 19, 1, 8, 10, source="NVIDIA A100 whitepaper (TensorFloat-32)"),
    NumberFormat("fp16", "float", 16, 1, 5, 10, source=_IEEE + " binary16"),
    NumberFormat("bf16", "float", 16, 1, 8, 7, source="Google Brain bfloat16 (Kalamkar et al., 2019, arXiv:1905.12322)"),
    NumberFormat("fp8-e4m3", "float", 8, 1, 4, 3, ieee_special=False, source=_FP8),
    NumberFormat("fp8-e5m2", "float", 8, 1, 5, 2, source=_FP8),
    NumberFormat("int8", "int", 8, 1, 0, 7, source="two's complement"),
    NumberFormat("int4", "int", 4, 1, 0, 3, source="two's complement"),
    NumberFormat("nf4", "lookup", 4, 0, 0, 0, source="Dettmers et al., 2023, 'QLoRA', arXiv:2305.14314 (16 quantiles of N(0,1), scaled to [-1, 1])"),
]}

#: bytes per element for the dtypes the memory model accepts (int4 / nf4 before group scales)
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "fp8-e4m3": 1.0, "fp8-e5m2": 1.0,
    "int8": 1.0, "int4": 0.5, "nf4": 0.5,
}


def get_format(name: str) -> NumberFormat:
    """The format called ``name``; ``KeyError`` lists the known formats."""
    key = str(name).strip().lower()
    if key not in FORMATS:
        raise KeyError(f"unknown number format {name!r}; known formats: {', '.join(FORMATS)}")
    return FORMATS[key]


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (``fp32`` … ``int4``); ``KeyError`` lists what is allowed."""
    key = str(dtype).strip().lower()
    if key not in DTYPE_BYTES:
        raise KeyError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]
