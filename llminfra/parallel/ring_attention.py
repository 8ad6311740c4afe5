"""Ring attention: one long sequence split over P ranks, K/V blocks passed round a ring.

Liu, Zaharia, Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite
Context", arXiv:2310.01889, section 3 and Algorithm 1. Each rank holds T/P tokens of Q, K and V.
In P steps every K/V block visits every rank; while rank r computes its queries against the
block it holds, it already sends that block on to rank r+1 and receives the next one from rank
r-1 (``isend`` / ``irecv``), so the transfer hides behind the compute when a block's attention
takes longer than its transfer. Partial results ``(o, lse)`` merge exactly by the online softmax
of chapter 06 (:func:`~llminfra.attention.online_softmax.merge_partials`)::

    step s:   rank r holds K/V of owner (r - s) mod P
    rank 0:  Q0·[KV0] → Q0·[KV3] → Q0·[KV2] → Q0·[KV1]      (P = 4; KV moves, Q stays)

Layouts of the T tokens over the ranks (``layout``):

* ``"contiguous"``: rank r holds one run of ≈T/P tokens. With a causal mask rank r sees only the
  blocks of ranks ≤ r, so the last rank does P blocks of work and rank 0 one: load imbalance.
* ``"zigzag"``: the sequence is cut into 2P chunks and rank r holds chunks r and 2P-1-r (an
  early and a late one), so every rank does the same work (Llama 3's context parallelism:
  Dubey et al. 2024, arXiv:2407.21783, section 3.3.2).
* ``"striped"``: token i lives on rank i mod P (Brandon et al. 2023, "Striped Attention",
  arXiv:2311.09431, section 3): every block is nearly triangular, so work is balanced too.

Tokens that do not divide evenly are allowed: chunks differ by at most one token (the first
``T mod n`` chunks get one more, as ``torch.tensor_split``); every rank knows every shard's length
from ``tokens``, so no sizes travel. ``ValueError`` if a rank (or a zigzag chunk) would be empty.
Taught in chapter 11.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llminfra.attention.online_softmax import merge_partials
from llminfra.attention.shapes import (check_attention_call, check_block, check_qkv,
                                       compute_dtype, default_scale, group_queries)
from llminfra.parallel.world import World, check_rank

LAYOUTS = ("contiguous", "zigzag", "striped")


def chunk_bounds(tokens: int, n: int) -> list[tuple[int, int]]:
    """``n`` runs ``(start, stop)`` covering ``0..tokens``, sizes differing by at most one (the
    first ``tokens mod n`` runs one longer, as ``torch.tensor_split``); runs may be empty.

    Taught in chapter 11.
    """
    base, extra = divmod(tokens, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def shard_positions(tokens: int, rank: int, world_size: int, layout: str = "contiguous"
                    ) -> torch.Tensor:
    """The global token positions rank ``rank`` holds, in its local order (a long tensor).

    contiguous: run r of P; zigzag: runs r and 2P-1-r of 2P; striped: ``r, r+P, r+2P, …``.
    Example, T = 8, P = 2: contiguous rank 0 → [0..3]; zigzag rank 0 → [0, 1, 6, 7];
    striped rank 0 → [0, 2, 4, 6]. ``ValueError`` for an unknown layout or when a rank would hold
    no token (T < P, or T < 2P for zigzag).

    Layouts: contiguous as in Liu, Zaharia, Abbeel 2023, arXiv:2310.01889; zigzag as in Llama 3
    (Dubey et al. 2024, arXiv:2407.21783, section 3.3.2); striped: Brandon et al. 2023,
    arXiv:2311.09431. Taught in chapter 11.
    """
    check_rank(rank, world_size)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    need = 2 * world_size if layout == "zigzag" else world_size
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < need:
        raise ValueError(f"tokens must be an int >= {need} for layout {layout!r} with "
                         f"{world_size} ranks (every rank needs a token per chunk), got {tokens!r}")
    if layout == "striped":
        return torch.arange(rank, tokens, world_size)
    if layout == "contiguous":
        runs = [chunk_bounds(tokens, world_size)[rank]]
    else:
        bounds = chunk_bounds(tokens, 2 * world_size)
        runs = [bounds[rank], bounds[2 * world_size - 1 - rank]]
    return torch.cat([torch.arange(a, b) for a, b in runs])


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, layout: str = "contiguous"
                   ) -> torch.Tensor:
    """This rank's tokens of ``x`` ``(B, H, T, d)`` → ``(B, H, T_r, d)`` (a copy).

    Taught in chapter 11.
    """
    pos = shard_positions(x.shape[2], rank, world_size, layout)
    return x.index_select(2, pos.to(x.device))


def unshard_sequence(parts: list[torch.Tensor], layout: str = "contiguous") -> torch.Tensor:
    """Put every rank's ``(B, H, T_r, d)`` part back in sequence order → ``(B, H, T, d)``.

    Inverse of :func:`shard_sequence` over ranks ``0..len(parts)-1``.

    Taught in chapter 11.
    """
    tokens = sum(p.shape[2] for p in parts)
    out = parts[0].new_empty(parts[0].shape[:2] + (tokens,) + parts[0].shape[3:])
    for r, part in enumerate(parts):
        out[:, :, shard_positions(tokens, r, len(parts), layout).to(out.device)] = part
    return out


@dataclass
class RingStats:
    """What one rank held, sent and computed in :func:`ring_attention_measured` (bytes are the
    ``nbytes`` of the tensors themselves; a score tile is ``tile_tokens × tile_tokens`` scores).

    Counted by ring attention (Liu, Zaharia, Abbeel 2023, arXiv:2310.01889). Taught in chapter 11.
    """

    rank: int
    tokens_held: int
    kv_bytes_held: int        # this rank's own K and V slice
    activation_bytes: int     # Q slice + running O and lse + the largest score block
    bytes_sent: int           # K/V blocks this rank passed on round the ring
    score_tiles: int          # tiles with at least one unmasked score, summed over the steps
    scores_computed: int      # unmasked (query, key) position pairs (one head), over the steps
    blocks_computed: int      # ring steps whose block was not entirely masked


def block_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, q_pos: torch.Tensor,
                    k_pos: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a query block over ONE key block, as a partial result ``(o, lse)``.

    ``S = Q Kᵀ`` (Q already scaled), mask ``k_pos > q_pos`` when ``causal``, then
    ``lse = m + log Σ_j e^(S_j - m)`` and ``o = Σ_j e^(S_j - lse) V_j`` (the per-block output of
    Algorithm 1 of arXiv:2310.01889). Rows that see no key get ``o = 0, lse = -inf``.
    Shapes: Q ``(B, H_kv, G, n, d)``, K and V ``(B, H_kv, 1, m, d)``, positions ``(n,)`` and
    ``(m,)`` → o ``(B, H_kv, G, n, d)``, lse ``(B, H_kv, G, n, 1)``.

    Taught in chapter 11.
    """
    S = torch.matmul(Q, K.transpose(-2, -1))                   # (B, H_kv, G, n, m)
    if causal:
        S.masked_fill_(k_pos[None, :] > q_pos[:, None], float("-inf"))
    m = S.amax(dim=-1, keepdim=True)                           # (B, H_kv, G, n, 1)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    P = S.sub_(m).exp_()                                       # in place: one score block
    l = P.sum(dim=-1, keepdim=True)                            # (B, H_kv, G, n, 1)
    o = torch.matmul(P, V) / torch.where(l == 0, torch.ones_like(l), l)
    return o, m + torch.log(l)


