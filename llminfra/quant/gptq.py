"""GPTQ (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", arXiv:2210.17323, Algorithm 1).

Goal per linear layer: codes ``Q`` minimising the layer-output error ``||W X - Q X||²`` on
calibration inputs ``X``. Its Hessian is ``H = 2 X Xᵀ`` (here averaged over tokens). GPTQ walks
the columns ``j = 0 … C-1``; after rounding column ``j`` it spreads the rounding error over the
columns not yet quantized, the optimal-brain-surgeon update

    err = (w_j - q_j) / [H⁻¹]_jj,     W[:, j:] -= err · [H⁻¹]_{j, j:}

where ``H⁻¹`` is the *upper Cholesky factor of the inverse Hessian* (Algorithm 1, line 3:
``H⁻¹ ← Cholesky(H⁻¹)ᵀ``), which gives every step's inverse Hessian at once. Lazy batches
(§3, "Step 2"): updates inside a block of ``B = 128`` columns are applied at once to the rest
(``W[:, i2:] -= Err · H⁻¹[i1:i2, i2:]``), the same result with far less memory traffic.
Dampening adds ``λ = 1 %`` of the mean diagonal (§3, "Step 3"). Optional act-order processes
columns by decreasing ``diag(H)``; group scales are then fixed from the original weights
("static groups"), so the stored layout is the plain group-wise one. Chapter 03.
"""

from __future__ import annotations

import math

import torch

from llminfra.quant import packing
from llminfra.quant.rtn import grid_params
from llminfra.quant.tensor import (QuantizedTensor, check_weight, layout_for, store_scale,
                                   to_groups)
from llminfra.validate import positive_int


class HessianAccumulator:
    """Running ``H = (2 / n) Σ x xᵀ`` over calibration inputs ``x (..., C)`` (float64)."""

    def __init__(self, in_features: int, device: torch.device | str | None = None):
        self.H = torch.zeros(in_features, in_features, dtype=torch.float64, device=device)
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        """Add a batch of inputs ``x (..., C)``. A batch of 0 tokens adds nothing; a wrong width
        or a NaN / inf value is a ``ValueError`` (and leaves ``H`` as it was)."""
        C = self.H.shape[0]
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != C:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be calibration inputs (..., {C}), got {got}")
        x = x.detach().reshape(-1, C).to(self.H.device, torch.float64)
        m = x.shape[0]
        if m == 0:
            return
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"x holds {int(torch.isnan(x).sum())} NaN and "
                             f"{int(torch.isinf(x).sum())} inf values: H would be NaN; clean the "
                             "calibration inputs first")
        self.H *= self.n / (self.n + m)
        self.n += m
        self.H += (2.0 / self.n) * (x.T @ x)


