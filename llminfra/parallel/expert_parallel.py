"""Expert parallelism and tensor-parallel experts for a mixture-of-experts MLP, over a ``World``.

Expert parallelism (GShard, Lepikhin et al. 2020, arXiv:2006.16668, §3.2; DeepSeek-V3,
arXiv:2412.19437, §3.2.2): rank ``r`` of ``n`` holds experts ``r·E/n … (r+1)·E/n - 1`` and its
own share of the tokens. Per layer::

    route       each rank routes its tokens (the router W_g is replicated)
    dispatch    all-to-all #1: a token row goes to the rank that holds its expert
    compute     each rank runs its experts on the rows it received (grouped by expert)
    combine     all-to-all #2: the outputs go back to the token's rank, y_t = Σ g_{i,t} · out

            rank 0 tokens ──┐ ┌──> rank 0: experts 0..E/n-1 ──┐ ┌──> rank 0 tokens
            rank 1 tokens ──┼─┼──> rank 1: experts …         ──┼─┼──> rank 1 tokens
                        dispatch (all-to-all)            combine (all-to-all)

Capacity is per rank (GShard's "group" is a rank's tokens): ``C = ceil(cf · N_r · k / E)``.
So rank r's output equals the single-process layer applied to rank r's tokens, which is what
the tests check (without a capacity limit it also equals rows r of the layer on all tokens).

Tensor-parallel experts, for comparison (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053,
§3): every rank holds a ``1/n`` slice of every expert's inner size ``I`` (w1, w3 by rows, w2 by
columns) and all the tokens; each rank's partial sums meet in ONE all-reduce of ``(N, dim)``.
Taught in chapter 11.
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import asdict, dataclass

import pandas as pd
import torch
from torch import nn

from llminfra.model.moe import MoEFeedForward, group_by_expert, run_grouped
from llminfra.parallel.launch import launch
from llminfra.parallel.tensor_parallel import shard_cols, shard_rows, shard_size
from llminfra.parallel.world import World, run_simulated
from llminfra.validate import positive_int


class ExpertParallelMoE(nn.Module):
    """This rank's part of an expert-parallel :class:`~llminfra.model.moe.MoEFeedForward`: the
    replicated router (and shared expert), and experts ``r·E/n … (r+1)·E/n - 1`` only.

    ``forward(x (..., dim)) -> y (..., dim)`` on this rank's tokens;
    :meth:`forward_with_stats` also returns what moved. Every rank must pass the same full
    ``layer`` (same seed or checkpoint). ``ValueError`` unless ``world.size`` divides E.
    """

    def __init__(self, layer: MoEFeedForward, world: World):
        super().__init__()
        self.world = world
        self.local_experts = shard_size(layer.num_experts, world.size, "number of experts")
        self.first_expert = world.rank * self.local_experts
        self.moe = copy.deepcopy(layer)  # router, gating, capacity, shared expert
        self.moe.experts = nn.ModuleList(layer.experts[self.first_expert:self.first_expert
                                                       + self.local_experts])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_stats(x)[0]

    def forward_with_stats(self, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """``(y, stats)``: route, dispatch, compute, combine (see the module docstring)."""
        n, E_local = self.world.size, self.local_experts
        x2 = x.reshape(-1, x.shape[-1])  # (N_r, dim)
        routing = self.moe.route(x2)
        token_idx, _, weight, counts = group_by_expert(routing)  # sorted by expert = by rank
        counts = counts.view(n, E_local)  # (dest rank, its local expert)
        rows_to = counts.sum(1).tolist()
        recv_counts = torch.cat(self.world.all_to_all(list(counts.split(1))))  # (src, E_local)
        received = self.world.all_to_all(list(x2[token_idx].split(rows_to)))  # dispatch
        out = self._compute(torch.cat(received), recv_counts)
        back = self.world.all_to_all(list(out.split([r.shape[0] for r in received])))  # combine
        y = torch.zeros_like(x2).index_add_(0, token_idx, torch.cat(back) * weight[:, None])
        if self.moe.shared_expert is not None:
            y = y + self.moe.shared_expert(x2)
        rows_from = [r.shape[0] for r in received]
        return y.view(x.shape), self._stats(routing, rows_to, rows_from, x2)

    def _compute(self, rows: torch.Tensor, recv_counts: torch.Tensor) -> torch.Tensor:
        """Run the local experts on the received rows: from each source they come grouped by
        local expert; regroup all sources' rows by expert, compute, put back in arrival order."""
        local_e = torch.arange(self.local_experts, device=rows.device)
        local_e = local_e.repeat(self.world.size)  # (src·E_local,): sources' blocks in order
        expert_of_row = local_e.repeat_interleave(recv_counts.reshape(-1))  # (R,)
        order = torch.sort(expert_of_row, stable=True).indices
        out = torch.empty_like(rows)
        out[order] = run_grouped(self.moe.experts, rows[order], recv_counts.sum(0))
        return out

    def _stats(self, routing, rows_to: list[int], rows_from: list[int], x2) -> dict:
        r = self.world.rank
        row_bytes = x2.shape[-1] * x2.element_size()
        off_to = sum(v for j, v in enumerate(rows_to) if j != r)
        off_from = sum(v for j, v in enumerate(rows_from) if j != r)
        # the combine all-to-all mirrors the dispatch: what went out comes back, so over the
        # two exchanges every rank sends and receives (off_to + off_from) rows
        return {"rank": r, "tokens": x2.shape[0], "rows_sent": rows_to,
                "rows_received": rows_from,
                "dispatch_bytes_sent": off_to * row_bytes,
                "dispatch_bytes_received": off_from * row_bytes,
                "bytes_sent": (off_to + off_from) * row_bytes,
                "bytes_received": (off_from + off_to) * row_bytes,
                "tokens_per_expert": routing.tokens_per_expert.tolist(),
                "kept_per_expert": routing.kept_per_expert.tolist(),
                "capacity": routing.capacity,
                "dropped_assignments": routing.dropped_assignments,
                "dropped_tokens": routing.dropped_tokens}


