"""Expert parallelism at scale, in closed form: weights per GPU and all-to-all bytes per step.

A mixture-of-experts model stores every expert but runs ``k`` of ``E`` per token. Spread over
``n`` GPUs by **expert parallelism** (GShard, Lepikhin et al. 2020, arXiv:2006.16668, §3.2;
DeepSeek-V3, arXiv:2412.19437, §3.4), each GPU keeps ``E / n`` routed experts of every MoE
layer and a copy of everything else (attention, embeddings, routers, shared experts, the dense
layers). Per GPU, with ``b`` bytes per weight:

    weight_bytes = b · (P_total − P_routed + P_routed / n),
    P_routed = L_moe · E · P_expert                        (P_expert: one expert's w1, w2, w3)

Per step, a GPU that holds ``T`` tokens sends each token's activation (``h`` values of
``b_a`` bytes) to the ``k`` experts it chose, and gets the outputs back (the combine mirrors the
dispatch). Under uniform routing a share ``(n − 1)/n`` of the ``k`` assignments lives on
another GPU, so two all-to-alls per MoE layer move

    a2a_bytes = L_moe · T · k · h · (b_dispatch + b_combine) · (n − 1)/n   (sent per GPU per step)

with ``b_a`` the dispatch's bytes per value in one direction and the combine's in the other:
DeepSeek-V3 quantizes the activations to FP8 before the dispatch and keeps the combine in BF16
(arXiv:2412.19437, §3.3, on low-precision communication), so its all-to-alls move 1 + 2 = 3 bytes per value, 1.5× what FP8
both ways would. They take ``a2a_bytes / B`` seconds at ``B`` bytes/s per direction of
the GPU's link (no overlap with compute; latency ignored).

Serving engines compute every routed token: vLLM and SGLang balance expert-parallel load by
placing redundant copies of busy experts (vLLM's EPLB, ``--enable-eplb``; DeepSeek-V3's
deployment, §3.4, does the same), and the DeepSeek-V3 report says the model "does not drop
tokens during inference" (§2.1.2; nor in its training). A **capacity factor**
— each expert takes at most ``C = ceil(cf · N · k / E)`` of a batch's ``N · k`` assignments, the
rest dropped — is a training device (GShard, arXiv:2006.16668, §2.2; Switch Transformer,
Fedus et al. 2021, arXiv:2101.03961, §2.2): :func:`uniform_overflow_fraction` gives what it
would drop under uniform routing, a what-if. Tensor parallelism instead all-reduces ``T · h · b_a`` twice per
layer (chapter 07's :mod:`llminfra.calc.communication`). The real counterpart over ranks is
:mod:`llminfra.parallel.expert_parallel`. Taught in chapter 11.
"""

from __future__ import annotations

import math

import torch

from llminfra.calc.communication import get_interconnect, ring_allreduce_time_s
from llminfra.calc.params import expert_param_count, param_count
from llminfra.specs.formats import dtype_bytes
from llminfra.specs.gpus import get_gpu
from llminfra.specs.models import ModelSpec, get_model
from llminfra.validate import positive_int


def routed_expert_params(model: str | ModelSpec) -> int:
    """Parameters of all routed experts: ``L_moe · E · P_expert`` (shared experts excluded)."""
    spec = get_model(model)
    return spec.num_moe_layers * spec.num_experts * expert_param_count(spec)


def _check(spec: ModelSpec, ep: int, top_k: int | None, tokens: int) -> int:
    if not spec.is_moe:
        raise ValueError(f"{spec.name} is a dense model (1 expert): expert parallelism needs a "
                         f"mixture of experts, e.g. mixtral-8x7b, qwen3-30b-a3b, deepseek-v3")
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or spec.num_experts % ep:
        raise ValueError(f"expert-parallel size must divide {spec.name}'s {spec.num_experts} "
                         f"experts, got {ep!r}")
    k = spec.experts_per_token if top_k is None else top_k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= spec.num_experts:
        raise ValueError(f"top_k must be an integer in [1, {spec.num_experts}], got {k!r}")
    positive_int("tokens (per GPU per step)", tokens)
    return k


