"""Context parallelism measured: rank functions and the tables chapter 11 shows.

Two ways to split ONE long sequence over P ranks, each checked against ``naive_attention`` on the
whole sequence:

* prefill — ring attention (:mod:`~llminfra.parallel.ring_attention`; Liu, Zaharia, Abbeel 2023,
  arXiv:2310.01889): Q, K, V split by tokens, K/V blocks passed round a ring;
* decode — decode context parallelism (:mod:`~llminfra.parallel.decode_context_parallel`;
  Flash-Decoding's split-KV reduction, Dao et al. 2023 blog): the KV cache split, only each
  rank's ``(o, lse)`` exchanged.

The rank functions (``fn(world, ...)``) draw their inputs from a seed, so every rank and the
caller see the same tensors without sending them; they run on threads
(:func:`~llminfra.parallel.world.run_simulated`) or real processes
(:func:`~llminfra.parallel.launch.launch`), chosen by ``ranks="threads" | "processes"``.
Taught in chapter 11.
"""

from __future__ import annotations

from dataclasses import asdict

import pandas as pd
import torch

from llminfra.attention.naive import naive_attention
from llminfra.parallel.decode_context_parallel import (decode_context_parallel_measured,
                                                       decode_cp_bytes_per_step, shard_kv_cache)
from llminfra.parallel.launch import launch
from llminfra.parallel.ring_attention import (causal_tiles_per_rank,
                                              ring_activation_bytes_per_rank,
                                              ring_attention_measured, ring_bytes_sent_per_rank,
                                              ring_kv_bytes_per_rank, shard_sequence)
from llminfra.parallel.world import World, run_simulated

RANKS = ("threads", "processes")


