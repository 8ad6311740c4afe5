"""AWQ: activation-aware weight quantization (Lin et al., 2023, arXiv:2306.00978, §3.2).

A few input channels carry much larger activations than the rest; their weights matter most.
AWQ scales weight column ``k`` up by ``s_k`` before rounding and the input down by the same
factor, ``y = (W diag(s)) (diag(s)⁻¹ x)``, which shrinks the *relative* rounding error of the
salient columns. The scale comes from the average activation magnitude ``s_x`` per input
channel, ``s = s_x^α``, with ``α`` searched on a grid ``{0, 1/20, …, 19/20}`` to minimise the
layer-output error on calibration inputs (eq. 5):

    α* = argmin_α || Q(W · diag(s_x^α)) · diag(s_x^α)⁻¹ X - W X ||²

(``s`` is normalised by ``sqrt(max s · min s)`` as in the reference code.) ``α = 0`` is plain
round-to-nearest, so on the calibration data AWQ is never worse than RTN. Here the inverse
scale is kept with the weight (``QuantizedTensor.input_scale``, fp16, counted in ``nbytes``);
real kernels fold it into the previous layer norm. The reference's weight-clipping search is not
done. Deterministic: no randomness. Chapter 03.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from llminfra.quant.rtn import fake_quantize_int, quantize_int
from llminfra.quant.tensor import QuantizedTensor, check_weight
from llminfra.validate import positive_int

MAX_SEARCH_ROWS = 1024


def awq_scales(x_abs_mean: torch.Tensor, alpha: float) -> torch.Tensor:
    """``s = s_x^α`` normalised to geometric mid-range 1, rounded to fp16 (as stored)."""
    s = x_abs_mean.double().clamp(min=1e-4).pow(alpha)
    s = s / (s.max() * s.min()).sqrt()
    return s.to(torch.float16).float()


def search_rows(X: torch.Tensor, in_features: int) -> torch.Tensor:
    """Calibration inputs as float32 ``(n, in)``, at most ``MAX_SEARCH_ROWS`` evenly spaced rows.

    ``ValueError`` if ``X`` has no rows or a NaN / inf value (every α's error would be NaN, and
    the search would fall back to plain round-to-nearest without a word)."""
    X = X.detach().reshape(-1, X.shape[-1]).float()
    if X.shape[1] != in_features:
        raise ValueError(f"X has {X.shape[1]} features, the weight expects {in_features}")
    if X.shape[0] == 0:
        raise ValueError("the calibration inputs X are empty (0 rows): AWQ needs activations")
    if not bool(torch.isfinite(X).all()):
        raise ValueError(f"the calibration inputs X hold {int(torch.isnan(X).sum())} NaN and "
                         f"{int(torch.isinf(X).sum())} inf values (or values beyond float32); "
                         "clean them first")
    if X.shape[0] > MAX_SEARCH_ROWS:  # deterministic subsample
        X = X[torch.linspace(0, X.shape[0] - 1, MAX_SEARCH_ROWS).long()]
    return X


def awq_search(W: torch.Tensor, X: torch.Tensor, bits: int = 4, granularity: str | int = 128,
               symmetric: bool = False, n_grid: int = 20) -> tuple[float, list[float]]:
    """Grid search of α: returns ``(best_alpha, errors)`` with ``errors[i]`` the mean squared
    output error at ``α = i / n_grid``. ``W (out, in)``, ``X (n, in)`` calibration inputs."""
    check_weight(W)
    positive_int("n_grid", n_grid)
    W = W.detach().float()
    X = search_rows(X, W.shape[1]).to(W.device)
    Y, s_x = X @ W.T, X.abs().mean(0)
    errors = []
    for i in range(n_grid):
        s = awq_scales(s_x, i / n_grid)
        Wq = fake_quantize_int(W * s, bits, granularity, symmetric) / s
        errors.append(float(((X @ Wq.T - Y) ** 2).mean()))
    if not all(map(math.isfinite, errors)):
        raise ValueError("the output error is not finite for every α (W X overflows float32?); "
                         "rescale the weights or the calibration inputs")
    best = min(range(n_grid), key=errors.__getitem__)
    return best / n_grid, errors


def awq_quantize(W: torch.Tensor, X: torch.Tensor, bits: int = 4, granularity: str | int = 128,
                 symmetric: bool = False, n_grid: int = 20,
                 scheme: str | None = None) -> QuantizedTensor:
    """AWQ-quantize ``W (out, in)`` with calibration inputs ``X (n, in)``.

    Stores ``Q(W · diag(s))`` and ``input_scale = s``; ``dequantize()`` gives
    ``Q(W · diag(s)) · diag(s)⁻¹``.
    """
    alpha, _ = awq_search(W, X, bits, granularity, symmetric, n_grid)
    s = awq_scales(search_rows(X, W.shape[1]).to(W.device).abs().mean(0), alpha)
    qt = quantize_int(W.detach().float() * s, bits, granularity, symmetric,
                      scheme=scheme or f"awq-int{bits}")
    return dataclasses.replace(qt, input_scale=s.to(torch.float16))
