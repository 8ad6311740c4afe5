"""Mixture-of-experts MLP: a top-k router, SwiGLU experts, an optional shared expert, capacity.

Each token ``x_t`` (``dim`` features) is scored by a router ``u_t = W_g x_t`` (one logit per
expert, ``E`` experts), sent to its ``k`` best experts, and the experts' outputs are mixed with
gate weights ``g``::

    y_t = [FFN_shared(x_t)] + Σ_{i ∈ TopK(u_t, k)} g_{i,t} · FFN_i(x_t)

Two gatings:

* ``"softmax"`` — Mixtral (Jiang et al. 2024, arXiv:2401.04088, §2.1): ``g = softmax`` over the
  k selected logits only (``Softmax(Top2(x · W_g))``);
* ``"sigmoid"`` — DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437, §2.1.2, eqs. 13-15):
  ``s_i = sigmoid(u_i)``, the top-k of ``s`` are kept and normalised to sum 1,
  ``g_i = s_i / Σ_{j ∈ TopK} s_j``; DeepSeek-V3 also adds an always-on shared expert. (Its
  load-balancing bias, used for selection only, and its routed scaling factor are left out.)

Experts are SwiGLU MLPs (Shazeer 2020, arXiv:2002.05202), ``dim -> ffn_dim -> dim``.

Capacity (GShard, Lepikhin et al. 2020, arXiv:2006.16668, §2.2 and Algorithm 1; Switch
Transformer, Fedus et al. 2021, arXiv:2101.03961, §2.2): with ``capacity_factor`` cf, each expert
takes at most ``C = ceil(cf · N · k / E)`` of the ``N · k`` token-expert assignments. First
choices are served before second choices, earlier tokens before later ones (GShard's order);
an assignment over capacity is dropped: that expert adds nothing to the token, the residual
connection around the layer carries it on. Weights are not renormalised after a drop (Switch).

Two forward paths side by side, tied by a test: :meth:`MoEFeedForward.forward_naive` (a loop
over tokens and their k experts) and :meth:`MoEFeedForward.forward` (sort the assignments by
expert, gather each expert's rows, ONE matmul chain per expert, scatter-add back).
Taught in chapter 11.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llminfra.model.config import BYTE_VOCAB_SIZE, ModelConfig
from llminfra.validate import positive_int

#: gate functions the router knows
GATINGS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class RouterOutput:
    """Where each token goes: the router's decision for ``N`` tokens, ``k`` experts each.

    * ``expert_ids`` ``(N, k)`` long — the chosen experts, best first;
    * ``weights`` ``(N, k)`` — gate weights ``g`` (sum 1 per token before any drop);
    * ``tokens_per_expert`` ``(E,)`` long — assignments routed to each expert (the demand,
      before capacity); sums to ``N · k``;
    * ``kept`` ``(N, k)`` bool — assignments within capacity (all True without capacity);
    * ``capacity`` — ``C`` per expert, or None (no limit).

    Taught in chapter 11.
    """

    expert_ids: torch.Tensor
    weights: torch.Tensor
    tokens_per_expert: torch.Tensor
    kept: torch.Tensor
    capacity: int | None = None

    @property
    def kept_per_expert(self) -> torch.Tensor:
        """``(E,)`` assignments each expert actually computes (``min(demand, C)``)."""
        E = self.tokens_per_expert.numel()
        return torch.bincount(self.expert_ids[self.kept], minlength=E)

    @property
    def dropped_assignments(self) -> int:
        """Token-expert pairs dropped for capacity."""
        return int((~self.kept).sum())

    @property
    def dropped_tokens(self) -> int:
        """Tokens that lost every one of their k experts (only the residual carries them)."""
        return int((~self.kept).all(dim=-1).sum()) if self.kept.numel() else 0

    @property
    def load_imbalance(self) -> float:
        """``max / mean`` of ``tokens_per_expert`` (1.0 = perfectly balanced; 0 tokens -> 1.0)."""
        load = self.tokens_per_expert.double()
        return float(load.max() / load.mean()) if load.sum() > 0 else 1.0


def expert_capacity(num_tokens: int, top_k: int, num_experts: int,
                    capacity_factor: float) -> int:
    """``C = ceil(cf · N · k / E)`` assignments per expert (Switch Transformer, Fedus et al. 2021,
    arXiv:2101.03961, §2.2, with k = 1; GShard, arXiv:2006.16668, for k = 2).

    Worked example: N = 10 tokens, k = 2, E = 4, cf = 1.25 -> ceil(6.25) = 7.
    """
    if not (isinstance(capacity_factor, (int, float)) and capacity_factor > 0):
        raise ValueError(f"capacity_factor must be a number > 0 (or None for no limit), "
                         f"got {capacity_factor!r}")
    return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


def capacity_mask(expert_ids: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """``kept (N, k)`` bool: which assignments fit in ``capacity`` per expert.

    Priority as in GShard's Algorithm 1: slot 0 (every token's first choice) before slot 1, and
    within a slot, token order. An assignment's place in its expert's queue is the count of
    earlier assignments to that expert (a cumulative sum over a one-hot matrix).
    """
    N, k = expert_ids.shape
    slot_major = expert_ids.t().reshape(-1)  # (k·N,) first choices first
    one_hot = F.one_hot(slot_major, num_experts)  # (k·N, E)
    place = (one_hot.cumsum(0) * one_hot).sum(-1) - 1  # 0-based position in its expert's queue
    return (place < capacity).view(k, N).t()  # (N, k)


def route(router_logits: torch.Tensor, top_k: int, gating: str = "softmax",
          capacity_factor: float | None = None) -> RouterOutput:
    """Top-k routing of ``router_logits (N, E)`` -> :class:`RouterOutput`.

    ``gating="softmax"``: g = softmax over the k largest logits (Mixtral, arXiv:2401.04088);
    ``gating="sigmoid"``: s = sigmoid(logits), top-k of s, g = s / Σ s (DeepSeek-V3,
    arXiv:2412.19437, eqs. 13-15). With ``capacity_factor``, assignments past
    ``C = ceil(cf · N · k / E)`` are marked dropped (:func:`capacity_mask`).
    """
    if gating not in GATINGS:
        raise ValueError(f"unknown gating {gating!r}; allowed: {', '.join(GATINGS)}")
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be (tokens, experts), got "
                         f"{tuple(router_logits.shape)}")
    N, E = router_logits.shape
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= E:
        raise ValueError(f"top_k must be an int in 1..{E} (the number of experts), got {top_k!r}")
    if gating == "softmax":
        top_logits, expert_ids = router_logits.topk(top_k, dim=-1)  # (N, k) each
        weights = torch.softmax(top_logits.float(), dim=-1).to(router_logits.dtype)
    else:
        scores = torch.sigmoid(router_logits)  # (N, E)
        top_scores, expert_ids = scores.topk(top_k, dim=-1)
        weights = top_scores / top_scores.sum(-1, keepdim=True)
    counts = torch.bincount(expert_ids.reshape(-1), minlength=E)  # (E,)
    if capacity_factor is None:
        return RouterOutput(expert_ids, weights, counts, torch.ones_like(expert_ids, dtype=bool))
    C = expert_capacity(N, top_k, E, capacity_factor)
    return RouterOutput(expert_ids, weights, counts, capacity_mask(expert_ids, E, C), C)


def group_by_expert(routing: RouterOutput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                    torch.Tensor]:
    """The kept assignments sorted by expert: ``(token_idx (M,), expert_idx (M,),
    weight (M,), counts (E,))``; rows of expert e are contiguous, ``counts[e]`` of them, in
    token order. ``M = N · k - dropped``. This is what expert parallelism dispatches."""
    N, k = routing.expert_ids.shape
    E = routing.tokens_per_expert.numel()
    keep = routing.kept.reshape(-1)
    token_idx = torch.arange(N, device=routing.expert_ids.device).repeat_interleave(k)[keep]
    expert_idx = routing.expert_ids.reshape(-1)[keep]
    weight = routing.weights.reshape(-1)[keep]
    order = torch.sort(expert_idx, stable=True).indices
    return (token_idx[order], expert_idx[order], weight[order],
            torch.bincount(expert_idx, minlength=E))


def run_grouped(experts, x_sorted: torch.Tensor, counts) -> torch.Tensor:
    """Each expert on its contiguous block of rows: ``x_sorted (M, dim)`` with ``counts[e]`` rows
    for ``experts[e]`` -> ``(M, dim)``; one matmul chain per expert with rows (empty ones
    skipped)."""
    out = torch.empty_like(x_sorted)
    start = 0
    for expert, n in zip(experts, [int(c) for c in counts]):
        if n:
            out[start:start + n] = expert(x_sorted[start:start + n])
        start += n
    return out


class SwiGLUExpert(nn.Module):
    """One expert: ``w2 · (silu(w1 · x) ⊙ w3 · x)`` (Shazeer 2020, arXiv:2002.05202, eq. 6), the
    same MLP as the dense model's. ``(..., dim) -> (..., dim)``, inner size ``ffn_dim``."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)  # gate
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)  # down
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoEFeedForward(nn.Module):
    """Mixture-of-experts MLP: router ``W_g`` (``dim -> E``, no bias), ``E`` SwiGLU experts,
    an optional shared expert, top-k gating, optional capacity (see the module docstring).

    ``x (..., dim) -> (..., dim)`` (dense ``(B, T, dim)`` and ragged ``(N, dim)`` alike; the
    leading dimensions are flattened into ``N`` tokens). Weights std 0.02 from ``generator``
    (seed 0 when None); a :class:`~llminfra.model.Transformer` redraws them its own way.
    Taught in chapter 11.
    """

    def __init__(self, dim: int, ffn_dim: int, num_experts: int, top_k: int,
                 gating: str = "softmax", shared_expert: bool = False,
                 capacity_factor: float | None = None,
                 generator: torch.Generator | None = None):
        super().__init__()
        for name, v in (("dim", dim), ("ffn_dim", ffn_dim), ("num_experts", num_experts)):
            positive_int(name, v)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be an int in 1..{num_experts}, got {top_k!r}")
        if gating not in GATINGS:
            raise ValueError(f"unknown gating {gating!r}; allowed: {', '.join(GATINGS)}")
        if capacity_factor is not None:
            expert_capacity(1, 1, 1, capacity_factor)  # validates it
        self.num_experts, self.top_k, self.gating = num_experts, top_k, gating
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLUExpert(dim, ffn_dim) for _ in range(num_experts))
        self.shared_expert = SwiGLUExpert(dim, ffn_dim) if shared_expert else None
        g = generator if generator is not None else torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.parameters():
                if not p.is_meta:  # built on the meta device (shapes only): nothing to draw
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    @classmethod
    def from_config(cls, config: ModelConfig) -> "MoEFeedForward":
        """The MoE layer a :class:`ModelConfig` with ``num_experts > 1`` asks for (each expert of
        inner size ``ffn_dim``, Mixtral's convention; no shared expert, no capacity limit)."""
        return cls(config.dim, config.ffn_dim, config.num_experts, config.experts_per_token,
                   config.moe_gating)

    def route(self, x: torch.Tensor) -> RouterOutput:
        """Routing of the flat tokens ``x (N, dim)`` (:func:`route` on ``W_g x``)."""
        return route(self.router(x), self.top_k, self.gating, self.capacity_factor)

    def forward_with_routing(self, x: torch.Tensor) -> tuple[torch.Tensor, RouterOutput]:
        """Grouped path: ``(y (..., dim), routing)``. Sort assignments by expert, run each
        expert once on its rows, scale by g, scatter-add into the tokens."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (N, dim)
        routing = self.route(x2)
        token_idx, _, weight, counts = group_by_expert(routing)
        out = run_grouped(self.experts, x2[token_idx], counts)  # (M, dim)
        y = torch.zeros_like(x2).index_add_(0, token_idx, out * weight[:, None])
        if self.shared_expert is not None:
            y = y + self.shared_expert(x2)
        return y.view(shape), routing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_routing(x)[0]

    def forward_naive(self, x: torch.Tensor) -> torch.Tensor:
        """Reference path: for every token t and each of its kept experts i,
        ``y_t += g_{i,t} · FFN_i(x_t)`` one row at a time. Same result as :meth:`forward`."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        routing = self.route(x2)
        y = torch.zeros_like(x2)
        for t in range(x2.shape[0]):
            for j in range(self.top_k):
                if routing.kept[t, j]:
                    i = int(routing.expert_ids[t, j])
                    y[t] += routing.weights[t, j] * self.experts[i](x2[t])
            if self.shared_expert is not None:
                y[t] += self.shared_expert(x2[t])
        return y.view(shape)


def tiny_moe_config(num_experts: int = 4, experts_per_token: int = 2,
                    gating: str = "softmax") -> ModelConfig:
    """A small MoE decoder with the tiny model's byte vocabulary (so
    :class:`~llminfra.model.ByteTokenizer` reads it): dim 64, 2 layers, 4 query / 2 K/V heads,
    ``num_experts`` SwiGLU experts of inner size 128 per layer, ``experts_per_token`` of them per
    token, 256-byte context. Random weights: for running MoE through the engine, not for text.
    """
    return ModelConfig(vocab_size=BYTE_VOCAB_SIZE, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                       ffn_dim=128, max_seq_len=256, num_experts=num_experts,
                       experts_per_token=experts_per_token, moe_gating=gating)
