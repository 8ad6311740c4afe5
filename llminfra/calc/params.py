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

Mixture-of-experts (Mixtral, Qwen3-MoE, DeepSeekMoE) and multi-head latent attention (DeepSeek)
are counted layer by layer from the config fields (see :class:`llminfra.specs.ModelSpec`): a
MoE layer holds ``num_experts`` routed experts, ``num_shared_experts`` shared ones and a router
(``num_experts · h`` weights, plus ``num_experts`` biases for DeepSeek-V3's ``noaux_tc`` gate); the
first ``first_dense_layers`` layers keep a dense MLP. DeepSeek-V3's multi-token-prediction
module is not counted (its 671 B are the main model; the checkpoint's 685 B include the 14 B
MTP module, DeepSeek-V3 README). Taught in chapters 01, 02 and 11.
"""

from __future__ import annotations

from llminfra.specs.models import ModelSpec, get_model
from llminfra.validate import positive_int


def _norm(spec: ModelSpec) -> int:
    h = spec.hidden_size
    return h if spec.norm == "rmsnorm" else 2 * h  # LayerNorm has a weight and a bias


def _mla_attention(spec: ModelSpec) -> int:
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, §2.1, eqs. 9-19), as the
    released ``DeepseekV2/V3Attention``: q = W_UQ·RMSNorm(W_DQ·h) (or one h -> H·(d_h + d_h^R)
    projection when ``q_lora_rank`` is None); [c_KV, k^R] = W_DKV·h (h -> d_c + d_h^R);
    RMSNorm(d_c); [k^C, v] = W_UKV·c_KV (d_c -> H·(d_h + d_v)); output H·d_v -> h."""
    h, H, dc = spec.hidden_size, spec.num_heads, spec.kv_lora_rank
    q_out = H * (spec.qk_nope_head_dim + spec.qk_rope_head_dim)
    rq = spec.q_lora_rank
    q = h * q_out if rq is None else h * rq + rq + rq * q_out
    kv = h * (dc + spec.qk_rope_head_dim) + dc + dc * H * (spec.qk_nope_head_dim + spec.v_head_dim)
    return q + kv + H * spec.v_head_dim * h


def _attention(spec: ModelSpec) -> int:
    if spec.is_mla:
        return _mla_attention(spec)
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    weights = h * q + 2 * h * kv + q * h  # Q, K, V, output projection
    bias = (q + 2 * kv if spec.qkv_bias else 0) + (h if spec.linear_bias else 0)
    norms = 2 * spec.head_dim if spec.qk_norm else 0  # Qwen3: RMSNorm(head_dim) on q and on k
    return weights + bias + norms


def _mlp(spec: ModelSpec, intermediate: int | None = None) -> int:
    """One MLP of width ``intermediate`` (default ``intermediate_size``)."""
    h, i = spec.hidden_size, intermediate or spec.intermediate_size
    if spec.mlp == "gated":  # gate and up projections h -> I, down projection I -> h
        return 3 * h * i + (2 * i + h if spec.linear_bias else 0)
    return 2 * h * i + (i + h if spec.linear_bias else 0)


def expert_param_count(model: str | ModelSpec) -> int:
    """Parameters of ONE routed expert of one layer (a gated MLP of ``moe_intermediate_size``):
    DeepSeek-V3 3 · 7168 · 2048 = 44,040,192. Taught in chapter 11."""
    spec = get_model(model)
    return _mlp(spec, spec.expert_intermediate_size)


def _mlp_parts(spec: ModelSpec) -> tuple[int, int]:
    """(MLP parameters of all layers, router parameters of all layers)."""
    L_moe = spec.num_moe_layers
    dense = (spec.num_layers - L_moe) * _mlp(spec)
    if not L_moe:
        return dense, 0
    experts = (spec.num_experts + spec.num_shared_experts) * expert_param_count(spec)
    router = spec.hidden_size * spec.num_experts + (spec.num_experts if spec.router_bias else 0)
    return dense + L_moe * experts, L_moe * router


def _norms_per_layer(spec: ModelSpec) -> int:
    if spec.family == "falcon" and not spec.falcon_new_decoder:
        return _norm(spec)  # one shared LayerNorm before the parallel attention and MLP
    return 2 * _norm(spec)


def param_breakdown(model: str | ModelSpec) -> dict[str, int]:
    """Parameters by part: ``embedding``, ``positions``, ``attention``, ``mlp``, ``router``,
    ``norms``, ``lm_head``; ``total`` is their sum. ``mlp`` counts every expert (routed and
    shared) and the dense layers' MLPs; ``attention`` includes Qwen3's q/k norms and MLA's
    latent norms."""
    spec = get_model(model)
    L, h = spec.num_layers, spec.hidden_size
    mlp, router = _mlp_parts(spec)
    positions = 0
    if spec.positions == "learned":
        # OPT's learned positions keep 2 extra rows (an offset of 2 in the released code)
        positions = (spec.max_positions + (2 if spec.family == "opt" else 0)) * h
    parts = {
        "embedding": spec.vocab_size * h,
        "positions": positions,
        "attention": L * _attention(spec),
        "mlp": mlp,
        "router": router,
        "norms": L * _norms_per_layer(spec) + _norm(spec),  # + the final norm
        "lm_head": 0 if spec.tied_embeddings else spec.vocab_size * h,
    }
    parts["total"] = sum(parts.values())
    return parts


def param_count(model: str | ModelSpec) -> int:
    """Total parameters of ``model`` (every expert of a mixture-of-experts)."""
    return param_breakdown(model)["total"]


def active_param_count(model: str | ModelSpec, include_input_embedding: bool = True) -> int:
    """Parameters used for one token: for mixture-of-experts only ``experts_per_token`` of the
    routed experts count in each MoE layer (shared experts and the router always do):
    ``total - L_moe · (E - k) · expert_params``. Mixtral 8x7B: 2 of 8 -> 12.9 B of 46.7 B.
    Equal to :func:`param_count` for dense models.

    ``include_input_embedding=False`` leaves out the input embedding table (a row lookup, no
    multiply): vendors differ — Mistral's 12.9 B and Qwen3's 3.3 B include it, DeepSeek's
    2.4 B (V2-Lite) and 37 B (V3) fit only without it (see ``published_params``).
    Taught in chapter 11."""
    spec = get_model(model)
    total = param_count(spec)
    unused = spec.num_moe_layers * (spec.num_experts - spec.experts_per_token) \
        * expert_param_count(spec)
    embedding = 0 if include_input_embedding else spec.vocab_size * spec.hidden_size
    return total - unused - embedding


def linear_weight_count(model: str | ModelSpec) -> int:
    """Weights inside the transformer blocks' linear layers (what weight quantization
    quantizes); embeddings, lm_head, norms and biases are not included."""
    spec = get_model(model)
    return sum(rows * cols for rows, cols, count in linear_shapes(spec) for _ in range(count))


def linear_shapes(model: str | ModelSpec) -> list[tuple[int, int, int]]:
    """Every linear weight of the blocks as ``(out_features, in_features, how_many)`` over all
    layers (routers and norms are not linear weights here). Taught in chapters 03 and 11."""
    spec = get_model(model)
    h, L = spec.hidden_size, spec.num_layers
    if spec.is_mla:
        H, dc, rq = spec.num_heads, spec.kv_lora_rank, spec.q_lora_rank
        q_out = H * (spec.qk_nope_head_dim + spec.qk_rope_head_dim)
        q = [(q_out, h, L)] if rq is None else [(rq, h, L), (q_out, rq, L)]
        attn = q + [(dc + spec.qk_rope_head_dim, h, L),
                    (H * (spec.qk_nope_head_dim + spec.v_head_dim), dc, L),
                    (h, H * spec.v_head_dim, L)]
    else:
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        attn = [(q, h, L), (kv, h, 2 * L), (h, q, L)]
    n_up = 2 if spec.mlp == "gated" else 1

    def mlp(width: int, count: int) -> list[tuple[int, int, int]]:
        return [(width, h, n_up * count), (h, width, count)] if count else []
    L_moe = spec.num_moe_layers
    experts = L_moe * (spec.num_experts + spec.num_shared_experts)
    return attn + mlp(spec.intermediate_size, L - L_moe) + mlp(spec.expert_intermediate_size,
                                                               experts)


def expected_experts_touched(model: str | ModelSpec, tokens: int) -> float:
    """Expected number of distinct routed experts one MoE layer runs for ``tokens`` tokens,
    each picking ``k = experts_per_token`` of ``E = num_experts``:
    ``E · (1 - (1 - k/E)^T)`` under uniform, independent routing (an assumption: load-balancing
    losses push routers toward uniform use, but tokens of one text correlate, so real batches
    touch somewhat fewer). One token: exactly k; many tokens: all E. Dense models: 1.
    Mixtral 8x7B, 4 tokens: 8 · (1 - 0.75⁴) = 5.47 experts. Taught in chapter 11."""
    spec = get_model(model)
    positive_int("tokens", tokens)
    E, k = spec.num_experts, spec.experts_per_token
    if E == 1:
        return 1.0
    if tokens == 1:
        return float(k)
    return E * (1 - (1 - k / E) ** tokens)


def mtp_param_count(model: str | ModelSpec) -> int:
    """Parameters of DeepSeek-V3's multi-token-prediction modules, which :func:`param_count`
    leaves out (the published 671 B is the main model): per module one more MoE block (MLA +
    MoE + 2 norms), the ``enorm`` and ``hnorm`` RMSNorms, the ``eh_proj`` projection (2h -> h)
    and the shared head's norm; embedding and output head are shared with the main model
    (DeepSeek-AI, 2024, arXiv:2412.19437, §2.2; README_WEIGHTS.md). 0 for other models.
    DeepSeek-V3: 11,610,068,224, of which the MoE block is 11,507,286,272 (README_WEIGHTS:
    "11.5B unique parameters"); the checkpoint also stores the module's own copies of the
    0.93 B embedding and head, so main model + MTP = 671.03 + 13.46 = 684.5 B of the "685B"
    the README quotes (its 671 and 14 are rounded separately)."""
    spec = get_model(model)
    if not spec.mtp_layers:
        return 0
    h = spec.hidden_size
    block = _attention(spec) + 2 * _norm(spec) + \
        (spec.num_experts + spec.num_shared_experts) * expert_param_count(spec) + \
        h * spec.num_experts + (spec.num_experts if spec.router_bias else 0)
    return spec.mtp_layers * (block + 2 * _norm(spec) + 2 * h * h + _norm(spec))