def column_update(W: torch.Tensor, Hinv: torch.Tensor, i: int,
                  q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One GPTQ step on column ``i``: ``err = (W[:, i] - q) / Hinv[i, i]`` and
    ``W[:, i:] -= err ⊗ Hinv[i, i:]`` (so column ``i`` becomes ``q``).

    ``W (rows, C)``, ``Hinv (C, C)`` upper Cholesky factor of the inverse Hessian, ``q (rows,)``
    the rounded column. Returns ``(W_updated, err)``; ``W`` is not modified.
    """
    W = W.clone()
    err = (W[:, i] - q) / Hinv[i, i]
    W[:, i:] -= err.unsqueeze(1) * Hinv[i, i:].unsqueeze(0)
    return W, err


def inverse_hessian_factor(H: torch.Tensor, percdamp: float = 0.01) -> torch.Tensor:
    """Upper Cholesky factor of ``(H + λ I)⁻¹``, ``λ = percdamp · mean(diag H)``.

    Worked example: ``H = diag(1, 3)``, ``percdamp = 0.5``: ``λ = 1``, ``(H + I)⁻¹ =
    diag(1/2, 1/4)``, factor ``diag(1/√2, 1/2)``. ``ValueError`` if ``percdamp`` is not a finite
    number ``>= 0`` or ``H + λI`` is not positive definite (with a hint at the cause).
    """
    if isinstance(percdamp, bool) or not isinstance(percdamp, (int, float)) \
            or not math.isfinite(percdamp) or percdamp < 0:
        raise ValueError(f"percdamp must be a finite number >= 0 (a share of mean(diag H), "
                         f"e.g. 0.01), got {percdamp!r}")
    H = H.double().clone()
    lam = percdamp * H.diagonal().mean()
    H.diagonal().add_(lam)
    try:
        L = torch.linalg.cholesky(H)
    except torch.linalg.LinAlgError as e:
        raise ValueError(f"H + λI (λ = {float(lam):.4g}) is not positive definite, so GPTQ "
                         "cannot invert it: H must be the Hessian 2 X Xᵀ / n of real calibration "
                         "inputs (symmetric, no negative eigenvalue); if it is, raise percdamp "
                         f"(now {percdamp}). torch said: {e}") from e
    return torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)


def check_hessian(H: torch.Tensor) -> None:
    """``ValueError`` unless ``H`` is finite, symmetric and not all zeros (all zeros means no
    calibration input was added, and GPTQ would zero every weight)."""
    if not bool(torch.isfinite(H).all()):
        raise ValueError("H holds NaN or inf values; it must be finite (check the calibration "
                         "inputs)")
    Hd = H.double()
    if not Hd.any():
        raise ValueError("H is all zeros: no calibration inputs were added (or all were zero)")
    if not torch.allclose(Hd, Hd.T, rtol=1e-6, atol=1e-9 * float(Hd.abs().max())):
        raise ValueError("H is not symmetric; it must be the Hessian 2 X Xᵀ / n of the inputs")


def _column_grid(scale: torch.Tensor, zero: torch.Tensor | None, bits: int):
    """Per-row ``(s, z, u_min, u_max)`` of one group's grid, float64, for the inner loop."""
    s = scale.double()
    s = torch.where(s == 0, torch.ones_like(s), s)
    if zero is None:
        mid = 2 ** (bits - 1)
        return s, torch.full_like(s, mid), 1, 2 ** bits - 1
    return s, zero.double(), 0, 2 ** bits - 1


def _prepare(W: torch.Tensor, H: torch.Tensor, act_order: bool, percdamp: float):
    """Float64 copy of ``W`` with dead inputs (``H_jj = 0``) zeroed, the column order
    (decreasing ``diag(H)`` with act-order) and ``Hinv`` in that order."""
    Wd, H = W.detach().double().clone(), H.to(W.device).double().clone()
    dead = H.diagonal() == 0
    H[dead, dead] = 1.0
    Wd[:, dead] = 0.0
    cols = W.shape[1]
    perm = (torch.argsort(H.diagonal(), descending=True) if act_order
            else torch.arange(cols, device=H.device))
    return Wd, perm, inverse_hessian_factor(H[perm][:, perm], percdamp)


def gptq_quantize(W: torch.Tensor, H: torch.Tensor, bits: int = 4,
                  granularity: str | int = 128, symmetric: bool = False,
                  block_size: int = 128, percdamp: float = 0.01, act_order: bool = False,
                  scheme: str | None = None) -> QuantizedTensor:
    """GPTQ-quantize ``W (out, in)`` given the Hessian ``H (in, in)`` of its inputs.

    Returns the same kind of :class:`QuantizedTensor` as round-to-nearest with ``bits`` and
    ``granularity`` (``"channel"`` or a group size), so the two compare like for like.
    Deterministic: no randomness is involved.
    """
    check_weight(W)
    if W.dim() != 2 or H.shape != (W.shape[1], W.shape[1]):
        raise ValueError(f"need W (out, in) and H (in, in), got {tuple(W.shape)} and {tuple(H.shape)}")
    check_hessian(H)
    if granularity == "tensor":
        raise ValueError("GPTQ needs 'channel' or a group size, not 'tensor' granularity")
    positive_int("block_size", block_size)
    layout = layout_for(W, granularity)
    g, rows, cols = layout.group, layout.rows, layout.cols
    Wd, perm, Hinv = _prepare(W, H, act_order, percdamp)
    dev = Wd.device  # everything lives where W lives (H is moved there)
    scale = torch.zeros(rows, layout.n_groups, dtype=torch.float32, device=dev)
    zero = None if symmetric else torch.zeros(rows, layout.n_groups, dtype=torch.uint8, device=dev)
    if act_order:  # static groups from the original weights
        scale, zero = grid_params(to_groups(Wd, layout), bits, symmetric)
    Wp = Wd[:, perm]
    Uf = torch.empty(rows, cols, dtype=torch.float64, device=dev)
    grid = None
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1, Err1 = Wp[:, i1:i2].clone(), torch.zeros(rows, i2 - i1, dtype=torch.float64, device=dev)
        for i in range(i2 - i1):
            j = int(perm[i1 + i])
            if not act_order and j % g == 0:  # new group: its grid from the updated weights
                cur = torch.cat([W1[:, i:i + g], Wp[:, i2:i2 + max(0, g - (i2 - i1 - i))]], 1)
                sc, zc = grid_params(cur.float().unsqueeze(1), bits, symmetric)
                scale[:, j // g] = sc[:, 0].float()
                if zero is not None:
                    zero[:, j // g] = zc[:, 0]
            if act_order or j % g == 0:
                grid = _column_grid(scale[:, j // g], None if zero is None else zero[:, j // g], bits)
            s_j, z_j, lo, hi = grid
            w = W1[:, i]
            u = torch.clamp(torch.round(w / s_j) + z_j, lo, hi)             # Algorithm 1, quant(w)
            Uf[:, j] = u
            err = (w - (u - z_j) * s_j) / Hinv[i1 + i, i1 + i]
            W1[:, i:].sub_(torch.outer(err, Hinv[i1 + i, i1 + i:i2]))      # error feedback
            Err1[:, i] = err
        Wp[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]                               # lazy batch update
    U = Uf.to(torch.uint8)
    return _pack(U, scale, zero, bits, layout, scheme or f"gptq-int{bits}")


def _pack(U, scale, zero, bits, layout, scheme) -> QuantizedTensor:
    """Pack the codes ``U (rows, cols)`` into a :class:`QuantizedTensor`."""
    return QuantizedTensor(scheme, "int", bits, layout, packing.pack(U, bits),
                           store_scale(scale), zero)
