"""How many GPUs the memory alone asks for.

Taught in chapter 10 (exercise 10.1 writes :func:`gpus_for_memory` again).
"""

from __future__ import annotations

import math

from llminfra.validate import non_negative_int


def gpus_for_memory(weight_bytes: float, kv_bytes_per_token: float, context_tokens: int,
                concurrency: int, gpu_memory_bytes: float, reserve_fraction: float = 0.10,
                activation_bytes: float = 0.0) -> int:
    """Smallest number of GPUs whose usable memory holds the weights, one forward pass's
    activations and the KV cache of ``concurrency`` sequences of ``context_tokens`` tokens:

        n = ceil((W + A + C · S · k) / (M · (1 − r)))

    with W weights, A activations, C concurrency, S context, k KV bytes per token, M one GPU's
    memory and r the share held back for the runtime (vLLM's ``gpu_memory_utilization = 0.9``
    leaves r = 0.1). Weights and KV are split over the GPUs by tensor parallelism.

    Worked example: Llama-2-13B in bf16 (W = 26.03 GB, k = 819,200 B), 32 sequences of 4,096
    tokens, A100-80GB (M = 85,899,345,920 B, r = 0.1): need 26.03e9 + 107.37e9 = 133.4e9 B
    against 77.31e9 B per GPU → ceil(1.726) = 2 GPUs.
    """
    for name, v in (("weight_bytes", weight_bytes), ("kv_bytes_per_token", kv_bytes_per_token),
                    ("gpu_memory_bytes", gpu_memory_bytes)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    for name, v in (("context_tokens", context_tokens), ("concurrency", concurrency)):
        non_negative_int(name, v)
    if not 0 <= reserve_fraction < 1:
        raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction!r}")
    if not activation_bytes >= 0:
        raise ValueError(f"activation_bytes must be >= 0, got {activation_bytes!r}")
    need = weight_bytes + activation_bytes + concurrency * context_tokens * kv_bytes_per_token
    return max(1, math.ceil(need / (gpu_memory_bytes * (1 - reserve_fraction)) - 1e-12))