def _tiles(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, tile: int) -> tuple[int, int]:
    """(score tiles with an unmasked entry, unmasked entries) of a local n × m block; tiles are
    cut in LOCAL coordinates, as the rank's kernel would tile its block."""
    keep = (k_pos[None, :] <= q_pos[:, None]) if causal else \
        torch.ones(len(q_pos), len(k_pos), dtype=torch.bool)
    qi, kj = keep.nonzero(as_tuple=True)
    n_k_tiles = math.ceil(len(k_pos) / tile)
    tiles = torch.unique((qi // tile) * n_k_tiles + kj // tile).numel()
    return int(tiles), int(keep.sum())


def _step(Q, o, lse, kv, q_pos, k_pos, causal: bool, tile: int, stats: RingStats):
    """One ring step: attend to the K/V block held, merge into ``(o, lse)``, count the work."""
    K, V = kv[0].to(Q.dtype).unsqueeze(2), kv[1].to(Q.dtype).unsqueeze(2)  # (B, H_kv, 1, m, d)
    o_b, lse_b = block_attention(Q, K, V, q_pos.to(Q.device), k_pos.to(Q.device), causal)
    tiles, scores = _tiles(q_pos, k_pos, causal, tile)
    stats.score_tiles += tiles
    stats.scores_computed += scores
    stats.blocks_computed += 1
    return merge_partials(o, lse, o_b, lse_b)


def _check_ring_call(world: World, q, k, v, tokens: int, causal, layout: str) -> torch.Tensor:
    """Validate the local shards; return this rank's positions."""
    check_qkv(q, k, v)
    check_attention_call("ring_attention", causal, q, k, v)
    q_pos = shard_positions(tokens, world.rank, world.size, layout)
    if not q.shape[2] == k.shape[2] == len(q_pos):
        raise ValueError(f"rank {world.rank} of {world.size} must hold {len(q_pos)} of the "
                         f"{tokens} tokens ({layout!r} layout) in q, k and v, got "
                         f"{q.shape[2]} and {k.shape[2]}")
    return q_pos


def ring_attention_measured(world: World, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            tokens: int, causal: bool = False, *, layout: str = "contiguous",
                            softmax_scale: float | None = None, tile_tokens: int | None = None
                            ) -> tuple[torch.Tensor, RingStats]:
    """:func:`ring_attention`, also returning this rank's :class:`RingStats`.

    ``tile_tokens`` (default ``ceil(T / 2P)``, one zigzag chunk) sizes the score tiles counted.

    Ring attention: Liu, Zaharia, Abbeel 2023, arXiv:2310.01889. Taught in chapter 11.
    """
    q_pos = _check_ring_call(world, q, k, v, tokens, causal, layout)
    P, r = world.size, world.rank
    B, H, n, d = q.shape
    H_kv = k.shape[1]
    tile = math.ceil(tokens / (2 * P)) if tile_tokens is None else \
        check_block("tile_tokens", tile_tokens)
    work = compute_dtype(q.dtype)
    Q = group_queries(q, H_kv).to(work) * default_scale(d, softmax_scale)  # (B, H_kv, G, n, d)
    o = torch.zeros_like(Q)                                                # (B, H_kv, G, n, d)
    lse = torch.full(Q.shape[:-1] + (1,), float("-inf"), dtype=work, device=q.device)
    kv = torch.stack([k, v])                                   # (2, B, H_kv, n, d) this block
    stats = RingStats(r, n, k.nbytes + v.nbytes, 0, 0, 0, 0, 0)
    largest_block, owner = 0, r
    for step in range(P):
        if step < P - 1:  # start passing this block on before computing with it
            nxt = (r - step - 1) % P
            n_nxt = len(shard_positions(tokens, nxt, P, layout))
            sending = world.isend(kv, (r + 1) % P)
            receiving = world.irecv((2, B, H_kv, n_nxt, d), kv.dtype, (r - 1) % P, q.device)
            stats.bytes_sent += kv.nbytes
        k_pos = shard_positions(tokens, owner, P, layout)
        if not causal or bool(k_pos.min() <= q_pos.max()):  # else: whole block masked, skipped
            o, lse = _step(Q, o, lse, kv, q_pos, k_pos, causal, tile, stats)
            largest_block = max(largest_block, B * H * n * len(k_pos) * Q.element_size())
        if step < P - 1:
            sending.wait()
            kv, owner = receiving.wait(), nxt
    stats.activation_bytes = q.nbytes + o.nbytes + lse.nbytes + largest_block
    return o.reshape(B, H, n, d).to(q.dtype), stats


def ring_attention(world: World, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   tokens: int, causal: bool = False, *, layout: str = "contiguous",
                   softmax_scale: float | None = None) -> torch.Tensor:
    """Exact attention over a sequence of ``tokens`` tokens split over ``world``'s ranks.

    Ring attention (Liu, Zaharia, Abbeel 2023, arXiv:2310.01889, Algorithm 1): for P steps,
    compute this rank's queries against the K/V block held, merge ``(o, lse)`` with
    :func:`~llminfra.attention.online_softmax.merge_partials`, and pass the block to rank r+1
    while receiving the next from rank r-1. With ``causal`` a block entirely in this rank's future
    is skipped (its transfer still happens: the ring needs it downstream).

    Shapes: this rank's shards q ``(B, H, T_r, d)``, k and v ``(B, H_kv, T_r, d)`` (``H_kv | H``,
    grouped-query attention) as :func:`shard_sequence` cuts them for ``layout``; returns this
    rank's output rows ``(B, H, T_r, d)`` in q's dtype. :func:`unshard_sequence` of all ranks'
    outputs equals ``naive_attention(q, k, v, causal)`` on the whole sequence.

    Taught in chapter 11.
    """
    return ring_attention_measured(world, q, k, v, tokens, causal, layout=layout,
                                   softmax_scale=softmax_scale)[0]


def ring_kv_bytes_per_rank(tokens: int, world_size: int, kv_heads: int, head_dim: int,
                           bytes_per_element: int, batch: int = 1) -> float:
    """K and V bytes one rank holds: ``2 · T/P · H_kv · d · bytes · B``.

    Worked example: T = 131,072, P = 8, H_kv = 8, d = 128, bf16 (2 bytes), B = 1 →
    2 · 16,384 · 8 · 128 · 2 = 67,108,864 bytes (64 MiB) per layer. With T not divisible by P
    the ranks differ by one token's K/V. While the next block arrives a rank also holds one more
    slice (double buffering), so the peak is twice this. Taught in chapter 11.
    """
    return 2 * tokens / world_size * kv_heads * head_dim * bytes_per_element * batch


def ring_activation_bytes_per_rank(tokens: int, world_size: int, heads: int, head_dim: int,
                                   bytes_per_element: int, batch: int = 1) -> float:
    """Activation bytes one rank keeps during a ring pass (as :class:`RingStats` counts them).

    With n = T/P: the Q slice ``B·H·n·d·bytes``, the running O ``B·H·n·d·4`` and lse
    ``B·H·n·4`` (float32), and one score block ``B·H·n·n·4``. The score block is what this
    teaching version materialises per step; a FlashAttention kernel inside each step (as in
    arXiv:2310.01889, section 3) keeps only a tile of it, leaving O(n·d) per rank.
    Worked example: T = 64, P = 4, H = 4, d = 16, fp32 → n = 16: 4,096 + 4,096 + 256 + 4,096
    = 12,544 bytes. Taught in chapter 11.
    """
    n = tokens / world_size
    return batch * heads * n * (head_dim * bytes_per_element + 4 * head_dim + 4 + 4 * n)


def ring_bytes_sent_per_rank(tokens: int, world_size: int, kv_heads: int, head_dim: int,
                             bytes_per_element: int, batch: int = 1) -> float:
    """Bytes each rank sends in one ring pass: ``(P − 1) · 2 · T/P · H_kv · d · bytes · B``.

    Every block travels P − 1 hops (arXiv:2310.01889, section 3), so each rank forwards P − 1
    K/V slices; summed over ranks that is ``(P − 1)/P`` of all K/V per ring pass, per layer.

    Taught in chapter 11.
    """
    return (world_size - 1) * ring_kv_bytes_per_rank(tokens, world_size, kv_heads, head_dim,
                                                     bytes_per_element, batch)


def causal_tiles_per_rank(world_size: int, layout: str) -> list[int]:
    """Score tiles of ``(T/2P)²`` scores each rank computes, causal attention, T divisible by 2P.

    contiguous: rank r holds chunks 2r, 2r+1 and sees chunks ≤ its own → ``4r + 3`` tiles (rank
    P-1 does ``4P - 1``, rank 0 does 3); zigzag: chunks r and 2P-1-r → ``(r + 1) + (2P - r) =
    2P + 1`` on every rank. Both total ``2P² + P`` (the lower triangle of a 2P × 2P tile grid
    plus its diagonal). Striped tiling is not on this grid (see :func:`shard_positions`).

    Zigzag balance: Llama 3 context parallelism (arXiv:2407.21783, section 3.3.2). Taught in
    chapter 11.
    """
    check_rank(0, world_size)
    if layout == "contiguous":
        return [4 * r + 3 for r in range(world_size)]
    if layout == "zigzag":
        return [2 * world_size + 1] * world_size
    raise ValueError(f"layout must be 'contiguous' or 'zigzag' for the tile formula, "
                     f"got {layout!r}")
