"""``QuantizedTensor``: codes + scales (+ zero points) with honest byte counts.

Every scheme stores a weight ``w`` of shape ``(..., C)`` as a 2-D grid of ``R`` rows and
``C`` columns cut into groups of ``g`` consecutive columns (per tensor: one row, one group;
per channel: ``g = C``; group-wise: ``g`` = 32…256; a short last group is padded with zeros
while its scale is computed, but only the ``C`` real codes are stored). Each group
has one scale (fp16, or fp32 when fp16 cannot hold it) and, for asymmetric integer schemes,
one zero point (uint8). ``nbytes`` is the sum of the bytes of every stored tensor — codes as
actually packed, scales, zero points and AWQ's input scales — so that
``nbytes / numel`` is the real storage per parameter. Chapter 03.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llminfra.quant import packing
from llminfra.quant.nf4_levels import nf4_decode


@dataclass(frozen=True)
class GroupLayout:
    """How a tensor of ``shape`` is cut: ``rows × cols`` (cols padded to ``n_groups · group``)."""

    shape: tuple[int, ...]
    rows: int
    cols: int
    group: int

    @property
    def n_groups(self) -> int:
        """Groups per row: ``ceil(cols / group)``."""
        return -(-self.cols // self.group)

    @property
    def padded_cols(self) -> int:
        """``n_groups · group`` (columns after padding the last group)."""
        return self.n_groups * self.group


def check_weight(w: torch.Tensor) -> None:
    """``ValueError`` unless ``w`` is a non-empty, finite, floating tensor whose values float32
    (the dtype the schemes compute in) can hold."""
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise ValueError(f"expected a floating-point tensor, got {type(w).__name__} "
                         f"{getattr(w, 'dtype', '')}")
    if w.numel() == 0:
        raise ValueError(f"cannot quantize an empty tensor (shape {tuple(w.shape)})")
    bad = ~torch.isfinite(w)
    if bool(bad.any()):
        n_nan, n_inf = int(torch.isnan(w).sum()), int(torch.isinf(w).sum())
        raise ValueError(f"cannot quantize a tensor with {n_nan} NaN and {n_inf} inf values: "
                         "scales would be NaN/inf; clean the weights first")
    amax = float(w.detach().abs().max())
    if amax > torch.finfo(torch.float32).max:  # finite in float64, inf once cast to float32
        raise ValueError(f"cannot quantize values up to {amax:.4g}: quantization computes in "
                         f"float32, whose range ends at {torch.finfo(torch.float32).max:.4g}; "
                         "rescale the weights first")


def layout_for(w: torch.Tensor, granularity: str | int) -> GroupLayout:
    """Layout for ``granularity`` ``"tensor"``, ``"channel"`` or a group size ``g >= 1``."""
    shape = tuple(w.shape)
    cols = shape[-1] if w.dim() else 1
    rows = w.numel() // cols
    if granularity == "tensor":
        return GroupLayout(shape, 1, w.numel(), w.numel())
    if granularity == "channel":
        return GroupLayout(shape, rows, cols, cols)
    if isinstance(granularity, int) and not isinstance(granularity, bool) and granularity >= 1:
        return GroupLayout(shape, rows, cols, granularity)
    raise ValueError(f"granularity must be 'tensor', 'channel' or a positive group size, "
                     f"got {granularity!r}")


def to_groups(w: torch.Tensor, layout: GroupLayout) -> torch.Tensor:
    """``w`` as float32 ``(rows, n_groups, group)``, the last group padded with zeros."""
    x = w.detach().float().reshape(layout.rows, layout.cols)
    x = torch.nn.functional.pad(x, (0, layout.padded_cols - layout.cols))
    return x.reshape(layout.rows, layout.n_groups, layout.group)


def ungroup_codes(u: torch.Tensor, layout: GroupLayout) -> torch.Tensor:
    """Grouped codes ``(rows, n_groups, group)`` -> ``(rows, cols)``, padding dropped (only
    real values are stored)."""
    return u.reshape(layout.rows, layout.padded_cols)[:, : layout.cols]


def store_scale(scale: torch.Tensor) -> torch.Tensor:
    """Scales as fp16 when fp16 holds every one of them at full precision (no overflow, no
    subnormal: below ``finfo(float16).tiny`` = 2**-14 an fp16 scale keeps only a few bits, and
    the codes of its group would be clamped far from their values), else fp32."""
    s16 = scale.to(torch.float16)
    subnormal = (scale != 0) & (scale.abs() < torch.finfo(torch.float16).tiny)
    ok = torch.isfinite(s16).all() and not bool(subnormal.any())
    return s16 if ok else scale.float()


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


@dataclass(frozen=True)
class QuantizedTensor:
    """A quantized tensor: ``codes`` (packed uint8, or float8), ``scale (rows, n_groups)``,
    optional ``zero (rows, n_groups)`` uint8, optional AWQ ``input_scale (cols,)``.

    ``kind`` is ``"int"`` (``w ≈ (u - z) · scale``, ``z = 2**(bits-1)`` when symmetric),
    ``"nf4"`` (``w ≈ NF4[u] · scale``) or ``"fp8"`` (``w ≈ float(codes) · scale``).
    """

    scheme: str
    kind: str
    bits: int
    layout: GroupLayout
    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None = None
    input_scale: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the original tensor."""
        return self.layout.shape

    def numel(self) -> int:
        """Number of quantized values (of the original tensor)."""
        n = 1
        for s in self.layout.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        """Bytes actually stored: codes + scales + zero points + input scales."""
        return sum(_nbytes(t) for t in (self.codes, self.scale, self.zero, self.input_scale))

    @property
    def bytes_per_param(self) -> float:
        """``nbytes / numel``: e.g. 0.5234 for int4-g128 (4 bits + fp16 scale + uint8 zero / 128)."""
        return self.nbytes / self.numel()

    def values_2d(self) -> torch.Tensor:
        """Dequantized values as the 2-D grid ``(rows, cols)`` (float32), before input scales."""
        L = self.layout
        if self.kind == "fp8":
            q = self.codes.float()
        else:
            u = packing.unpack(self.codes, self.bits, L.cols)
            if self.kind == "nf4":
                q = nf4_decode(u)
            else:
                q = u.float()
        if L.padded_cols != L.cols:
            q = torch.nn.functional.pad(q, (0, L.padded_cols - L.cols))
        q = q.reshape(L.rows, L.n_groups, L.group)
        if self.kind == "int":
            q = q - (self.zero.float().unsqueeze(-1) if self.zero is not None else 2 ** (self.bits - 1))
        q = q * self.scale.float().unsqueeze(-1)
        return q.reshape(L.rows, L.padded_cols)[:, : L.cols]

    def step_per_value(self) -> torch.Tensor:
        """Each value's group scale, shape ``self.shape`` (the rounding step of int schemes)."""
        L = self.layout
        s = self.scale.float().repeat_interleave(L.group, dim=1)[:, : L.cols]
        return s.reshape(L.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The approximation of the original tensor, shape ``self.shape``, in ``dtype``."""
        w = self.values_2d().reshape(self.layout.shape)
        if self.input_scale is not None:
            w = w / self.input_scale.float()
        return w.to(dtype)
