"""The model's own attention functions: plain PyTorch, causal with S >= T, grouped-query.

Every attention block of :class:`llminfra.model.Transformer` calls
``attn_fn(q, k, v, causal=True)`` with

* q ``(B, H, T, d)`` — the T new queries,
* k, v ``(B, H_kv, S, d)`` — all S keys/values so far (S >= T), H_kv dividing H,

and the T queries are the LAST T of the S positions: query i sits at position S - T + i and may
look at keys 0 .. S - T + i (a bottom-right aligned causal mask). Query head j reads key/value
head j // (H / H_kv) (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245, Fig. 2).

:func:`reference_attention` is the naive version (scores materialised, eq. 1 of Vaswani et al.
2017, arXiv:1706.03762); :func:`sdpa_attention` hands the same computation to
``torch.nn.functional.scaled_dot_product_attention`` and is what training uses. A test ties them.
Chapter 06 plugs its own ``flash_attention`` in through ``model.set_attention``.

Taught in chapters 04 (the S >= T case of decoding with a cache) and 06 (attention itself).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from llminfra.attention.shapes import check_attention_call


def check_attention_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ``ValueError`` unless q is ``(B, H, T, d)``, k and v are ``(B, H_kv, S, d)`` with
    S >= T and H a multiple of H_kv."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention wants 4-D (B, heads, tokens, head_dim) tensors, got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    (B, H, T, d), (Bk, H_kv, S, dk) = q.shape, k.shape
    if B != Bk or d != dk:
        raise ValueError(f"batch and head_dim of q {tuple(q.shape)} and k {tuple(k.shape)} "
                         f"must match")
    if H % H_kv:
        raise ValueError(f"query heads {H} must be a multiple of key/value heads {H_kv}")
    if S < T:
        raise ValueError(f"keys S={S} must be at least as many as queries T={T} (the queries "
                         f"are the last T of the S positions)")


def causal_mask(T: int, S: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean ``(T, S)`` mask, True where query i may attend to key j: ``j <= S - T + i``.

    Worked example, T = 2 new queries after 3 cached tokens (S = 5)::

        [[1, 1, 1, 1, 0],
         [1, 1, 1, 1, 1]]
    """
    i = torch.arange(T, device=device).unsqueeze(1)
    j = torch.arange(S, device=device).unsqueeze(0)
    return j <= (S - T) + i


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Expand ``(B, H_kv, S, d)`` to ``(B, H_kv * n_rep, S, d)``: head j of the result is head
    j // n_rep of ``x`` (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245)."""
    if n_rep == 1:
        return x
    return x.repeat_interleave(n_rep, dim=1)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        causal: bool = False) -> torch.Tensor:
    """softmax(Q Kᵀ / √d + mask) V, the naive way (Vaswani et al. 2017, arXiv:1706.03762,
    eq. 1).

    Shapes: q ``(B, H, T, d)``, k/v ``(B, H_kv, S, d)`` with S >= T and H_kv | H; returns
    ``(B, H, T, d)``. With ``causal`` the queries are the last T of S positions
    (:func:`causal_mask`). Scores are computed in float32 at least, the result has q's dtype.
    Differentiable (training runs through it).
    """
    check_attention_shapes(q, k, v)
    causal = check_attention_call("reference_attention", causal, q, k, v, forward_only=False)
    B, H, T, d = q.shape
    n_rep = H // k.shape[1]
    K, V = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, d)
    work = torch.promote_types(q.dtype, torch.float32)
    scores = q.to(work) @ K.to(work).transpose(-2, -1) / math.sqrt(d)  # (B, H, T, S)
    if causal:
        mask = causal_mask(T, K.shape[2], device=q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    P = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    return (P @ V.to(work)).to(q.dtype)  # (B, H, T, d)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   causal: bool = False) -> torch.Tensor:
    """Same result as :func:`reference_attention`, computed by PyTorch's fused
    ``scaled_dot_product_attention`` (faster, used for training).

    Shapes as in :func:`reference_attention`. PyTorch's ``is_causal`` aligns the mask top-left,
    which is right only when S == T; for S > T an explicit bottom-right mask is passed.
    """
    check_attention_shapes(q, k, v)
    causal = check_attention_call("sdpa_attention", causal, q, k, v, forward_only=False)
    T, S = q.shape[2], k.shape[2]
    n_rep = q.shape[1] // k.shape[1]
    K, V = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, d)
    if not causal:
        return F.scaled_dot_product_attention(q, K, V)
    if S == T:
        return F.scaled_dot_product_attention(q, K, V, is_causal=True)
    return F.scaled_dot_product_attention(q, K, V, attn_mask=causal_mask(T, S, q.device))