def dispatch_counts(expert_ids, num_experts: int, world_size: int) -> list[int]:
    """Rows one rank sends to each rank in the dispatch all-to-all: one row per (token,
    expert) assignment, to the rank that holds that expert.

    Rank ``j`` holds experts ``j·E/n … (j+1)·E/n - 1``, so expert ``e`` lives on rank
    ``e // (E/n)``, and ``counts[j] = #{(t, i) : expert_ids[t][i] // (E/n) == j}``. A token
    whose k experts sit on one rank is sent there k times (GShard, Lepikhin et al. 2020,
    arXiv:2006.16668, §3.2): what :meth:`ExpertParallelMoE.forward_with_stats` reports as
    ``rows_sent`` when no capacity limit drops an assignment. The counts sum to ``N·k``.

    ``expert_ids``: ``(N, k)`` ints, a tensor or a list of N lists; returns a list of ``n``
    ints. Worked example: E = 8, n = 4 (two experts a rank), ``[[0, 5], [2, 3], [7, 6]]`` →
    ``[1, 2, 1, 2]``. ``ValueError`` unless ``n`` divides ``E`` and every id is in
    ``0 … E-1``. Taught in chapter 11.
    """
    for name, v in (("num_experts", num_experts), ("world_size", world_size)):
        positive_int(name, v)
    per_rank = shard_size(num_experts, world_size, "number of experts")
    rows = expert_ids.tolist() if hasattr(expert_ids, "tolist") else expert_ids
    counts = [0] * world_size
    for row in rows:
        if not isinstance(row, (list, tuple)):
            raise ValueError(f"expert_ids must be N lists of k expert ids (shape (N, k)), "
                             f"got a row {row!r}")
        for e in row:
            if (isinstance(e, bool) or not isinstance(e, numbers.Real) or e != int(e)
                    or not 0 <= e < num_experts):
                raise ValueError(f"expert id {e!r} is not an int in 0 … {num_experts - 1}")
            counts[int(e) // per_rank] += 1
    return counts


def tensor_parallel_experts(layer: MoEFeedForward, world: World) -> MoEFeedForward:
    """A copy of ``layer`` whose every expert (and shared expert) keeps inner features
    ``r·I/n … (r+1)·I/n - 1``: w1, w3 column parallel, w2 row parallel (Megatron-LM,
    arXiv:1909.08053, §3). Its output is this rank's partial sum; :func:`tp_moe_forward` adds
    the all-reduce. ``ValueError`` unless ``world.size`` divides I."""
    tp = copy.deepcopy(layer)
    for expert in list(tp.experts) + ([tp.shared_expert] if tp.shared_expert else []):
        shard_size(expert.w1.out_features, world.size, "expert inner size (ffn_dim)")
        r, n = world.rank, world.size
        expert.w1.weight = nn.Parameter(shard_rows(expert.w1.weight, r, n).clone())
        expert.w3.weight = nn.Parameter(shard_rows(expert.w3.weight, r, n).clone())
        expert.w2.weight = nn.Parameter(shard_cols(expert.w2.weight, r, n).clone())
        expert.w1.out_features = expert.w3.out_features = expert.w2.in_features = \
            expert.w2.weight.shape[1]
    return tp


def tp_moe_forward(tp_layer: MoEFeedForward, x: torch.Tensor, world: World) -> torch.Tensor:
    """``y = Σ_r partial_r(x)``: the tensor-parallel MoE on the same tokens ``x`` on every
    rank, one all-reduce of ``(..., dim)``."""
    return world.all_reduce(tp_layer(x))


@dataclass(frozen=True)
class MoECase:
    """One experiment, drawn from ``seed``: a MoE layer and ``tokens`` input rows of ``dim``
    features, split over the ranks in (possibly uneven) contiguous chunks. Picklable, so the
    spawned ranks rebuild the same layer and tokens from it."""

    num_experts: int = 8
    top_k: int = 2
    tokens: int = 37
    dim: int = 32
    ffn_dim: int = 64
    gating: str = "softmax"
    shared_expert: bool = False
    capacity_factor: float | None = None
    seed: int = 0

    def build(self) -> tuple[MoEFeedForward, torch.Tensor]:
        """``(layer, x (tokens, dim))``, the same on every rank."""
        g = torch.Generator().manual_seed(self.seed)
        layer = MoEFeedForward(self.dim, self.ffn_dim, self.num_experts, self.top_k,
                               self.gating, self.shared_expert, self.capacity_factor, g)
        return layer, torch.randn(self.tokens, self.dim, generator=g)

    def rank_tokens(self, x: torch.Tensor, rank: int, size: int) -> torch.Tensor:
        """Rank ``rank``'s rows of ``x``: ``torch.tensor_split`` into ``size`` chunks."""
        return torch.tensor_split(x, size)[rank]


@torch.no_grad()
def moe_rank_check(world: World, case: MoECase) -> dict:
    """What one rank computes (for :func:`~llminfra.parallel.launch.launch` or
    :func:`~llminfra.parallel.world.run_simulated`): the expert-parallel output on its tokens
    with its stats, and the tensor-parallel output on all tokens."""
    layer, x = case.build()
    y_ep, stats = ExpertParallelMoE(layer, world).forward_with_stats(
        case.rank_tokens(x, world.rank, world.size))
    y_tp = tp_moe_forward(tensor_parallel_experts(layer, world), x, world)
    return {"y_ep": y_ep, "y_tp": y_tp, "stats": stats}


def all_to_all_pattern(world: World) -> list[torch.Tensor]:
    """A known uneven exchange, to check ``world.all_to_all``: rank r sends rank j
    ``(r + 2·j) mod 3`` rows of 3 values, all ``100·r + j`` (some items have 0 rows); returns
    what this rank received."""
    items = [torch.full(((world.rank + 2 * j) % 3, 3), float(100 * world.rank + j))
             for j in range(world.size)]
    return world.all_to_all(items)


def all_to_all_mismatch(world: World) -> str:
    """The ``ValueError`` text every rank gets when rank 0 sends float32 and the others
    float64 (the exchange stops after the row counts, so the ranks stay in step)."""
    dtype = torch.float32 if world.rank == 0 else torch.float64
    try:
        world.all_to_all([torch.zeros(1, 2, dtype=dtype) for _ in range(world.size)])
    except ValueError as err:
        return str(err)
    return ""


def expert_parallel_selfcheck(world: World, cases: list[MoECase]) -> dict:
    """Everything one launch checks on a rank: :func:`all_to_all_pattern`,
    :func:`all_to_all_mismatch` and :func:`moe_rank_check` for each case (one spawn serves all)."""
    return {"a2a": all_to_all_pattern(world), "a2a_error": all_to_all_mismatch(world),
            "moe": [moe_rank_check(world, c) for c in cases]}


@torch.no_grad()
def single_process_reference(case: MoECase, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per-rank reference, whole-batch reference)``: the unsharded layer on each rank's
    tokens separately (capacity per rank, as expert parallelism does), concatenated; and the
    layer on all tokens at once (what tensor-parallel experts compute)."""
    layer, x = case.build()
    per_rank = torch.cat([layer(case.rank_tokens(x, r, world_size))
                          for r in range(world_size)])
    return per_rank, layer(x)


def compare_to_single(case: MoECase, results: list[dict]) -> dict:
    """``{"max_abs_diff_ep": …, "max_abs_diff_tp": …}`` of ranks' results against
    :func:`single_process_reference`."""
    per_rank, whole = single_process_reference(case, len(results))
    y_ep = torch.cat([r["y_ep"] for r in results])
    tp_diff = max(float((r["y_tp"] - whole).abs().max()) for r in results)
    return {"max_abs_diff_ep": float((y_ep - per_rank).abs().max()),
            "max_abs_diff_tp": tp_diff}


def _case(num_experts, top_k, tokens, capacity_factor, seed, **kw) -> MoECase:
    for name, v in (("num_experts", num_experts), ("top_k", top_k), ("tokens", tokens)):
        positive_int(name, v)
    return MoECase(num_experts=num_experts, top_k=top_k, tokens=tokens,
                   capacity_factor=capacity_factor, seed=seed, **kw)


def expert_parallel_report(world_size: int = 4, num_experts: int = 8, top_k: int = 2,
                           tokens: int = 64, capacity_factor: float | None = None,
                           seed: int = 0, **case_fields) -> pd.DataFrame:
    """Run expert parallelism on ``world_size`` simulated ranks; one row per rank.

    Columns: ``rank``, ``experts`` (which it holds), ``tokens`` (its own), ``rows_sent_to_others``
    / ``rows_received_from_others`` (dispatch, token-expert rows), ``dispatch_bytes_sent`` /
    ``dispatch_bytes_received`` (the first all-to-all), ``bytes_sent`` / ``bytes_received``
    (activations over both all-to-alls, equal since the combine mirrors the dispatch;
    self-traffic and the small row-count exchange excluded),
    ``expert_load_tokens`` (rows its experts computed), ``load_vs_mean`` (that ÷ the mean
    over ranks), ``dropped_assignments`` (over capacity, routed from this rank),
    ``capacity_per_expert``; for comparison ``tp_ring_allreduce_bytes_sent``, what one rank of
    tensor-parallel experts sends to all-reduce the ``(tokens, dim)`` float32 output of the
    whole batch with a ring: ``2 (n-1)/n · tokens · dim · 4`` (Patarasuk & Yuan 2009, "Bandwidth
    optimal all-reduce algorithms", J. Parallel Distrib. Comput. 69(2)). ``case_fields`` go to
    :class:`MoECase` (dim, ffn_dim, gating, shared_expert, …).
    """
    case = _case(num_experts, top_k, tokens, capacity_factor, seed, **case_fields)
    results = run_simulated(moe_rank_check, world_size, case)
    stats = [r["stats"] for r in results]
    E_local = num_experts // world_size
    rows = []
    for s in stats:
        r = s["rank"]
        rows.append({"rank": r, "experts": f"{r * E_local}..{(r + 1) * E_local - 1}",
                     "tokens": s["tokens"],
                     "rows_sent_to_others": sum(s["rows_sent"]) - s["rows_sent"][r],
                     "rows_received_from_others": sum(s["rows_received"]) - s["rows_received"][r],
                     "dispatch_bytes_sent": s["dispatch_bytes_sent"],
                     "dispatch_bytes_received": s["dispatch_bytes_received"],
                     "bytes_sent": s["bytes_sent"], "bytes_received": s["bytes_received"],
                     "expert_load_tokens": sum(s["rows_received"]),
                     "dropped_assignments": s["dropped_assignments"],
                     "capacity_per_expert": s["capacity"]})
    df = pd.DataFrame(rows)
    df.insert(df.columns.get_loc("expert_load_tokens") + 1, "load_vs_mean",
              df["expert_load_tokens"] / df["expert_load_tokens"].mean())
    n, payload = world_size, tokens * case.dim * 4  # float32 (tokens, dim) output, all-reduced
    df["tp_ring_allreduce_bytes_sent"] = round(2 * (n - 1) / n * payload)
    return df


def expert_load_report(world_size: int = 4, num_experts: int = 8, top_k: int = 2,
                       tokens: int = 64, capacity_factor: float | None = None,
                       seed: int = 0, **case_fields) -> pd.DataFrame:
    """One row per expert, summed over the simulated ranks: ``expert``, ``rank`` (its holder),
    ``tokens_routed`` (demand), ``tokens_computed`` (within capacity), ``tokens_dropped``,
    ``load_vs_mean`` (routed ÷ mean routed; its max is the max/mean imbalance)."""
    case = _case(num_experts, top_k, tokens, capacity_factor, seed, **case_fields)
    stats = [r["stats"] for r in run_simulated(moe_rank_check, world_size, case)]
    routed = torch.tensor([s["tokens_per_expert"] for s in stats]).sum(0)
    kept = torch.tensor([s["kept_per_expert"] for s in stats]).sum(0)
    df = pd.DataFrame({"expert": range(num_experts),
                       "rank": [e // (num_experts // world_size) for e in range(num_experts)],
                       "tokens_routed": routed.tolist(), "tokens_computed": kept.tolist(),
                       "tokens_dropped": (routed - kept).tolist()})
    df["load_vs_mean"] = df["tokens_routed"] / df["tokens_routed"].mean()
    return df


def expert_parallel_check(world_size: int = 2, num_experts: int = 8, top_k: int = 2,
                          tokens: int = 37, capacity_factor: float | None = None,
                          seed: int = 0, real_processes: bool = True, **case_fields) -> dict:
    """Expert-parallel and tensor-parallel experts against the single-process layer:
    ``{"world_size", "backend", "max_abs_diff_ep", "max_abs_diff_tp", "case"}``. With
    ``real_processes`` the ranks are spawned processes over gloo
    (:func:`~llminfra.parallel.launch.launch`, a few seconds), otherwise simulated threads."""
    case = _case(num_experts, top_k, tokens, capacity_factor, seed, **case_fields)
    if real_processes:
        results, backend = launch(moe_rank_check, world_size, case, timeout_s=120), "gloo"
    else:
        results, backend = run_simulated(moe_rank_check, world_size, case), "simulated"
    return {"world_size": world_size, "backend": backend,
            **compare_to_single(case, results), "case": asdict(case)}
