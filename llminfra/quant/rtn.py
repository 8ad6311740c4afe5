"""Round-to-nearest integer quantization: symmetric absmax and asymmetric zero point.

For a group ``x`` of weights and ``b`` bits:

* **absmax** (symmetric): ``q_max = 2**(b-1) - 1``, ``s = max|x| / q_max``,
  ``q = clamp(round(x / s), -q_max, q_max)``, ``x̂ = q · s``. Error per weight ≤ ``s / 2``.
  Worked example: ``x = [0.5, -1.27]``, int8: ``s = 0.01``, ``q = [50, -127]``.
* **zero point** (asymmetric): the range ``[min(x, 0), max(x, 0)]`` is mapped onto
  ``[0, 2**b - 1]``: ``s = (max - min) / (2**b - 1)``, ``z = round(-min / s)``,
  ``u = clamp(round(x / s) + z, 0, 2**b - 1)``, ``x̂ = (u - z) · s``. It uses all ``2**b``
  levels, which pays off when the group is lopsided (e.g. after a ReLU).

Codes are stored unsigned (``u = q + 2**(b-1)`` when symmetric) and packed (see
:mod:`llminfra.quant.packing`); a group of zeros gets scale 0 and decodes to zeros exactly.
See Jacob et al., 2018 (arXiv:1712.05877, eq. 1) for the affine scheme and Dettmers et al.,
2022 (LLM.int8(), arXiv:2208.07339, §2) for absmax. Chapter 03.
"""

from __future__ import annotations

import torch

from llminfra.quant import packing
from llminfra.quant.tensor import (QuantizedTensor, check_weight, layout_for, store_scale,
                                   to_groups, ungroup_codes)


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an integer in 2..8, got {bits!r}")
    return bits


def absmax_scale(G: torch.Tensor, bits: int) -> torch.Tensor:
    """Stored (fp16) scale ``max|x| / (2**(b-1) - 1)`` over the last axis of ``G``."""
    return store_scale(G.abs().amax(-1) / (2 ** (_check_bits(bits) - 1) - 1))


def zeropoint_params(G: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored scale and uint8 zero point over the last axis of ``G`` (see module docstring)."""
    levels = 2 ** _check_bits(bits) - 1
    lo = G.amin(-1).clamp(max=0)
    hi = G.amax(-1).clamp(min=0)
    span = hi - lo  # inf when both ends are beyond ±1.7e38: then take the range in two halves
    scale = store_scale(torch.where(torch.isinf(span), hi / levels - lo / levels, span / levels))
    safe = torch.where(scale == 0, torch.ones_like(scale), scale).float()
    zero = torch.round(-lo / safe).clamp(0, levels).to(torch.uint8)
    return scale, zero


def encode_int(G: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
               bits: int) -> torch.Tensor:
    """Unsigned codes ``u`` (uint8, shape of ``G``) for given scales (and zero points).

    ``scale``/``zero`` broadcast against ``G`` with the group axis last removed.
    """
    s = scale.float().unsqueeze(-1)
    s = torch.where(s == 0, torch.ones_like(s), s)
    if zero is None:
        qmax, mid = 2 ** (bits - 1) - 1, 2 ** (bits - 1)
        return (torch.round(G / s).clamp(-qmax, qmax) + mid).to(torch.uint8)
    u = torch.round(G / s) + zero.float().unsqueeze(-1)
    return u.clamp(0, 2 ** bits - 1).to(torch.uint8)


def check_decodable(scale: torch.Tensor, zero: torch.Tensor | None, bits: int) -> None:
    """``ValueError`` if a grid's extreme codes decode beyond float32's range (values within
    about ``s/2`` of ±3.4e38: the code nearest such a value would dequantize to ±inf)."""
    s = scale.float()
    if zero is None:
        ends = s * (2 ** (bits - 1) - 1)
    else:
        ends = torch.maximum(zero.float(), 2 ** bits - 1 - zero.float()) * s
    if not bool(torch.isfinite(ends).all()):
        raise ValueError(f"weights too close to float32's limit "
                         f"({torch.finfo(torch.float32).max:.4g}) for a {bits}-bit grid: its "
                         "codes would decode to ±inf; rescale the weights first")


def grid_params(G: torch.Tensor, bits: int, symmetric: bool):
    """``(scale, zero)`` of the groups ``G (..., n, g)``: absmax (``zero = None``) when
    ``symmetric``, else min/max zero-point. ``ValueError`` if the grid cannot be decoded in
    float32 (:func:`check_decodable`)."""
    scale, zero = (absmax_scale(G, bits), None) if symmetric else zeropoint_params(G, bits)
    check_decodable(scale, zero, bits)
    return scale, zero


def quantize_int(w: torch.Tensor, bits: int, granularity: str | int = "channel",
                 symmetric: bool = True, scheme: str | None = None) -> QuantizedTensor:
    """Round-to-nearest ``bits``-bit quantization of ``w`` per tensor / channel / group.

    ``w (..., C)`` -> :class:`QuantizedTensor` with codes packed ``bits`` per value.
    """
    check_weight(w)
    _check_bits(bits)
    layout = layout_for(w, granularity)
    G = to_groups(w, layout)
    scale, zero = grid_params(G, bits, symmetric)
    u = ungroup_codes(encode_int(G, scale, zero, bits), layout)
    name = scheme or f"int{bits}-{granularity if isinstance(granularity, str) else f'g{granularity}'}"
    return QuantizedTensor(name, "int", bits, layout, packing.pack(u, bits), scale, zero)


def absmax_quantize(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor symmetric absmax: ``(q int8, scale float32 scalar)`` with ``x ≈ q · scale``.

    ``scale = max|x| / (2**(b-1) - 1)`` (kept in float32 here, unlike the stored fp16 scales of
    :func:`quantize_int`); all-zero ``x`` gives ``scale = 0`` and ``q = 0``. The first exercise
    of chapter 03 writes this function.
    """
    check_weight(x)
    qmax = 2 ** (_check_bits(bits) - 1) - 1
    scale = x.detach().abs().max().float() / qmax
    safe = scale if scale > 0 else torch.ones_like(scale)
    q = torch.round(x.float() / safe).clamp(-qmax, qmax).to(torch.int8)
    return q, scale


def absmax_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q · scale`` in float32 (inverse of :func:`absmax_quantize` up to rounding)."""
    return q.float() * scale


def fake_quantize_int(w: torch.Tensor, bits: int, granularity: str | int = "channel",
                      symmetric: bool = True) -> torch.Tensor:
    """``quantize_int(w, …).dequantize()`` without packing or input checks (for searches that
    quantize the same weight many times, e.g. AWQ's grid); equal to it (tested)."""
    layout = layout_for(w, granularity)
    G = to_groups(w, layout)
    scale, zero = grid_params(G, bits, symmetric)
    u = encode_int(G, scale, zero, bits).float()
    z = zero.float().unsqueeze(-1) if zero is not None else 2 ** (bits - 1)
    deq = (u - z) * scale.float().unsqueeze(-1)
    return deq.reshape(layout.rows, layout.padded_cols)[:, : layout.cols].reshape(layout.shape)
