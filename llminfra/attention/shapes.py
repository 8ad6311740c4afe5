"""Shape and dtype rules shared by every attention version, and the grouped-query head layout.

Tensors are ``(batch, heads, tokens, head_dim)``: q ``(B, H, T, d)``, k and v ``(B, H_kv, S, d)``
with ``H_kv`` dividing ``H``. Query head ``h`` reads key/value head ``h // (H / H_kv)``
(grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245, Fig. 2; ``H_kv = 1`` is
multi-query attention, Shazeer 2019, arXiv:1911.02150). Taught in chapter 06.

Causal masking is aligned bottom-right: the T queries are the LAST T of the S key positions, as
when decoding with a KV cache, so query ``i`` sits at position ``S - T + i`` and sees keys
``j <= S - T + i``. With T > S the first ``T - S`` queries see no key at all; their output is
defined as zero (the softmax of an empty row has no mass to spread).
"""

from __future__ import annotations

import math

import torch

from llminfra.validate import positive_int

#: dtypes every PyTorch version accepts (16-bit inputs are computed in float32)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              dtypes: tuple = FLOAT_DTYPES) -> tuple[int, int, int, int, int, int]:
    """Validate q ``(B, H, T, d)``, k/v ``(B, H_kv, S, d)``; return ``(B, H, H_kv, T, S, d)``.

    Raises ``ValueError`` naming the bad shape, dtype or device and what is allowed.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, tokens, head_dim), "
                             f"got shape {tuple(x.shape)}")
        if x.dtype not in dtypes:
            raise ValueError(f"{name} has dtype {x.dtype}; allowed: {[str(t) for t in dtypes]}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    (B, H, T, d), (Bk, H_kv, S, dk) = q.shape, k.shape
    if B != Bk:
        raise ValueError(f"batch of q ({B}) and k/v ({Bk}) must match")
    if d != dk:
        raise ValueError(f"head_dim of q ({d}) and k/v ({dk}) must match")
    if H_kv == 0 or H % H_kv:
        raise ValueError(f"query heads H={H} must be a multiple of key/value heads H_kv={H_kv}")
    if T == 0 or S == 0 or d == 0 or B == 0:
        raise ValueError(f"empty attention: need B, T, S, d >= 1, got B={B}, T={T}, S={S}, d={d}")
    return B, H, H_kv, T, S, d


def check_attention_call(fn_name: str, causal, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, forward_only: bool = True) -> bool:
    """The flags every attention version checks after :func:`check_qkv`; returns ``causal``.

    * ``causal`` must be ``True`` or ``False``: a string such as ``"no"`` is truthy and would
      silently run the causal mask.
    * ``forward_only`` kernels (the naive and tiled ones here write their score and output
      buffers in place and define no backward pass) refuse inputs that require grad while
      autograd is recording, instead of failing later inside ``.backward()``.

    ``ValueError`` naming ``fn_name`` and what to do otherwise.
    """
    if not isinstance(causal, bool):
        raise ValueError(f"{fn_name}: causal must be True or False, got {causal!r}")
    if forward_only and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError(f"{fn_name} is forward-only (inference; it has no backward pass) but "
                         "q, k or v requires grad: call it under torch.no_grad() or "
                         "torch.inference_mode(), or detach the inputs; to train, use "
                         "torch.nn.functional.scaled_dot_product_attention")
    return causal


def check_block(name: str, value: int) -> int:
    """A tile size must be a positive int; ``ValueError`` otherwise (:func:`positive_int`)."""
    return positive_int(name, value)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32 (as GPU kernels accumulate)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_scale(d: int, softmax_scale: float | None) -> float:
    """``1 / sqrt(d)`` unless a scale is given (Vaswani et al. 2017, arXiv:1706.03762, eq. 1)."""
    return 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)


def group_queries(q: torch.Tensor, H_kv: int) -> torch.Tensor:
    """View q ``(B, H, T, d)`` as ``(B, H_kv, G, T, d)`` with ``G = H / H_kv``: the G query
    heads that share one key/value head sit together (no copy of K or V is made)."""
    B, H, T, d = q.shape
    return q.reshape(B, H_kv, H // H_kv, T, d)


def causal_keep(T: int, S: int, rows: slice | None = None, cols: slice | None = None,
                device: torch.device | None = None) -> torch.Tensor:
    """Boolean ``(rows, cols)`` mask, True where query i may see key j: ``j <= S - T + i``.

    Worked example, T = 2 new queries after 3 cached tokens (S = 5)::

        [[1, 1, 1, 1, 0],
         [1, 1, 1, 1, 1]]
    """
    rows = rows or slice(0, T)
    cols = cols or slice(0, S)
    i = torch.arange(rows.start, rows.stop, device=device).unsqueeze(1)
    j = torch.arange(cols.start, cols.stop, device=device).unsqueeze(0)
    return j <= (S - T) + i
