"""Decode context parallelism: one long request's KV cache split over P ranks.

When one request's context is too long for one device's KV cache, split the cache along the
sequence: rank r keeps every P-th token (or a run of tokens). At each decode step every rank gets
the new token's query q, attends over ITS shard only, and produces a partial result: the
normalised output ``o_r`` and the log-sum-exp ``lse_r`` of its scores. The partials merge exactly
by the online softmax (:func:`~llminfra.attention.online_softmax.merge_partials`)::

    lse = log Σ_r e^(lse_r),     o = Σ_r e^(lse_r - lse) · o_r

This is the reduction step of Flash-Decoding (Dao, Haziza, Massa, Sizov 2023, "Flash-Decoding
for long-context inference", PyTorch blog, Oct 2023), which splits the KV of one sequence over
a GPU's thread blocks; here the splits live on different ranks. Only ``o`` and ``lse`` travel
(``H · (d + 1)`` numbers per query token), never the KV: per step a rank sends a few KB whatever
the context length. vLLM calls this decode context parallelism (DCP) and stores the cache
interleaved, token x on rank ``(x // I) mod P`` with interleave size ``I`` (default 1)
(vLLM RFC vllm-project/vllm#25749; vLLM-Ascend "Context Parallel" design document,
docs.vllm.ai/projects/ascend/en/latest/developer_guide/Design_Documents/context_parallel/,
read 2026-12-03); new tokens then land on the ranks in turn, so the shards stay balanced.
Taught in chapter 11.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llminfra.attention.online_softmax import merge_partials
from llminfra.attention.shapes import (check_attention_call, check_qkv, compute_dtype,
                                       default_scale, group_queries)
from llminfra.parallel.ring_attention import block_attention, chunk_bounds
from llminfra.parallel.world import World, check_rank
from llminfra.validate import positive_int

CACHE_LAYOUTS = ("interleaved", "contiguous")
#: partials are exchanged in float32, as Flash-Decoding keeps its split partials in fp32
PARTIAL_BYTES_PER_ELEMENT = 4


def cache_shard_positions(cache_tokens: int, rank: int, world_size: int,
                          layout: str = "interleaved", interleave_tokens: int = 1) -> torch.Tensor:
    """Cache positions rank ``rank`` stores (a long tensor, possibly empty).

    interleaved: position x lives on rank ``(x // I) mod P`` (vLLM DCP, ``I`` =
    ``interleave_tokens``); contiguous: runs as in ring attention's contiguous layout. Example,
    10 tokens, P = 3, I = 1: rank 0 → [0, 3, 6, 9], rank 1 → [1, 4, 7], rank 2 → [2, 5, 8].
    A rank may hold no token (a short cache): its partial is empty and merges as nothing.

    Taught in chapter 11.
    """
    check_rank(rank, world_size)
    positive_int("cache_tokens", cache_tokens)
    positive_int("interleave_tokens", interleave_tokens)
    if layout == "interleaved":
        x = torch.arange(cache_tokens)
        return x[(x // interleave_tokens) % world_size == rank]
    if layout == "contiguous":
        start, stop = chunk_bounds(cache_tokens, world_size)[rank]
        return torch.arange(start, stop)
    raise ValueError(f"layout must be one of {CACHE_LAYOUTS}, got {layout!r}")


def shard_kv_cache(x: torch.Tensor, rank: int, world_size: int, layout: str = "interleaved",
                   interleave_tokens: int = 1) -> torch.Tensor:
    """This rank's part of a cache tensor ``(B, H_kv, S, d)`` → ``(B, H_kv, S_r, d)`` (a copy).

    Taught in chapter 11.
    """
    pos = cache_shard_positions(x.shape[2], rank, world_size, layout, interleave_tokens)
    return x.index_select(2, pos.to(x.device))


@dataclass
class DecodeStats:
    """What one rank held and sent in one decode step of :func:`decode_context_parallel_measured`.

    Flash-Decoding's split-KV partials (Dao et al. 2023 blog). Taught in chapter 11.
    """

    rank: int
    cache_tokens_held: int
    kv_bytes_held: int        # this rank's K and V shard
    partial_bytes: int        # its (o, lse) partial, the only thing it contributes


def partial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      softmax_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial ``(o, lse)`` of queries q over one KV shard, without a mask.

    Shapes: q ``(B, H, T_q, d)``, k and v ``(B, H_kv, S_r, d)`` → o ``(B, H, T_q, d)`` and
    lse ``(B, H, T_q, 1)`` in float32 (float64 stays float64). An empty shard (``S_r = 0``)
    gives ``o = 0, lse = -inf``.

    One split of Flash-Decoding (Dao et al. 2023, "Flash-Decoding for long-context
    inference", blog, Oct 2023). Taught in chapter 11.
    """
    B, H, T_q, d = q.shape
    H_kv = k.shape[1]
    work = compute_dtype(q.dtype)
    Q = group_queries(q, H_kv).to(work) * default_scale(d, softmax_scale)  # (B, H_kv, G, T_q, d)
    if k.shape[2] == 0:
        return (q.new_zeros(B, H, T_q, d, dtype=work),
                q.new_full((B, H, T_q, 1), float("-inf"), dtype=work))
    K, V = k.to(work).unsqueeze(2), v.to(work).unsqueeze(2)               # (B, H_kv, 1, S_r, d)
    none = torch.empty(0, dtype=torch.long)
    o, lse = block_attention(Q, K, V, none, none, causal=False)
    return o.reshape(B, H, T_q, d), lse.reshape(B, H, T_q, 1)


