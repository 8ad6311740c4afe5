"""The KV cache at long context: latent attention, sliding windows and quantized caches compared,
and DeepSeek-V2's "KV cache reduced by 93.3 %" claim recomputed.

Every number comes from :func:`llminfra.calc.memory.kv_bytes_per_token` / ``kv_bytes`` on the
presets' config fields (rules in :mod:`llminfra.calc.kv_layout`); the functions return lists
of dicts (units in the keys) that a notebook turns into a table.

The claim (DeepSeek-AI, 2024, "DeepSeek-V2", arXiv:2405.04434, abstract and Figure 1(b)):
"Compared with DeepSeek 67B, DeepSeek-V2 ... reduces the KV cache by 93.3%". Per token, the
dense 67B (95 layers, 8 KV heads of 128, GQA; arXiv:2401.02954, Table 2) caches
2 · 95 · 8 · 128 = 194,560 elements; DeepSeek-V2 (60 layers, d_c = 512, d_h^R = 64) caches
60 · 576 = 34,560. In one dtype that is 82.2 % less. §3.2.3 says how the deployed V2 was served:
"we also perform KV cache quantization ... to further compress each element in its KV cache
into 6 bits on average": 34,560 · 6 bits = 25,920 bytes against the 67B's 389,120 in 16 bits
is 93.34 % less — the claim holds for that comparison (MLA and a 6-bit cache against a 16-bit
one), not for MLA alone.

Taught in chapter 11.
"""

from __future__ import annotations

from fractions import Fraction

from llminfra.calc.kv_layout import kv_elements_per_token_layer
from llminfra.calc.memory import kv_bytes, kv_bytes_per_token
from llminfra.specs.models import ModelSpec, get_model

#: DeepSeek-V2's claim as published, with what the recomputation needs
MLA_KV_CLAIM = {
    "claim": "DeepSeek-V2 reduces the KV cache by 93.3% compared with DeepSeek 67B",
    "claimed_reduction": 0.933,
    "model": "deepseek-v2",
    "baseline": "deepseek-llm-67b",
    "source": "DeepSeek-AI, 2024, arXiv:2405.04434, abstract and Figure 1(b) (KV cache for "
              "generation, KB/token); §3.2.3: deployed V2 has FP8 weights and a KV cache "
              "quantized to '6 bits on average' per element",
}

#: (label, bits per cached element of DeepSeek-V2, bits of DeepSeek 67B) compared
CLAIM_CASES = (
    ("same dtype: both bf16", 16, 16),
    ("same dtype: both fp8", 8, 8),
    ("V2 fp8 cache, 67B bf16", 8, 16),
    ("V2 6-bit cache (§3.2.3), 67B bf16", 6, 16),
)


def _elements_per_token(spec: ModelSpec) -> int:
    return spec.num_layers * kv_elements_per_token_layer(spec)


def mla_kv_claim_check() -> dict:
    """DeepSeek-V2's "93.3 % less KV cache than DeepSeek 67B", recomputed for each dtype
    assumption of :data:`CLAIM_CASES`.

    Returns ``claim``, ``claimed_reduction``, ``source``, ``model_elements_per_token`` (34,560),
    ``baseline_elements_per_token`` (194,560), ``rows`` (one per case: ``case``,
    ``model_bits_per_element``, ``baseline_bits_per_element``, ``model_bytes_per_token``,
    ``baseline_bytes_per_token``, ``reduction``, ``matches_claim`` — the reduction rounds to the
    claimed 93.3 %) and ``verdict`` (a sentence).
    """
    model, base = get_model(MLA_KV_CLAIM["model"]), get_model(MLA_KV_CLAIM["baseline"])
    n_model, n_base = _elements_per_token(model), _elements_per_token(base)
    claimed = MLA_KV_CLAIM["claimed_reduction"]
    rows = []
    for case, bits_model, bits_base in CLAIM_CASES:
        b_model, b_base = Fraction(n_model * bits_model, 8), Fraction(n_base * bits_base, 8)
        reduction = float(1 - b_model / b_base)
        rows.append({"case": case, "model_bits_per_element": bits_model,
                     "baseline_bits_per_element": bits_base,
                     "model_bytes_per_token": float(b_model),
                     "baseline_bytes_per_token": float(b_base), "reduction": reduction,
                     "matches_claim": round(reduction, 3) == claimed})
    same = rows[0]["reduction"]
    fits = [r["case"] for r in rows if r["matches_claim"]]
    verdict = (f"MLA alone (same dtype) cuts the KV cache by {same:.1%}, not 93.3%; the claim "
               f"is reproduced only by: {'; '.join(fits) or 'no case'}")
    return {**MLA_KV_CLAIM, "model_elements_per_token": n_model,
            "baseline_elements_per_token": n_base, "rows": rows, "verdict": verdict}


