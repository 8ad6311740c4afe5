"""Paged attention in plain PyTorch: attend to K/V gathered through each sequence's block table.

The pool stores keys and values per layer as ``(num_blocks, B, H_kv, d)``; seen as a flat array
of ``num_blocks · B`` slots, token ``p`` of a sequence sits at slot
``block_table[p // B] · B + p % B`` (:func:`llminfra.kvcache.blocks.slot_mapping`). Decode
attention for one new query per sequence is then ordinary attention over the gathered tokens:

    o = softmax(q Kᵀ / √d) V,    K, V = pool[slots of tokens 0 .. context_len-1]

(Kwon et al., 2023, arXiv:2309.06180, §4.1, eq. 4). This is the readable reference; the fused
GPU version that never materialises the gathered K/V is
:func:`llminfra.attention.paged_triton.paged_attention_triton`.

Taught in chapter 04; the engine (chapter 05) runs its decode steps through it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _check_pool(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("k_cache and v_cache must both be (num_blocks, block_size, H_kv, d); got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")


def gather_kv(cache: torch.Tensor, block_ids: list[int] | torch.Tensor,
              num_tokens: int) -> torch.Tensor:
    """One sequence's first ``num_tokens`` keys (or values): ``(H_kv, num_tokens, d)``.

    ``cache`` is ``(num_blocks, B, H_kv, d)``; ``block_ids`` its block table.
    """
    B = cache.shape[1]
    ids = torch.as_tensor(block_ids, dtype=torch.long, device=cache.device)
    if num_tokens > ids.numel() * B:
        raise ValueError(f"{num_tokens} tokens do not fit in {ids.numel()} blocks of {B}")
    x = cache[ids].reshape(-1, cache.shape[2], cache.shape[3])[:num_tokens]   # (S, H_kv, d)
    return x.transpose(0, 1)                                                     # (H_kv, S, d)


def decode_attention_nshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          context_lens: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """The computation of :func:`contiguous_decode_attention` on K/V laid out token-major,
    ``(N, S_max, H_kv, d)`` (what a gather through block tables gives), without repeating K/V
    per query head: the G = H / H_kv query heads of a group share one K/V head. The masked
    softmax is handed to ``torch.nn.functional.scaled_dot_product_attention`` (the same
    equation, fused; faster on a CPU than two einsums). q ``(N, H, d)``; returns
    ``(N, H, d)``."""
    N, H, d = q.shape
    H_kv = k.shape[2]
    work = torch.promote_types(q.dtype, torch.float32)                # float64 stays float64
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    Q = q.to(work).view(N, H_kv, H // H_kv, d)                        # (N, H_kv, G, d)
    K = k.to(work).transpose(1, 2)                                     # (N, H_kv, S, d)
    V = v.to(work).transpose(1, 2)
    pos = torch.arange(k.shape[1], device=q.device)
    keep = pos[None, :] < context_lens.to(q.device)[:, None]           # (N, S)
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=keep[:, None, None, :],
                                         scale=scale)                  # (N, H_kv, G, d)
    return out.reshape(N, H, d).to(q.dtype)


def contiguous_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                context_lens: torch.Tensor,
                                scale: float | None = None) -> torch.Tensor:
    """Reference decode attention on padded contiguous K/V.

    q ``(N, H, d)``, k/v ``(N, H_kv, S_max, d)``, ``context_lens`` ``(N,)``: sequence ``i``
    attends to its first ``context_lens[i]`` positions. Returns ``(N, H, d)``. GQA: query head
    ``h`` reads K/V head ``h // (H / H_kv)``.
    """
    if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"need q (N, H, d) and k, v both (N, H_kv, S_max, d); got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    N, H, d = q.shape
    if k.shape[0] != N or k.shape[3] != d or H % k.shape[1] or context_lens.shape != (N,):
        raise ValueError(f"q {tuple(q.shape)} does not fit k {tuple(k.shape)} and context_lens "
                         f"{tuple(context_lens.shape)}: need equal N and d, H a multiple of "
                         "H_kv, and context_lens (N,)")
    return decode_attention_nshd(q, k.transpose(1, 2), v.transpose(1, 2), context_lens, scale)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: torch.Tensor,
                    scale: float | None = None) -> torch.Tensor:
    """Decode attention of one query per sequence through block tables (PyTorch gather).

    Shapes: q ``(N, H, d)``; k_cache/v_cache ``(num_blocks, B, H_kv, d)``; block_tables
    ``(N, max_blocks)`` long (entries past a sequence's last block are ignored, any valid id);
    context_lens ``(N,)``. Returns ``(N, H, d)``, equal to
    :func:`contiguous_decode_attention` on the same tokens stored contiguously.
    """
    _check_pool(k_cache, v_cache)
    N, H, d = q.shape
    num_blocks, B, H_kv, d_k = k_cache.shape
    if d_k != d or H % H_kv:
        raise ValueError(f"q has H={H}, d={d}; the pool has H_kv={H_kv}, d={d_k}: need equal d "
                         "and H a multiple of H_kv")
    if block_tables.shape[0] != N or context_lens.shape != (N,):
        raise ValueError(f"need block_tables (N={N}, max_blocks) and context_lens ({N},); got "
                         f"{tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    if int(context_lens.max()) > block_tables.shape[1] * B or int(context_lens.min()) < 1:
        raise ValueError(f"context_lens must lie in 1..{block_tables.shape[1] * B} "
                         f"(max_blocks · block_size); got {context_lens.tolist()}")
    return gather_decode_attention(q, k_cache, v_cache, block_tables, context_lens,
                                   int(context_lens.max()), scale)


def gather_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, context_lens: torch.Tensor,
                            max_context: int, scale: float | None = None) -> torch.Tensor:
    """The body of :func:`paged_attention` without its argument checks (the engine's hot path,
    whose step metadata is already checked): gather the blocks the longest context uses, then
    :func:`decode_attention_nshd`. ``max_context`` = max(context_lens), as a Python int."""
    N = q.shape[0]
    B, H_kv, d = k_cache.shape[1:]
    n_blocks = -(-max_context // B)                               # blocks the longest one uses
    ids = block_tables[:, :n_blocks].to(device=k_cache.device, dtype=torch.long).flatten()
    rows = k_cache.shape[0]                   # index_select: faster than k_cache[bt] on a CPU
    K = k_cache.view(rows, -1).index_select(0, ids).view(N, -1, H_kv, d)  # (N, n_blocks·B, ...)
    V = v_cache.view(rows, -1).index_select(0, ids).view(N, -1, H_kv, d)
    return decode_attention_nshd(q, K, V, context_lens, scale)