def decode_context_parallel_measured(world: World, q: torch.Tensor, k_shard: torch.Tensor,
                                     v_shard: torch.Tensor, *, softmax_scale: float | None = None
                                     ) -> tuple[torch.Tensor, DecodeStats]:
    """:func:`decode_context_parallel`, also returning this rank's :class:`DecodeStats`.

    Taught in chapter 11.
    """
    if k_shard.shape[2] > 0:
        check_qkv(q, k_shard, v_shard)
    elif k_shard.shape != v_shard.shape or k_shard.dim() != 4 or q.dim() != 4:
        raise ValueError(f"q must be (B, H, T_q, d) and k_shard, v_shard (B, H_kv, S_r, d) alike, "
                         f"got {tuple(q.shape)}, {tuple(k_shard.shape)}, {tuple(v_shard.shape)}")
    check_attention_call("decode_context_parallel", False, q, k_shard, v_shard)
    o_r, lse_r = partial_attention(q, k_shard, v_shard, softmax_scale=softmax_scale)
    packed = torch.cat([o_r, lse_r], dim=-1).to(torch.float32)  # (B, H, T_q, d + 1): o | lse
    parts = world.all_gather(packed.unsqueeze(0), dim=0)        # (P, B, H, T_q, d + 1)
    d = q.shape[-1]
    o, lse = parts[0, ..., :d], parts[0, ..., d:]
    for p in parts[1:]:  # in rank order: every rank computes the same bits
        o, lse = merge_partials(o, lse, p[..., :d], p[..., d:])
    stats = DecodeStats(world.rank, k_shard.shape[2], k_shard.nbytes + v_shard.nbytes,
                        packed.nbytes)
    return o.to(q.dtype), stats


def decode_context_parallel(world: World, q: torch.Tensor, k_shard: torch.Tensor,
                            v_shard: torch.Tensor, *, softmax_scale: float | None = None
                            ) -> torch.Tensor:
    """One decode step of attention over a KV cache split across ``world``'s ranks.

    Each rank computes ``(o_r, lse_r)`` over its shard (:func:`partial_attention`), all ranks
    all-gather the partials (float32, ``B · H · T_q · (d + 1)`` numbers each) and merge them in
    rank order with :func:`~llminfra.attention.online_softmax.merge_partials` (Flash-Decoding's
    reduction, Dao et al. 2023 blog). Every rank returns the same ``(B, H, T_q, d)`` output,
    equal to ``naive_attention(q, k, v)`` over the whole cache (the new token's own K/V must be
    in the cache already, as after appending it; then ``causal`` changes nothing for T_q = 1).

    Shapes: q ``(B, H, T_q, d)`` (the same on every rank), k_shard and v_shard
    ``(B, H_kv, S_r, d)`` as :func:`shard_kv_cache` cuts them; ``S_r = 0`` is allowed.

    Taught in chapter 11.
    """
    return decode_context_parallel_measured(world, q, k_shard, v_shard,
                                            softmax_scale=softmax_scale)[0]


def decode_cp_bytes_per_step(world_size: int, cache_tokens: int, heads: int, kv_heads: int,
                             head_dim: int, kv_bytes_per_element: int, batch: int = 1,
                             query_tokens: int = 1) -> dict:
    """Bytes one rank contributes and sends per decode step (per layer), and what gathering the
    KV instead would cost.

    * ``partial_bytes = B · H · T_q · (d + 1) · 4`` (o and lse in float32);
    * ``allgather_bytes_sent = (P − 1) · partial_bytes`` (ring all-gather: each rank forwards
      the other P − 1 partials);
    * ``kv_allgather_bytes_sent = (P − 1) · 2 · S/P · H_kv · d · bytes · B``: the bytes each rank
      would send to rebuild the whole cache everywhere instead — grows with the context.

    Worked example: P = 8, S = 1,000,000, H = 32, H_kv = 8, d = 128, bf16, B = 1 → partial
    32 · 129 · 4 = 16,512 bytes, 115,584 bytes sent per rank per step, vs 7 · 2 · 125,000 · 8 ·
    128 · 2 = 3,584,000,000 bytes to all-gather the KV. Taught in chapter 11.
    """
    check_rank(0, world_size)
    partial = batch * heads * query_tokens * (head_dim + 1) * PARTIAL_BYTES_PER_ELEMENT
    kv_shard = 2 * cache_tokens / world_size * kv_heads * head_dim * kv_bytes_per_element * batch
    return {"partial_bytes": partial,
            "allgather_bytes_sent": (world_size - 1) * partial,
            "kv_shard_bytes": kv_shard,
            "kv_allgather_bytes_sent": (world_size - 1) * kv_shard}