def sliding_window_table(model: str | ModelSpec = "mistral-7b",
                         contexts=(1024, 4096, 8192, 32768), kv_dtype: str = "bf16") -> list[dict]:
    """KV cache of one sequence with every token kept (full attention) and with a rolling
    buffer of the model's window ``W`` (Jiang et al., 2023, arXiv:2310.06825, §2), per context:
    ``context_tokens``, ``window_tokens``, ``full_attention_kv_bytes``, ``windowed_kv_bytes``,
    ``ratio`` (full / windowed). Mistral-7B (W = 4096) at 32,768 tokens: 4.29 GB vs 0.537 GB,
    8x. ``ValueError`` for a model without a window."""
    spec = get_model(model)
    if spec.sliding_window is None:
        raise ValueError(f"{spec.name} has no sliding window; presets with one: mistral-7b")
    rows = []
    for c in contexts:
        full, windowed = kv_bytes(spec, c, 1, kv_dtype), kv_bytes(spec, c, 1, kv_dtype, True)
        rows.append({"context_tokens": c, "window_tokens": spec.sliding_window,
                     "full_attention_kv_bytes": full, "windowed_kv_bytes": windowed,
                     "ratio": full / windowed})
    return rows


def kv_dtype_table(model: str | ModelSpec, context: int,
                   kv_dtypes=("bf16", "fp8", "int8", "int4"),
                   kv_group_size: int | None = None) -> list[dict]:
    """One sequence's KV cache at ``context`` tokens in each KV dtype: ``kv_dtype``,
    ``kv_bytes_per_token``, ``kv_bytes``, ``vs_bf16`` (share of the bf16 cache). Quantized
    dtypes add one fp16 scale per ``kv_group_size`` elements when it is given (16-bit rows
    never carry scales); ``None`` models per-tensor scales (vLLM's fp8 cache), not counted."""
    spec = get_model(model)
    base = kv_bytes(spec, context, 1, "bf16")
    rows = []
    for d in kv_dtypes:
        group = kv_group_size if str(d).strip().lower() not in ("bf16", "fp16", "fp32") else None
        n = kv_bytes(spec, context, 1, d, kv_group_size=group)
        rows.append({"kv_dtype": d, "kv_bytes_per_token": kv_bytes_per_token(spec, d, group),
                     "kv_bytes": n, "vs_bf16": n / base})
    return rows


def attention_kv_table(models=("llama-3-70b", "deepseek-llm-67b", "mistral-7b", "qwen3-30b-a3b",
                               "deepseek-v2", "deepseek-v3"),
                       context: int = 32768, kv_dtype: str = "bf16") -> list[dict]:
    """Per model: ``model``, ``attention`` (MHA / GQA / MQA / MLA), ``sliding_window``,
    ``kv_elements_per_token``, ``kv_bytes_per_token``, ``kv_bytes_full`` (one sequence of
    ``context`` tokens, every token kept) and ``kv_bytes_windowed`` (with the window, if any).
    Contexts beyond a model's own maximum are clipped to it (``context_tokens`` says which)."""
    rows = []
    for name in models:
        spec = get_model(name)
        c = min(context, spec.max_positions or context)
        rows.append({"model": spec.name, "attention": spec.attention,
                     "sliding_window": spec.sliding_window, "context_tokens": c,
                     "kv_elements_per_token": _elements_per_token(spec),
                     "kv_bytes_per_token": kv_bytes_per_token(spec, kv_dtype),
                     "kv_bytes_full": kv_bytes(spec, c, 1, kv_dtype),
                     "kv_bytes_windowed": kv_bytes(spec, c, 1, kv_dtype, True)})
    return rows
