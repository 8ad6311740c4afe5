"""Exact parameter counts from an architecture (:class:`llminfra.specs.ModelSpec`).

Every weight matrix, bias, norm and embedding of the released implementation is counted, so the
totals equal what ``sum(p.numel() for p in model.parameters())`` gives for the Hugging Face
model. Worked example (Llama-2-7B, h = 4096, I = 11008, L = 32, V = 32000, untied)::

    embedding + lm_head   2 · 32000 · 4096                 =   262,144,000
    per layer  attention  4 · 4096²                        =    67,108,864
               MLP        3 · 4096 · 11008                 =   135,266,304
               2 RMSNorms 2 · 4096                         =         8,192
    32 layers                                              = 6,476,267,520
    final norm                                             =         4,096
    total                                                  = 6,738,415,616

Taught in chapters 01 and 02.
"""

from __future__ import annotations

from llminfra.specs.models import ModelSpec, get_model


def _norm(spec: ModelSpec) -> int:
    h = spec.hidden_size
    return h if spec.norm == "rmsnorm" else 2 * h  # LayerNorm has a weight and a bias


def _attention(spec: ModelSpec) -> int:
    h, kv = spec.hidden_size, spec.num_kv_heads * spec.head_dim
    weights = h * h + 2 * h * kv + h * h  # Q, K, V, output projection
    bias = (h + 2 * kv if spec.qkv_bias else 0) + (h if spec.linear_bias else 0)
    return weights + bias


def _mlp(spec: ModelSpec) -> int:
    """One MLP (one expert for mixture-of-experts)."""
    h, i = spec.hidden_size, spec.intermediate_size
    if spec.mlp == "gated":  # gate and up projections h -> I, down projection I -> h
        return 3 * h * i + (2 * i + h if spec.linear_bias else 0)
    return 2 * h * i + (i + h if spec.linear_bias else 0)


def _norms_per_layer(spec: ModelSpec) -> int:
    if spec.family == "falcon" and not spec.falcon_new_decoder:
        return _norm(spec)  # one shared LayerNorm before the parallel attention and MLP
    return 2 * _norm(spec)


def param_breakdown(model: str | ModelSpec) -> dict[str, int]:
    """Parameters by part: ``embedding``, ``positions``, ``attention``, ``mlp``, ``router``,
    ``norms``, ``lm_head``; ``total`` is their sum. ``mlp`` counts every expert."""
    spec = get_model(model)
    L, h = spec.num_layers, spec.hidden_size
    positions = 0
    if spec.positions == "learned":
        # OPT's learned positions keep 2 extra rows (an offset of 2 in the released code)
        positions = (spec.max_positions + (2 if spec.family == "opt" else 0)) * h
    parts = {
        "embedding": spec.vocab_size * h,
        "positions": positions,
        "attention": L * _attention(spec),
        "mlp": L * spec.num_experts * _mlp(spec),
        "router": L * h * spec.num_experts if spec.is_moe else 0,
        "norms": L * _norms_per_layer(spec) + _norm(spec),  # + the final norm
        "lm_head": 0 if spec.tied_embeddings else spec.vocab_size * h,
    }
    parts["total"] = sum(parts.values())
    return parts


def param_count(model: str | ModelSpec) -> int:
    """Total parameters of ``model`` (every expert of a mixture-of-experts)."""
    return param_breakdown(model)["total"]


def active_param_count(model: str | ModelSpec) -> int:
    """Parameters used for one token: for mixture-of-experts only ``experts_per_token`` of the
    experts' MLPs count (Mixtral 8x7B: 2 of 8); equal to :func:`param_count` otherwise."""
    spec = get_model(model)
    total = param_count(spec)
    unused = spec.num_layers * (spec.num_experts - spec.experts_per_token) * _mlp(spec)
    return total - unused


def linear_weight_count(model: str | ModelSpec) -> int:
    """Weights inside the transformer blocks' linear layers (what weight quantization
    quantizes); embeddings, lm_head, norms and biases are not included."""
    spec = get_model(model)
    h, kv, i = spec.hidden_size, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    attn = 2 * h * h + 2 * h * kv
    mlp = (3 if spec.mlp == "gated" else 2) * h * i * spec.num_experts
    return spec.num_layers * (attn + mlp)