def uniform_overflow_fraction(assignments: int, num_experts: int,
                              capacity_factor: float) -> float:
    """Share of ``assignments`` (token, expert) pairs a capacity factor would drop when they
    fall on ``num_experts`` experts uniformly at random: each expert's count ``X`` is
    Binomial(A, 1/E), its capacity ``C = ceil(cf · A / E)``, and the expected overflow
    ``E · E[max(0, X − C)] / A`` (real routers are less even, so they drop more). A
    training-time what-if (GShard, Switch): inference engines drop nothing. 1,024 assignments
    on 8 experts at cf = 1.0: 3.3 %."""
    positive_int("assignments", assignments)
    positive_int("num_experts", num_experts)
    if isinstance(capacity_factor, bool) or not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
    A, E = assignments, num_experts
    C = math.ceil(capacity_factor * A / E)
    if C >= A:
        return 0.0
    mean, sd = A / E, math.sqrt(A * (1 / E) * (1 - 1 / E))
    hi = min(A, int(mean + 12 * sd) + 2)
    if C >= hi:
        return 0.0
    x = torch.arange(C + 1, hi + 1, dtype=torch.float64)
    p = torch.distributions.Binomial(A, probs=torch.tensor(1 / E, dtype=torch.float64))
    return float(E * ((x - C) * p.log_prob(x).exp()).sum() / A)


def expert_parallel_plan(model: str | ModelSpec, ep: int, *, dtype: str = "bf16",
                         activation_dtype: str = "bf16", tokens: int = 1,
                         top_k: int | None = None, gpu: str = "h100",
                         interconnect: str = "nvlink-h100", dispatch_dtype: str | None = None,
                         combine_dtype: str | None = None,
                         capacity_factor: float | None = None) -> dict:
    """Weights per GPU and the all-to-all traffic of one step for ``model`` over ``ep`` GPUs.

    ``tokens``: tokens each GPU holds in the step (decode: its share of the batch);
    ``top_k``: experts per token (the model's own when None); ``dispatch_dtype`` /
    ``combine_dtype``: the two all-to-alls' activations (each ``activation_dtype`` when None;
    DeepSeek-V3: ``"fp8"`` / ``"bf16"``); ``capacity_factor``: the training-time what-if,
    ``overflow_fraction_training`` (:func:`uniform_overflow_fraction` of the step's
    ``tokens · ep · k`` assignments; None when not asked). Keys: ``weight_bytes_per_gpu``,
    ``fits`` (weights alone within the ``gpu``'s memory), ``a2a_bytes_per_step`` (sent per GPU),
    ``a2a_time_s``, and the tensor-parallel all-reduce over the same GPUs for comparison
    (``tp_weight_bytes_per_gpu``, ``tp_allreduce_bytes_per_step``, ``tp_allreduce_time_s``). Mixtral-8x7B (E = 8, k = 2,
    h = 4096, 32 MoE layers), ep = 8, 1 token, bf16: 2·32·1·2·4096·2·7/8 = 917,504 bytes.
    """
    spec = get_model(model)
    k = _check(spec, ep, top_k, tokens)
    b, b_a = dtype_bytes(dtype), dtype_bytes(activation_dtype)
    b_dispatch = dtype_bytes(dispatch_dtype or activation_dtype)
    b_combine = dtype_bytes(combine_dtype or activation_dtype)
    total, routed = param_count(spec), routed_expert_params(spec)
    weight_bytes = b * (total - routed + routed / ep)
    L_moe, h = spec.num_moe_layers, spec.hidden_size
    a2a = L_moe * tokens * k * h * (b_dispatch + b_combine) * (ep - 1) / ep
    overflow = (None if capacity_factor is None
                else uniform_overflow_fraction(tokens * ep * k, spec.num_experts, capacity_factor))
    link = get_interconnect(interconnect)
    tp_bytes = 2 * spec.num_layers * tokens * h * b_a            # two all-reduces per layer
    return {
        "model": spec.name, "ep": ep, "top_k": k, "num_experts": spec.num_experts,
        "experts_per_gpu": spec.num_experts // ep, "moe_layers": L_moe, "tokens": tokens,
        "total_params": total, "routed_expert_params": routed,
        "weight_bytes_per_gpu": weight_bytes,
        "gpu": get_gpu(gpu).name, "gpu_memory_bytes": get_gpu(gpu).memory_bytes,
        "fits": weight_bytes <= get_gpu(gpu).memory_bytes,
        "a2a_bytes_per_step": a2a, "interconnect": link.name,
        "dispatch_dtype": dispatch_dtype or activation_dtype,
        "combine_dtype": combine_dtype or activation_dtype,
        "capacity_factor": capacity_factor, "overflow_fraction_training": overflow,
        "a2a_time_s": a2a / link.bytes_per_s,
        "tp_weight_bytes_per_gpu": b * total / ep,
        "tp_allreduce_bytes_per_step": tp_bytes,
        "tp_allreduce_time_s": (2 * spec.num_layers * ring_allreduce_time_s(
            tokens * h * b_a, ep, link.bytes_per_s)),
    }


__all__ = ["expert_parallel_plan", "routed_expert_params", "uniform_overflow_fraction"]