def draw_qkv(batch: int, heads: int, kv_heads: int, tokens: int, head_dim: int, seed: int,
             dtype: torch.dtype = torch.float32, query_tokens: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q ``(B, H, T_q, d)``, k and v ``(B, H_kv, T, d)`` drawn from
    ``torch.Generator().manual_seed(seed)`` (standard normal, then cast to ``dtype``);
    ``T_q = T`` unless ``query_tokens`` is given.

    Taught in chapter 11.
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, query_tokens or tokens, head_dim, generator=g)
    k = torch.randn(batch, kv_heads, tokens, head_dim, generator=g)
    v = torch.randn(batch, kv_heads, tokens, head_dim, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def ring_attention_case(world: World, tokens: int, heads: int, kv_heads: int, head_dim: int,
                        causal: bool, layout: str, seed: int, batch: int = 1,
                        dtype: torch.dtype = torch.float32, tile_tokens: int | None = None,
                        reference: bool = True) -> dict:
    """Rank function: ring attention on this rank's shard of the seeded q, k, v.

    Returns ``{"out": this rank's output rows, "stats": RingStats as a dict,
    "max_abs_err": max |ring − naive_attention on the whole sequence| over this rank's rows}``
    (``None`` with ``reference=False``: the caller then checks once instead of every rank).

    Ring attention: Liu, Zaharia, Abbeel 2023, arXiv:2310.01889. Taught in chapter 11.
    """
    q, k, v = draw_qkv(batch, heads, kv_heads, tokens, head_dim, seed, dtype)
    r, P = world.rank, world.size
    out, stats = ring_attention_measured(
        world, shard_sequence(q, r, P, layout), shard_sequence(k, r, P, layout),
        shard_sequence(v, r, P, layout), tokens, causal, layout=layout, tile_tokens=tile_tokens)
    err = None
    if reference:
        full = shard_sequence(naive_attention(q, k, v, causal), r, P, layout)
        err = (out.double() - full.double()).abs().max().item()
    return {"out": out, "stats": asdict(stats), "max_abs_err": err}


def decode_cp_case(world: World, cache_tokens: int, heads: int, kv_heads: int, head_dim: int,
                   layout: str, seed: int, batch: int = 1, dtype: torch.dtype = torch.float32,
                   interleave_tokens: int = 1) -> dict:
    """Rank function: one decode step (one new query token) over this rank's cache shard.

    Returns ``{"out": the merged (B, H, 1, d) output, "stats": DecodeStats as a dict,
    "max_abs_err": max |cp − naive_attention over the whole cache|}``.

    Flash-Decoding's reduction (Dao et al. 2023 blog). Taught in chapter 11.
    """
    q, k, v = draw_qkv(batch, heads, kv_heads, cache_tokens, head_dim, seed, dtype, 1)
    # q: the newest token's query only; its own K/V is already the last cache entry
    r, P = world.rank, world.size
    out, stats = decode_context_parallel_measured(
        world, q, shard_kv_cache(k, r, P, layout, interleave_tokens),
        shard_kv_cache(v, r, P, layout, interleave_tokens))
    err = (out.double() - naive_attention(q, k, v, causal=True).double()).abs().max().item()
    return {"out": out, "stats": asdict(stats), "max_abs_err": err}


def context_parallel_selfcheck(world: World, seed: int) -> list[dict]:
    """Rank function for one launch that checks everything on this world size: ring attention
    for every layout, causal and not, on an awkward length (``4·P + 3`` tokens, GQA 4:2), and
    decode CP on both cache layouts. Returns ``[{"case": name, "max_abs_err": ...,
    "stats": ...}]`` in a fixed order.

    Taught in chapter 11.
    """
    P = world.size
    results = []
    for layout in ("contiguous", "zigzag", "striped"):
        for causal in (False, True):
            res = ring_attention_case(world, 4 * P + 3, 4, 2, 8, causal, layout, seed)
            results.append({"case": f"ring {layout} causal={causal}",
                            "max_abs_err": res["max_abs_err"], "stats": res["stats"]})
    for layout in ("interleaved", "contiguous"):
        res = decode_cp_case(world, 5 * P + 2, 4, 2, 8, layout, seed)
        results.append({"case": f"decode {layout}", "max_abs_err": res["max_abs_err"],
                        "stats": res["stats"]})
    return results


def _run(fn, world_size: int, ranks: str, *args) -> list:
    if ranks == "threads":
        return run_simulated(fn, world_size, *args)
    if ranks == "processes":
        return launch(fn, world_size, *args)
    raise ValueError(f"ranks must be one of {RANKS}, got {ranks!r}")


def ring_attention_report(world_size: int, tokens: int, heads: int = 4, kv_heads: int = 2,
                          head_dim: int = 16, causal: bool = True, layout: str = "zigzag",
                          seed: int = 0, *, batch: int = 1, dtype: torch.dtype = torch.float32,
                          tile_tokens: int | None = None, ranks: str = "threads") -> pd.DataFrame:
    """One row per rank of a ring-attention prefill: what it held, sent and computed, measured
    beside the formulas of :mod:`~llminfra.parallel.ring_attention`, and its error against
    ``naive_attention`` on the whole sequence.

    Columns: ``rank``, ``tokens held``, ``KV bytes held (measured)``, ``KV bytes (formula)``,
    ``activation bytes (counted)``, ``activation bytes (formula)``, ``bytes sent (measured)``, ``bytes sent (formula)``,
    ``blocks computed``, ``score tiles``, ``score tiles (formula)`` (causal, T divisible by 2P,
    contiguous or zigzag, default tile; else ``None``), ``scores computed``,
    ``max |ring − full|``.
    The reference is computed once here (``naive_attention`` holds the T × T scores: keep
    ``tokens`` to a few thousand).

    Ring attention: Liu, Zaharia, Abbeel 2023, arXiv:2310.01889. Taught in chapter 11.
    """
    results = _run(ring_attention_case, world_size, ranks, tokens, heads, kv_heads, head_dim,
                   causal, layout, seed, batch, dtype, tile_tokens, False)
    q, k, v = draw_qkv(batch, heads, kv_heads, tokens, head_dim, seed, dtype)
    full = naive_attention(q, k, v, causal).double()
    nbytes = torch.finfo(dtype).bits // 8
    kv_formula = ring_kv_bytes_per_rank(tokens, world_size, kv_heads, head_dim, nbytes, batch)
    sent_formula = ring_bytes_sent_per_rank(tokens, world_size, kv_heads, head_dim, nbytes, batch)
    act_formula = ring_activation_bytes_per_rank(tokens, world_size, heads, head_dim, nbytes, batch)
    tiles = None
    if causal and layout != "striped" and tokens % (2 * world_size) == 0 and tile_tokens is None:
        tiles = causal_tiles_per_rank(world_size, layout)
    rows = []
    for res in results:
        s = res["stats"]
        rows.append({"rank": s["rank"], "tokens held": s["tokens_held"],
                     "KV bytes held (measured)": s["kv_bytes_held"],
                     "KV bytes (formula)": kv_formula,
                     "activation bytes (counted)": s["activation_bytes"],
                     "activation bytes (formula)": act_formula,
                     "bytes sent (measured)": s["bytes_sent"],
                     "bytes sent (formula)": sent_formula,
                     "blocks computed": s["blocks_computed"], "score tiles": s["score_tiles"],
                     "score tiles (formula)": tiles[s["rank"]] if tiles else None,
                     "scores computed": s["scores_computed"],
                     "max |ring − full|": (res["out"].double() - shard_sequence(
                         full, s["rank"], world_size, layout)).abs().max().item()})
    return pd.DataFrame(rows)


def causal_balance_report(world_size: int, tokens: int, heads: int = 2, kv_heads: int = 1,
                          head_dim: int = 8, seed: int = 0) -> pd.DataFrame:
    """Causal work per rank for each layout: one row per (layout, rank) with ``score tiles``,
    ``scores computed`` and ``work / mean work`` (max of it is the load imbalance: the step time
    of a ring is set by its slowest rank). Striped attention: Brandon et al. 2023, arXiv:2311.09431.

    Taught in chapter 11.
    """
    frames = []
    for layout in ("contiguous", "zigzag", "striped"):
        df = ring_attention_report(world_size, tokens, heads, kv_heads, head_dim, True, layout,
                                   seed)[["rank", "score tiles", "scores computed"]]
        df.insert(0, "layout", layout)
        df["work / mean work"] = df["scores computed"] / df["scores computed"].mean()
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def decode_cp_report(world_size: int, cache_tokens: int, heads: int = 4, kv_heads: int = 2,
                     head_dim: int = 16, layout: str = "interleaved", seed: int = 0, *,
                     batch: int = 1, dtype: torch.dtype = torch.float32,
                     interleave_tokens: int = 1, ranks: str = "threads") -> pd.DataFrame:
    """One row per rank of one decode step with the KV cache split over the ranks.

    Columns: ``rank``, ``cache tokens held``, ``KV bytes held (measured)``, ``KV bytes
    (formula)``, ``partial bytes (measured)``, ``partial bytes (formula)``, ``bytes sent,
    all-gather of partials``, ``bytes sent, all-gather of KV instead``, ``max |cp − full|``.
    Formulas: :func:`~llminfra.parallel.decode_context_parallel.decode_cp_bytes_per_step`.

    Flash-Decoding's reduction (Dao et al. 2023 blog). Taught in chapter 11.
    """
    results = _run(decode_cp_case, world_size, ranks, cache_tokens, heads, kv_heads, head_dim,
                   layout, seed, batch, dtype, interleave_tokens)
    f = decode_cp_bytes_per_step(world_size, cache_tokens, heads, kv_heads, head_dim,
                                 torch.finfo(dtype).bits // 8, batch)
    rows = []
    for res in results:
        s = res["stats"]
        rows.append({"rank": s["rank"], "cache tokens held": s["cache_tokens_held"],
                     "KV bytes held (measured)": s["kv_bytes_held"],
                     "KV bytes (formula)": f["kv_shard_bytes"],
                     "partial bytes (measured)": s["partial_bytes"],
                     "partial bytes (formula)": f["partial_bytes"],
                     "bytes sent, all-gather of partials": f["allgather_bytes_sent"],
                     "bytes sent, all-gather of KV instead": f["kv_allgather_bytes_sent"],
                     "max |cp − full|": res["max_abs_err"]})
    return pd.DataFrame(rows)
