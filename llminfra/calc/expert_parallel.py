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

    a2a_bytes = 2 · L_moe · T · k · h · b_a · (n − 1)/n     (sent by each GPU per step)

and take ``a2a_bytes / B`` seconds at ``B`` bytes/s per direction of the GPU's link (no overlap
with compute; latency ignored). Tensor parallelism instead all-reduces ``T · h · b_a`` twice per
layer (chapter 07's :mod:`llminfra.calc.communication`). The real counterpart over ranks is
:mod:`llminfra.parallel.expert_parallel`. Taught in chapter 11.
"""

from __future__ import annotations

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


def expert_parallel_plan(model: str | ModelSpec, ep: int, *, dtype: str = "bf16",
                         activation_dtype: str = "bf16", tokens: int = 1,
                         top_k: int | None = None, gpu: str = "h100",
                         interconnect: str = "nvlink-h100") -> dict:
    """Weights per GPU and the all-to-all traffic of one step for ``model`` over ``ep`` GPUs.

    ``tokens``: tokens each GPU holds in the step (decode: its share of the batch);
    ``top_k``: experts per token (the model's own when None). Keys: ``weight_bytes_per_gpu``,
    ``fits`` (weights alone within the ``gpu``'s memory), ``a2a_bytes_per_step`` (sent per GPU),
    ``a2a_time_s``, and the tensor-parallel all-reduce over the same GPUs for comparison
    (``tp_weight_bytes_per_gpu``, ``tp_allreduce_bytes_per_step``, ``tp_allreduce_time_s``). Mixtral-8x7B (E = 8, k = 2,
    h = 4096, 32 MoE layers), ep = 8, 1 token, bf16: 2·32·1·2·4096·2·7/8 = 917,504 bytes.
    """
    spec = get_model(model)
    k = _check(spec, ep, top_k, tokens)
    b, b_a = dtype_bytes(dtype), dtype_bytes(activation_dtype)
    total, routed = param_count(spec), routed_expert_params(spec)
    weight_bytes = b * (total - routed + routed / ep)
    L_moe, h = spec.num_moe_layers, spec.hidden_size
    a2a = 2 * L_moe * tokens * k * h * b_a * (ep - 1) / ep
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
        "a2a_time_s": a2a / link.bytes_per_s,
        "tp_weight_bytes_per_gpu": b * total / ep,
        "tp_allreduce_bytes_per_step": tp_bytes,
        "tp_allreduce_time_s": (2 * spec.num_layers * ring_allreduce_time_s(
            tokens * h * b_a, ep, link.bytes_per_s)),
    }


__all__ = ["expert_parallel_plan", "routed_expert_params"]
