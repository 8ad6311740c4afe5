"""The source texts' memory rules for quantized weights, recomputed with the memory model.

* the rule of thumb ``params × bytes``: 7B parameters take 28 GB in fp32, 14 GB in fp16,
  7 GB in int8, 3.5 GB in int4;
* what a 4-bit 70B model really stores: the blocks' linear weights at 4 bits **plus** one fp16
  scale (and zero point) per group of 128, while embeddings, the output head and norms stay in
  16 bits (:func:`llminfra.calc.memory.weight_bytes`);
* quantizing the weights leaves the KV cache as it was; quantizing the cache itself
  (int8 / fp8) halves it again.

All in bytes; print with GB (1e9). Chapter 03 (and chapter 02 for the memory model).
"""

from __future__ import annotations

from llminfra.calc.memory import kv_bytes, weight_bytes
from llminfra.calc.params import param_count
from llminfra.specs.formats import dtype_bytes


def weight_rule_table(model: str = "llama-2-7b", dtypes=("fp32", "fp16", "int8", "int4"),
                      group_size: int = 128) -> list[dict]:
    """Per dtype: rule-of-thumb bytes ``params · bytes`` (with the nominal ``7e9`` for a "7B")
    and the memory model's bytes with group scales and 16-bit embeddings."""
    n = param_count(model)
    rows = []
    for d in dtypes:
        rows.append({"model": model, "dtype": d, "params": n,
                     "rule_of_thumb_bytes": int(round(n / 1e9)) * 10**9 * dtype_bytes(d),
                     "exact_bytes": weight_bytes(model, d, group_size=group_size)})
    return rows


def seventy_b_at_4_bits(model: str = "llama-2-70b", group_size: int = 128) -> dict:
    """A 70B model at 4 bits, term by term: naive ``params · 0.5``, with fp16 group scales,
    with scales and zero points, and the memory model's total (16-bit embeddings and head)."""
    n = param_count(model)
    return {"model": model, "params": n, "naive_bytes": n * 0.5,
            "with_scales_bytes": weight_bytes(model, "int4", group_size, zero_point=False),
            "with_scales_and_zeros_bytes": weight_bytes(model, "int4", group_size, zero_point=True),
            "fp16_bytes": weight_bytes(model, "fp16")}


def kv_stays(model: str = "llama-2-7b", context: int = 4096, batch: int = 8) -> list[dict]:
    """Weights + KV cache for 16-bit and 4-bit weights, then with the KV cache in 8 bits."""
    rows = []
    for w_dtype, kv_dtype in (("fp16", "fp16"), ("int4", "fp16"), ("int4", "int8"), ("int4", "fp8")):
        wb, kb = weight_bytes(model, w_dtype), kv_bytes(model, context, batch, kv_dtype)
        rows.append({"weights": w_dtype, "kv_cache": kv_dtype, "weight_bytes": wb,
                     "kv_bytes": kb, "total_bytes": wb + kb})
    return rows
