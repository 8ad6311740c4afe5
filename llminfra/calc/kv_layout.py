"""What the KV cache holds per token, per sequence and per GPU, for each attention variant.

The rules that :mod:`llminfra.calc.memory` (``kv_bytes_per_token``, ``kv_bytes``, ``kv_budget``)
and :mod:`llminfra.calc.roofline` build on:

* multi-head / grouped-query / multi-query attention cache K and V of every KV head:
  ``2 · H_kv · d_h`` elements per token and layer (Shazeer, 2019, arXiv:1911.02150;
  Ainslie et al., 2023, arXiv:2305.13245);
* multi-head latent attention caches one compressed latent c_KV (``kv_lora_rank`` = d_c) and
  the decoupled RoPE key k^R (``qk_rope_head_dim`` = d_h^R), shared by all heads:
  ``d_c + d_h^R`` elements per token and layer (DeepSeek-AI, 2024, DeepSeek-V2,
  arXiv:2405.04434, §2.1.2-2.1.3 and Table 1: "(d_c + d_h^R) · l", 4.5 · d_h · l for V2);
* sliding-window attention (Mistral-7B, Jiang et al., 2023, arXiv:2310.06825, §2, "rolling
  buffer cache"): each layer needs the keys and values of the last ``W`` tokens only, so a
  sequence holds ``min(context, W)`` tokens per layer — when the cache evicts what falls out
  of the window; a cache that keeps every token (``sliding_window=False``) holds ``context``;
* quantized KV (fp8 / int8 / int4): ``bytes(kv_dtype)`` per element plus, when
  ``kv_group_size`` is given, one 2-byte (fp16) scale per group of that many elements of one
  token (KIVI-style per-token groups, Liu et al., 2024, arXiv:2402.02750). ``None`` means
  per-tensor scales (vLLM's fp8 KV cache keeps one ``k_scale`` and one ``v_scale`` per layer),
  a constant that does not grow with the tokens and is not counted.

Taught in chapters 02 and 11.
"""

from __future__ import annotations

from fractions import Fraction

from llminfra.specs.formats import dtype_bytes
from llminfra.specs.models import ModelSpec

#: KV dtypes that may carry per-group scales (16/32-bit caches need none)
QUANTIZED_KV = ("fp8", "fp8-e4m3", "fp8-e5m2", "int8", "int4", "nf4")
#: bytes of one scale (fp16)
SCALE_BYTES = 2


def kv_elements_per_token_layer(spec: ModelSpec) -> int:
    """Cached elements of one token in one layer: ``2 · H_kv · d_h`` (K and V), or for
    multi-head latent attention ``d_c + d_h^R`` (the latent and the shared RoPE key).

    Llama-2-7B: 2 · 32 · 128 = 8192; DeepSeek-V3: 512 + 64 = 576.
    """
    if spec.is_mla:
        return spec.kv_lora_rank + spec.qk_rope_head_dim
    return 2 * spec.num_kv_heads * spec.head_dim


def kv_scale_bytes_per_token_layer(spec: ModelSpec, kv_dtype: str,
                                   kv_group_size: int | None) -> int:
    """Bytes of quantization scales of one token in one layer: ``None`` -> 0 (per-tensor
    scales); else one fp16 scale per group of ``kv_group_size`` elements of each cached
    vector (each K / V head vector, or the latent and the RoPE key, grouped separately).
    ``ValueError`` for groups on a 16/32-bit cache or a group size that is not positive."""
    if kv_group_size is None:
        return 0
    if isinstance(kv_group_size, bool) or not isinstance(kv_group_size, int) or kv_group_size < 1:
        raise ValueError(f"kv_group_size must be a positive integer or None, got {kv_group_size!r}")
    key = str(kv_dtype).strip().lower()
    if key not in QUANTIZED_KV:
        raise ValueError(f"kv_group_size applies to quantized KV caches ({', '.join(QUANTIZED_KV)})"
                         f", not {kv_dtype!r}")
    if spec.is_mla:
        vectors = [spec.kv_lora_rank, spec.qk_rope_head_dim]
    else:
        vectors = [spec.head_dim] * (2 * spec.num_kv_heads)
    return SCALE_BYTES * sum(-(-n // kv_group_size) for n in vectors if n)


def kv_bytes_per_token_layer(spec: ModelSpec, kv_dtype: str = "bf16",
                             kv_group_size: int | None = None) -> int:
    """Bytes of one token in one layer: elements · ``bytes(kv_dtype)`` (rounded up to whole
    bytes for 4-bit) plus the scales of :func:`kv_scale_bytes_per_token_layer`."""
    data = Fraction(kv_elements_per_token_layer(spec)) * Fraction(dtype_bytes(kv_dtype))
    return -(-data.numerator // data.denominator) + \
        kv_scale_bytes_per_token_layer(spec, kv_dtype, kv_group_size)


def kv_tokens_held(spec: ModelSpec, context: int, sliding_window: bool = False) -> int:
    """Tokens one sequence keeps in each layer's cache: ``min(context, W)`` when
    ``sliding_window`` is True and the model has a window ``W``, else ``context``.
    Mistral-7B at 32,768 tokens: 4,096 with the rolling buffer, 32,768 without."""
    if sliding_window and spec.sliding_window is not None:
        return min(context, spec.sliding_window)
    return context


def kv_share_per_rank(spec: ModelSpec, num_gpus: int) -> Fraction:
    """Share of one token's KV bytes that EACH of ``num_gpus`` tensor-parallel ranks stores:
    ``ceil(H_kv / n) / H_kv`` for K/V heads (split; a whole head each when there are fewer
    heads than ranks, which vLLM replicates), and 1 for multi-head latent attention (the
    latent is shared by all heads, so every rank keeps all of it)."""
    if spec.is_mla:
        return Fraction(1)
    return Fraction(-(-spec.num_kv_heads // num_gpus), spec.num_kv_heads)
