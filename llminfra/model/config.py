"""Shape of the tiny Llama-style decoder: :class:`ModelConfig` and its named presets.

A config is a frozen dataclass, validated in ``__post_init__`` (nano-vllm's habit) and built by
name with :meth:`ModelConfig.from_name` (gpt-fast's ``ModelArgs.from_name``). The architecture
is the one of Llama (Touvron et al. 2023, arXiv:2302.13971): RMSNorm, rotary positions,
grouped-query attention and a SwiGLU MLP, no biases, untied input and output embeddings.

:meth:`ModelConfig.to_spec` turns it into a :class:`llminfra.specs.ModelSpec`, so the closed-form
calculators of :mod:`llminfra.calc` (parameter counts, KV bytes, memory) apply to the very model
that the notebooks run, and a test checks ``param_count(spec) == model numel``.

Taught in chapter 01 (``notebooks/01_training_vs_inference.ipynb``) and used by every chapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from llminfra.specs.models import ModelSpec
from llminfra.validate import positive_int

#: Byte-level vocabulary: one id per byte value, no special tokens.
BYTE_VOCAB_SIZE = 256


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of :class:`llminfra.model.Transformer`.

    Fields (Llama naming, Touvron et al. 2023, arXiv:2302.13971, Table 2):

    * ``vocab_size`` V — number of token ids (256 for the byte tokenizer);
    * ``dim`` h — hidden size; ``head_dim`` d = dim // n_heads, derived once in
      ``__post_init__`` (a field, not a property: every step of the engine reads it);
    * ``n_layers`` L, ``n_heads`` H (query heads), ``n_kv_heads`` H_kv (key/value heads,
      H_kv divides H: grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245);
    * ``ffn_dim`` I — inner size of the SwiGLU MLP (Shazeer 2020, arXiv:2002.05202);
    * ``max_seq_len`` — longest sequence the model is used on (rotary tables are this long);
    * ``rope_theta`` — rotary base θ (Su et al. 2021, arXiv:2104.09864, eq. 15: θ_i =
      base^(-2i/d));
    * ``norm_eps`` — ε of RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467, eq. 4);
    * ``tie_embeddings`` — the output projection reuses the token embedding (SmolLM2, Qwen2-0.5B);
    * ``qkv_bias`` — q, k, v projections carry a bias (Qwen2);
    * ``rope_scaling`` — ``None``, or sorted ``(key, value)`` pairs of a Hugging Face
      ``rope_scaling`` dict of type ``"linear"`` or ``"llama3"`` (see
      :func:`llminfra.model.rope.rope_inv_freq`);
    * ``num_experts`` E, ``experts_per_token`` k, ``moe_gating`` (``"softmax"`` or
      ``"sigmoid"``) — with E > 1 every block's MLP is a mixture of E SwiGLU experts of inner
      size I, k per token (:class:`llminfra.model.moe.MoEFeedForward`, chapter 11); E = 1 is
      the dense model.

    Parameters (no biases, untied embeddings, RMSNorm weights only)::

        2·V·h + L·(2·h² + 2·h·H_kv·head_dim + 3·h·I + 2·h) + h

    ``tiny``: V = 256, h = 256, L = 4, H = 8, H_kv = 4, I = 688 ->
    131,072 + 4·(131,072 + 65,536 + 528,384 + 512) + 256 = 3,033,344.
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False
    rope_scaling: tuple | None = None
    num_experts: int = 1
    experts_per_token: int = 1
    moe_gating: str = "softmax"
    #: d = dim / n_heads, the size of one query/key/value head (set by ``__post_init__``)
    head_dim: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                     "max_seq_len", "num_experts", "experts_per_token"):
            positive_int(name, getattr(self, name), where="ModelConfig.")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads "
                             f"{self.n_kv_heads} (grouped-query attention needs H_kv | H)")
        object.__setattr__(self, "head_dim", self.dim // self.n_heads)  # frozen: set once
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary "
                             f"positions (dim {self.dim}, n_heads {self.n_heads})")
        if isinstance(self.rope_scaling, dict):  # a config.json / checkpoint dict: freeze it
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        if self.rope_scaling is not None:
            kind = dict(self.rope_scaling).get("rope_type")
            if kind not in ("linear", "llama3"):
                raise ValueError(f"rope_scaling type {kind!r} is not supported; allowed: "
                                 f"'linear', 'llama3' (or None)")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token {self.experts_per_token} exceeds num_experts "
                             f"{self.num_experts} (a token picks k of the E experts)")
        if self.moe_gating not in ("softmax", "sigmoid"):
            raise ValueError(f"moe_gating {self.moe_gating!r} is not supported; allowed: "
                             f"'softmax', 'sigmoid'")
        if not self.rope_theta > 0 or not self.norm_eps > 0:
            raise ValueError(f"rope_theta ({self.rope_theta}) and norm_eps ({self.norm_eps}) "
                             f"must be > 0")

    @classmethod
    def from_name(cls, name: str) -> "ModelConfig":
        """The preset called ``name``: ``"tiny"`` or ``"bench-100m"``.

        * ``tiny`` — 3.03 M parameters, byte vocabulary, 256-byte context; trained on the
          shipped corpus by ``python -m llminfra.model.train`` and loaded by
          :func:`llminfra.model.load_tiny`.
        * ``bench-100m`` — 101 M parameters (h = 768, L = 16, H = 12, H_kv = 4, I = 2048,
          byte vocabulary, 2048 context): random weights for timing; 404 MB in float32,
          far larger than any CPU cache, so decode is memory-bound as on a real model.

        Raises ``KeyError`` naming the bad value and the presets.
        """
        key = str(name).strip().lower()
        presets = _presets()
        if key not in presets:
            raise KeyError(f"unknown model config {name!r}; presets: {', '.join(presets)}")
        return presets[key]

    def to_spec(self, name: str = "llminfra-custom") -> ModelSpec:
        """This architecture as a :class:`llminfra.specs.ModelSpec` (``family="llama"``, gated
        MLP, rotary, RMSNorm, embeddings and q/k/v biases as configured), so that
        ``llminfra.calc.params.param_count(config.to_spec())`` equals the number of
        parameters of ``Transformer(config)``."""
        return ModelSpec(name=name, display_name=f"llminfra {name}", family="llama",
                         hidden_size=self.dim, num_layers=self.n_layers, num_heads=self.n_heads,
                         num_kv_heads=self.n_kv_heads, intermediate_size=self.ffn_dim,
                         vocab_size=self.vocab_size, max_positions=self.max_seq_len,
                         mlp="gated", positions="rotary", norm="rmsnorm",
                         tied_embeddings=self.tie_embeddings, qkv_bias=self.qkv_bias,
                         linear_bias=False, num_experts=self.num_experts,
                         experts_per_token=self.experts_per_token,
                         sources=("llminfra.model.config",))

    def to_dict(self) -> dict:
        """Plain dict of the fields (stored inside checkpoints); a dense model (E = 1) leaves the
        mixture-of-experts fields out, so its dict is what it always was."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        if self.num_experts == 1:
            for key in ("num_experts", "experts_per_token", "moe_gating"):
                d.pop(key)
        if d["rope_scaling"] is not None:
            d["rope_scaling"] = dict(d["rope_scaling"])
        return d


def _presets() -> dict[str, ModelConfig]:
    """Preset name -> config (built on each call: no module-level mutable state)."""
    return {
        "tiny": ModelConfig(vocab_size=BYTE_VOCAB_SIZE, dim=256, n_layers=4, n_heads=8,
                            n_kv_heads=4, ffn_dim=688, max_seq_len=256),
        "bench-100m": ModelConfig(vocab_size=BYTE_VOCAB_SIZE, dim=768, n_layers=16, n_heads=12,
                                  n_kv_heads=4, ffn_dim=2048, max_seq_len=2048),
    }


def config_names() -> list[str]:
    """Names accepted by :meth:`ModelConfig.from_name`."""
    return list(_presets())
