"""Bit packing: ``b``-bit unsigned codes stored densely, so storage is ``b/8`` bytes per value.

Two versions side by side, tied by a test:

* :func:`pack_bits` / :func:`unpack_bits` — any ``b`` in 1..8, as a little-endian bit stream
  (value ``i`` occupies bits ``i·b … i·b + b - 1``); eight 3-bit values fill three bytes;
* :func:`pack_int4` / :func:`unpack_int4` — the common case, two nibbles per byte:
  ``byte = v[2j] | v[2j+1] << 4`` (the same bytes as the bit stream with ``b = 4``).

The packed axis is the last one; an odd count is padded with a zero code. Chapter 03.
"""

from __future__ import annotations

import torch


def _check_codes(codes: torch.Tensor, bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits!r}")
    if codes.dtype not in (torch.uint8, torch.int16, torch.int32, torch.int64):
        raise ValueError(f"codes must be an unsigned-valued integer tensor, got {codes.dtype}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 2 ** bits):
        raise ValueError(f"codes must lie in [0, {2 ** bits - 1}] for {bits} bits, "
                         f"got [{int(codes.min())}, {int(codes.max())}]")


def packed_length(n: int, bits: int) -> int:
    """Bytes needed for ``n`` codes of ``bits`` bits: ``ceil(n · bits / 8)``."""
    return -(-n * bits // 8)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``codes (..., n)`` in ``[0, 2**bits)`` into ``uint8 (..., ceil(n·bits/8))``."""
    _check_codes(codes, bits)
    *lead, n = codes.shape
    shifts = torch.arange(bits, device=codes.device)
    stream = ((codes.to(torch.int64).unsqueeze(-1) >> shifts) & 1).reshape(*lead, n * bits)
    pad = packed_length(n, bits) * 8 - n * bits
    stream = torch.nn.functional.pad(stream, (0, pad)).reshape(*lead, -1, 8)
    weights = torch.pow(2, torch.arange(8, device=codes.device))
    return (stream * weights).sum(-1).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``uint8 (..., m)`` -> ``uint8 (..., n)`` codes."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed must be uint8, got {packed.dtype}")
    if packed.shape[-1] != packed_length(n, bits):
        raise ValueError(f"{n} codes of {bits} bits need {packed_length(n, bits)} bytes, "
                         f"got {packed.shape[-1]}")
    *lead, m = packed.shape
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    stream = ((packed.unsqueeze(-1) >> shifts) & 1).reshape(*lead, m * 8)
    stream = stream[..., : n * bits].reshape(*lead, n, bits)
    out = stream[..., 0].clone()
    for k in range(1, bits):
        out |= stream[..., k] << k
    return out


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte: ``byte = v[2j] | v[2j+1] << 4``; ``(..., n) -> (..., ceil(n/2))``."""
    _check_codes(codes, 4)
    c = codes.to(torch.uint8)
    if c.shape[-1] % 2:
        c = torch.nn.functional.pad(c, (0, 1))
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: ``uint8 (..., ceil(n/2)) -> uint8 (..., n)``."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed must be uint8, got {packed.dtype}")
    if packed.shape[-1] != packed_length(n, 4):
        raise ValueError(f"{n} int4 codes need {packed_length(n, 4)} bytes, got {packed.shape[-1]}")
    out = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)
    return out[..., :n]


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack with the fastest path for ``bits`` (nibbles for 4, raw bytes for 8, bit stream else)."""
    if bits == 8:
        _check_codes(codes, 8)
        return codes.to(torch.uint8)
    return pack_int4(codes) if bits == 4 else pack_bits(codes, bits)


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack`."""
    if bits == 8:
        return packed
    return unpack_int4(packed, n) if bits == 4 else unpack_bits(packed, bits, n)
