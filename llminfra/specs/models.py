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
    * ``gpt_bigcode`` — GPT-2 with multi-query attention (StarCoder).
    """

    name: str
    display_name: str
    family: Literal["llama", "gpt2", "opt", "falcon", "gpt_bigcode"]
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
    hf_id: str | None = None
    nominal_size: str = ""
    sources: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self):
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "vocab_size", "num_experts", "experts_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{self.name}: {name} must be a positive integer, got {value!r}")
        mp = self.max_positions
        if mp is not None and (isinstance(mp, bool) or not isinstance(mp, int) or mp < 1):
            raise ValueError(f"{self.name}: max_positions must be a positive integer or None, "
                             f"got {mp!r}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"{self.name}: experts_per_token {self.experts_per_token} exceeds "
                             f"num_experts {self.num_experts}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"{self.name}: hidden_size {self.hidden_size} is not divisible "
                             f"by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def attention(self) -> Literal["MHA", "GQA", "MQA"]:
        """Multi-head (K/V heads = Q heads), multi-query (one K/V head) or grouped-query."""
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(head_dim=self.head_dim, attention=self.attention)
        return d


def _from_release(name: str, release: str, entry: dict) -> ModelSpec:
    c = entry["config"]
    t = c["model_type"]
    common = dict(name=name, display_name=release, hf_id=entry.get("hf_id"),
                  nominal_size=entry.get("nominal_size", ""),
                  sources=tuple(entry.get("config_sources", ())),
                  tied_embeddings=bool(c.get("tie_word_embeddings", False)))
    if t in ("llama", "mistral", "mixtral", "qwen2"):
        return ModelSpec(family="llama", hidden_size=c["hidden_size"],
                         num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                         num_kv_heads=c["num_key_value_heads"],
                         intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"],
                         max_positions=c["max_position_embeddings"], mlp="gated",
                         positions="rotary", norm="rmsnorm", qkv_bias=(t == "qwen2"),
                         num_experts=c.get("num_local_experts", 1),
                         experts_per_token=c.get("num_experts_per_tok", 1), **common)
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
