"""Rotary position embedding (RoPE, Su et al. 2021, arXiv:2104.09864): each pair
(x_2i, x_2i+1) of a head is rotated by the angle m·θ_i of its position m, so the dot product of
a rotated q and k depends only on the distance between their positions.

:func:`rope_inv_freq` gives θ_i (rescaled for long contexts: position interpolation, Llama
3.1's bands), :func:`rotary_angles` and :func:`rotary_angles_at` their cos and sin at a run of
positions or at any positions, :func:`apply_rotary` the rotation, with the pairing of Meta's
Llama code. The decoder (:mod:`llminfra.model.transformer`) applies it to q and k of every
layer. Taught in chapter 01.
"""

from __future__ import annotations

import torch


def rope_inv_freq(head_dim: int, theta: float, scaling=None,
                  device: torch.device | None = None) -> torch.Tensor:
    """The rotary frequencies θ_i = theta^(-2i/d), i = 0 .. d/2-1 (Su et al. 2021,
    arXiv:2104.09864, eq. 15), float32 ``(d/2,)``, rescaled for long contexts when ``scaling``
    (a :attr:`ModelConfig.rope_scaling`) says so:

    * ``linear`` (position interpolation, Chen et al. 2023, arXiv:2306.15595): θ_i / factor;
    * ``llama3`` (Meta's Llama 3.1 release): wavelengths 2π/θ_i longer than
      original_max_position_embeddings / low_freq_factor are divided by ``factor``, those
      shorter than … / high_freq_factor kept, the band between interpolated linearly.
    """
    i = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
    inv_freq = theta ** (-i / head_dim)  # (d/2,)
    if scaling is None:
        return inv_freq
    s = dict(scaling)
    factor = float(s["factor"])
    if s["rope_type"] == "linear":
        return inv_freq / factor
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * torch.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)  # 0 at the low edge, 1 at the high edge
    between = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(between, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)


def rotary_angles(head_dim: int, start_pos: int, n_tokens: int, theta: float,
                  device: torch.device | None = None,
                  scaling=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles m·θ_i for positions m = start_pos .. start_pos+T-1.

    θ_i from :func:`rope_inv_freq`. Returns two float32 tensors of shape ``(T, d/2)``.
    """
    inv_freq = rope_inv_freq(head_dim, theta, scaling, device)  # (d/2,)
    m = torch.arange(start_pos, start_pos + n_tokens, device=device, dtype=torch.float32)
    angles = torch.outer(m, inv_freq)  # (T, d/2)
    return angles.cos(), angles.sin()


def rotary_angles_at(head_dim: int, positions: torch.Tensor, theta: float,
                     scaling=None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rotary_angles` at arbitrary positions ``(N,)`` (a ragged step's tokens), ``(N, d/2)``
    each; equal to ``rotary_angles(head_dim, p, 1, theta)`` row by row."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling, positions.device)  # (d/2,)
    angles = torch.outer(positions.to(torch.float32), inv_freq)  # (N, d/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_2i, x_2i+1) of every head by angle m·θ_i (RoPE, Su et al. 2021,
    arXiv:2104.09864, eq. 34; the pairing of Meta's Llama code).

    x ``(B, heads, T, d)``, cos/sin ``(T, d/2)`` -> ``(B, heads, T, d)``. Dot products of
    rotated q and k depend only on the distance between their positions.
    """
    xp = x.float().unflatten(-1, (-1, 2))  # (B, heads, T, d/2, 2)
    x0, x1 = xp[..., 0], xp[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)
