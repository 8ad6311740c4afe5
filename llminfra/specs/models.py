"""Model architecture presets, as data, each with its source.

The fields come from each release's ``config.json`` (transcribed with sources in
``model_architectures.json`` beside this file). Everything derived from them — parameter counts,
bytes, KV sizes — is computed in :mod:`llminfra.calc.memory`, never typed in.

Taught in chapter 02 (``notebooks/02_gpu_memory.ipynb``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal

from llminfra.validate import non_negative_int, positive_int

_DATA = Path(__file__).with_name("model_architectures.json")

#: preset name -> key of the release in model_architectures.json
_RELEASES = {
    "llama-7b": "LLaMA-7B (v1)",
    "llama-13b": "LLaMA-13B (v1)",
    "llama-33b": "LLaMA-33B (v1, 'llama-30b')",
    "llama-65b": "LLaMA-65B (v1)",
    "llama-2-7b": "Llama-2-7b",
    "llama-2-13b": "Llama-2-13b",
    "llama-2-70b": "Llama-2-70b",
    "llama-3-8b": "Llama-3-8B",
    "llama-3-70b": "Llama-3-70B",
    "mistral-7b": "Mistral-7B-v0.1",
    "mixtral-8x7b": "Mixtral-8x7B-v0.1",
    "mixtral-8x22b": "Mixtral-8x22B-v0.1",
    "falcon-7b": "Falcon-7b",
    "falcon-40b": "Falcon-40b",
    "starcoder": "StarCoder (bigcode/starcoder; octocoder has the same architecture)",
    "gpt2": "GPT-2 (gpt2)",
    "gpt2-medium": "GPT-2 (gpt2-medium)",
    "gpt2-large": "GPT-2 (gpt2-large)",
    "gpt2-xl": "GPT-2 (gpt2-xl)",
    "opt-13b": "OPT-13B",
    "qwen2.5-7b": "Qwen2.5-7B",
    "megatron-8.3b": "Megatron-LM 8.3B (GPT-2-style, paper Table 1)",
    "smollm2-135m": "SmolLM2-135M-Instruct",
    "qwen3-30b-a3b": "Qwen3-30B-A3B",
    "deepseek-llm-67b": "DeepSeek-LLM-67B",
    "deepseek-v2-lite": "DeepSeek-V2-Lite",
    "deepseek-v2": "DeepSeek-V2",
    "deepseek-v3": "DeepSeek-V3",
}

#: other names that mean the same architecture
ALIASES = {"octocoder": "starcoder", "llama-30b": "llama-33b"}


@dataclass(frozen=True)
class ModelSpec:
    """The architecture of one decoder-only transformer, enough to count every parameter.

    ``family`` decides the block layout (see :func:`llminfra.calc.memory.param_count`):

    * ``llama`` — RMSNorm, rotary positions, gated SiLU MLP (SwiGLU), no biases
      (Qwen2 adds biases on q, k, v: ``qkv_bias``); Mistral and Mixtral are this family too;
    * ``gpt2`` — LayerNorm, learned positions, plain GELU MLP, biases everywhere, tied embeddings;
    * ``opt`` — like GPT-2 with separate q/k/v projections and 2 extra position rows;
    * ``falcon`` — fused multi-/grouped-query QKV, parallel attention and MLP, LayerNorm;
    * ``gpt_bigcode`` — GPT-2 with multi-query attention (StarCoder);
    * ``deepseek`` — DeepSeek-V2/V3: multi-head latent attention and DeepSeekMoE (below).

    Optional fields, each defaulting to "absent" so the older presets are unchanged:

    * mixture-of-experts: ``num_experts`` routed experts of ``moe_intermediate_size`` (``None``:
      ``intermediate_size``, as Mixtral), ``experts_per_token`` of them per token, plus
      ``num_shared_experts`` always-on ones; the first ``first_dense_layers`` layers keep a
      dense MLP of ``intermediate_size`` (DeepSeek ``first_k_dense_replace``); ``router_bias``:
      the gate's ``e_score_correction_bias`` (DeepSeek-V3, ``topk_method = noaux_tc``);
    * ``explicit_head_dim``: a config's own ``head_dim`` when ``heads · head_dim != hidden``
      (Qwen3); ``qk_norm``: RMSNorm weights on q and k per head (Qwen3);
    * multi-head latent attention (DeepSeek-AI, 2024, arXiv:2405.04434, §2.1): ``kv_lora_rank``
      (d_c), ``q_lora_rank`` (d_c', ``None`` = a plain q projection, as V2-Lite),
      ``qk_nope_head_dim`` (d_h), ``qk_rope_head_dim`` (d_h^R), ``v_head_dim``;
    * ``sliding_window``: each token attends to at most this many keys (Mistral-7B: 4096;
      Jiang et al., 2023, arXiv:2310.06825, §2);
    * ``mtp_layers``: DeepSeek-V3's multi-token-prediction modules (``num_nextn_predict_layers``),
      recorded but NOT counted in the parameters (DeepSeek-V3's 671B excludes them).

    Taught in chapters 02 and 11.
    """

    name: str
    display_name: str
    family: Literal["llama", "gpt2", "opt", "falcon", "gpt_bigcode", "deepseek"]
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_positions: int | None
    mlp: Literal["gated", "plain"]
    positions: Literal["rotary", "learned"]
    norm: Literal["rmsnorm", "layernorm"]
    tied_embeddings: bool
    qkv_bias: bool = False
    linear_bias: bool = False
    num_experts: int = 1
    experts_per_token: int = 1
    parallel_attn: bool = False
    falcon_new_decoder: bool = False
    moe_intermediate_size: int | None = None
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    router_bias: bool = False
    explicit_head_dim: int | None = None
    qk_norm: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int | None = None
    mtp_layers: int = 0
    hf_id: str | None = None
    nominal_size: str = ""
    sources: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self):
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "vocab_size", "num_experts", "experts_per_token"):
            positive_int(name, getattr(self, name), where=f"{self.name}: ")
        for name in ("max_positions", "moe_intermediate_size", "explicit_head_dim",
                     "q_lora_rank", "kv_lora_rank", "sliding_window"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{self.name}: {name} must be a positive integer or None, "
                                 f"got {value!r}")
        for name in ("num_shared_experts", "first_dense_layers", "qk_nope_head_dim",
                     "qk_rope_head_dim", "v_head_dim", "mtp_layers"):
            non_negative_int(name, getattr(self, name), where=f"{self.name}: ")
        if self.first_dense_layers > self.num_layers:
            raise ValueError(f"{self.name}: first_dense_layers {self.first_dense_layers} exceeds "
                             f"num_layers {self.num_layers}")
        if self.kv_lora_rank is not None and not (self.qk_nope_head_dim + self.qk_rope_head_dim
                                                  and self.v_head_dim):
            raise ValueError(f"{self.name}: multi-head latent attention (kv_lora_rank set) needs "
                             f"qk_nope_head_dim + qk_rope_head_dim >= 1 and v_head_dim >= 1")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"{self.name}: experts_per_token {self.experts_per_token} exceeds "
                             f"num_experts {self.num_experts}")
        if self.explicit_head_dim is None and not self.is_mla and self.hidden_size % self.num_heads:
            raise ValueError(f"{self.name}: hidden_size {self.hidden_size} is not divisible "
                             f"by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")

    @property
    def head_dim(self) -> int:
        """Width of one query/key head: ``explicit_head_dim`` if the config gives one, for
        multi-head latent attention ``qk_nope_head_dim + qk_rope_head_dim``, else
        ``hidden_size // num_heads``."""
        if self.explicit_head_dim is not None:
            return self.explicit_head_dim
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.hidden_size // self.num_heads

    @property
    def value_head_dim(self) -> int:
        """Width of one value head: ``v_head_dim`` under latent attention, else ``head_dim``."""
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: the cache holds a compressed latent, not K and V."""
        return self.kv_lora_rank is not None

    @property
    def attention(self) -> Literal["MHA", "GQA", "MQA", "MLA"]:
        """Multi-head (K/V heads = Q heads), multi-query (one K/V head), grouped-query, or
        multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, §2.1)."""
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def expert_intermediate_size(self) -> int:
        """Intermediate width of one routed expert (``intermediate_size`` when unset)."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(head_dim=self.head_dim, attention=self.attention)
        return d


def _window(c: dict) -> int | None:
    """The config's sliding window, if the model uses one (Qwen2 lists a window it does not
    use: ``use_sliding_window: false``)."""
    if c.get("use_sliding_window") is False:
        return None
    return c.get("sliding_window") or None


def _llama_like(c: dict, common: dict) -> ModelSpec:
    """Llama, Mistral, Mixtral, Qwen2 and Qwen3-MoE configs (RMSNorm, RoPE, SwiGLU)."""
    t = c["model_type"]
    if t == "qwen3_moe" and (c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1):
        raise ValueError(f"{common['display_name']}: only Qwen3-MoE configs with every layer "
                         f"sparse are modelled (mlp_only_layers [] and decoder_sparse_step 1)")
    experts = c.get("num_local_experts") or c.get("num_experts") or 1
    return ModelSpec(family="llama", hidden_size=c["hidden_size"],
                     num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                     num_kv_heads=c["num_key_value_heads"],
                     intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"],
                     max_positions=c["max_position_embeddings"], mlp="gated",
                     positions="rotary", norm="rmsnorm", qkv_bias=(t == "qwen2"),
                     num_experts=experts, experts_per_token=c.get("num_experts_per_tok", 1),
                     moe_intermediate_size=c.get("moe_intermediate_size"),
                     explicit_head_dim=c.get("head_dim"), qk_norm=(t == "qwen3_moe"),
                     sliding_window=_window(c), **common)


def _deepseek(c: dict, common: dict) -> ModelSpec:
    """DeepSeek-V2 / V3 configs: multi-head latent attention and DeepSeekMoE (shared experts,
    the first ``first_k_dense_replace`` layers dense)."""
    if c.get("moe_layer_freq", 1) != 1:
        raise ValueError(f"{common['display_name']}: only moe_layer_freq 1 is modelled")
    return ModelSpec(family="deepseek", hidden_size=c["hidden_size"],
                     num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                     num_kv_heads=c["num_key_value_heads"],
                     intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"],
                     max_positions=c["max_position_embeddings"], mlp="gated",
                     positions="rotary", norm="rmsnorm", num_experts=c["n_routed_experts"],
                     experts_per_token=c["num_experts_per_tok"],
                     moe_intermediate_size=c["moe_intermediate_size"],
                     num_shared_experts=c.get("n_shared_experts") or 0,
                     first_dense_layers=c["first_k_dense_replace"],
                     router_bias=(c.get("topk_method") == "noaux_tc"),
                     q_lora_rank=c.get("q_lora_rank"), kv_lora_rank=c["kv_lora_rank"],
                     qk_nope_head_dim=c["qk_nope_head_dim"],
                     qk_rope_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"],
                     mtp_layers=c.get("num_nextn_predict_layers", 0), **common)


def _from_release(name: str, release: str, entry: dict) -> ModelSpec:
    c = entry["config"]
    t = c["model_type"]
    common = dict(name=name, display_name=release, hf_id=entry.get("hf_id"),
                  nominal_size=entry.get("nominal_size", ""),
                  sources=tuple(entry.get("config_sources", ())),
                  tied_embeddings=bool(c.get("tie_word_embeddings", False)))
    if t in ("llama", "mistral", "mixtral", "qwen2", "qwen3_moe"):
        return _llama_like(c, common)
    if t in ("deepseek_v2", "deepseek_v3"):
        return _deepseek(c, common)
    if t == "gpt2":
        h = c["n_embd"]
        return ModelSpec(family="gpt2", hidden_size=h, num_layers=c["n_layer"],
                         num_heads=c["n_head"], num_kv_heads=c["n_head"],
                         intermediate_size=c.get("n_inner") or 4 * h, vocab_size=c["vocab_size"],
                         max_positions=c["n_positions"], mlp="plain", positions="learned",
                         norm="layernorm", qkv_bias=True, linear_bias=True, **common)
    if t == "gpt_bigcode":
        h = c["n_embd"]
        return ModelSpec(family="gpt_bigcode", hidden_size=h, num_layers=c["n_layer"],
                         num_heads=c["n_head"], num_kv_heads=1 if c["multi_query"] else c["n_head"],
                         intermediate_size=c.get("n_inner") or 4 * h, vocab_size=c["vocab_size"],
                         max_positions=c["n_positions"], mlp="plain", positions="learned",
                         norm="layernorm", qkv_bias=True, linear_bias=True, **common)
    if t == "opt":
        return ModelSpec(family="opt", hidden_size=c["hidden_size"],
                         num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                         num_kv_heads=c["num_attention_heads"], intermediate_size=c["ffn_dim"],
                         vocab_size=c["vocab_size"], max_positions=c["max_position_embeddings"],
                         mlp="plain", positions="learned", norm="layernorm",
                         qkv_bias=c["enable_bias"], linear_bias=c["enable_bias"], **common)
    if t == "falcon":
        h = c["hidden_size"]
        kv = c.get("num_kv_heads") or 1
        if c.get("multi_query") and not c.get("new_decoder_architecture"):
            kv = 1
        return ModelSpec(family="falcon", hidden_size=h, num_layers=c["num_hidden_layers"],
                         num_heads=c["num_attention_heads"], num_kv_heads=kv,
                         intermediate_size=4 * h, vocab_size=c["vocab_size"], max_positions=None,
                         mlp="plain", positions="rotary", norm="layernorm",
                         qkv_bias=c["bias"], linear_bias=c["bias"],
                         parallel_attn=c["parallel_attn"],
                         falcon_new_decoder=c["new_decoder_architecture"], **common)
    raise ValueError(f"no layout known for model_type {t!r} ({release})")


@lru_cache(maxsize=1)
def _presets() -> dict[str, ModelSpec]:
    releases = json.loads(_DATA.read_text())["models"]
    return {name: _from_release(name, rel, releases[rel]) for name, rel in _RELEASES.items()}


def published_params(name: str | ModelSpec) -> dict | None:
    """What the release itself publishes about its size, with the source: ``total`` and
    ``active`` (e.g. ``"671B"``, ``"37B"``), ``rounding`` (``"nearest"``, or ``"truncated"``
    where only truncation fits the exact count), ``active_counts_input_embedding``, ``source``;
    ``None`` for presets without such a row (the mixture-of-experts presets have one).
    Taught in chapter 11."""
    spec = get_model(name)
    releases = json.loads(_DATA.read_text())["models"]
    row = releases[_RELEASES[spec.name]].get("published_params") if spec.name in _RELEASES \
        else None
    return dict(row) if row else None


def model_names() -> list[str]:
    """All preset names (aliases not included)."""
    return list(_RELEASES)


def get_model(name: str | ModelSpec) -> ModelSpec:
    """The preset called ``name`` (case-insensitive; aliases such as ``octocoder`` accepted).

    Raises ``KeyError`` naming the bad value and listing the presets.
    """
    if isinstance(name, ModelSpec):
        return name
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    presets = _presets()
    if key not in presets:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(presets)} "
                       f"(aliases: {', '.join(ALIASES)})")
    return presets[key]
