"""One forward step's work: FLOPs and bytes moved, for a batch of sequences.

A step is a list of ``(new_tokens, context_tokens)`` pairs, one per sequence (``context_tokens``
includes the new tokens): decode is ``(1, c)``, a whole-prompt prefill ``(c, c)``, a prefill
chunk anything between. :func:`step_flops` and :func:`step_bytes` are the accounting of
:mod:`llminfra.calc.roofline` (and so of the serving simulator); the ``decode_*`` functions are
their batch-of-decodes case, taught in chapter 01. The bytes build on the memory model
(:mod:`llminfra.calc.memory`): weights once per step, each sequence's KV cache.
"""

from __future__ import annotations

from llminfra.calc.memory import (_check_context, _compute_dtype, _positive_int,
                                  kv_bytes_per_token, weight_bytes)
from llminfra.calc.params import active_param_count
from llminfra.specs.models import ModelSpec, get_model


def _step_pairs(spec: ModelSpec, batch) -> list[tuple[int, int]]:
    """``batch`` as a list of ``(new_tokens, context_tokens)`` pairs, checked:
    ``1 <= new_tokens <= context_tokens <= max_positions``."""
    try:
        pairs = [tuple(p) for p in batch]
    except TypeError:
        raise ValueError(f"batch must be a sequence of (new_tokens, context_tokens) pairs, "
                         f"got {batch!r}") from None
    if not pairs:
        raise ValueError("batch must hold at least one (new_tokens, context_tokens) pair")
    out = []
    for i, p in enumerate(pairs):
        if len(p) != 2:
            raise ValueError(f"batch[{i}] = {p!r} is not a (new_tokens, context_tokens) pair")
        n, c = _positive_int(f"batch[{i}] new_tokens", p[0]), _check_context(spec, p[1])
        if n > c:
            raise ValueError(f"batch[{i}]: new_tokens {n} > context_tokens {c} (the context "
                             f"includes the new tokens); allowed: 1..{c}")
        out.append((n, c))
    return out


def step_flops(model: str | ModelSpec, batch) -> int:
    """FLOPs of one forward step over ``batch``, a sequence of ``(new_tokens, context_tokens)``
    pairs, one per sequence (``context_tokens`` includes the new tokens).

    Per sequence with ``n`` new tokens at context ``c``: ``2 · active_params · n`` (a multiply
    and an add per weight, Kaplan et al., 2020, arXiv:2001.08361, Table 1, C_forward ≈ 2N) plus
    causal attention, ``4 · L · H · head_dim`` per attended (query, key) pair (QKᵀ and AV): new
    token ``j`` sits at position ``c - n + j`` and attends to that many keys, so the pairs number
    ``n · c - n(n-1)/2`` (decode, n = 1: ``c``; whole-prompt prefill, n = c: ``c(c+1)/2``).

    Llama-2-7B, one decode step at context 1: 2 · 6,738,415,616 + 4 · 32 · 32 · 128 · 1
    = 13,477,355,520. Taught in chapters 01 (decode) and 08 (roofline).
    """
    spec = get_model(model)
    per_pair = 4 * spec.num_layers * spec.num_heads * spec.head_dim
    per_token = 2 * active_param_count(spec)
    total = 0
    for n, c in _step_pairs(spec, batch):
        total += per_token * n + per_pair * (n * c - n * (n - 1) // 2)
    return total


def step_bytes(model: str | ModelSpec, batch, dtype: str = "bf16",
               kv_dtype: str | None = None) -> int:
    """Bytes moved to and from GPU memory by one forward step over ``batch`` (pairs of
    ``(new_tokens, context_tokens)``, as in :func:`step_flops`):

    ``weight_bytes(dtype)`` once per step (shared by the batch) + per sequence the cached
    keys and values read, ``(c - n) · kv_bytes_per_token``, and the new tokens' written,
    ``n · kv_bytes_per_token`` — together ``c · kv_bytes_per_token``. The new tokens' keys and
    values are counted once: a fused kernel uses them from on-chip memory (FlashAttention
    prefill re-reads them per query tile, which only adds to a step that is compute-bound).
    Activations are not counted (one layer's at a time, small beside the weights in decode).
    ``kv_dtype`` defaults to the compute dtype (``bf16`` for quantized weights). The embedding
    table is counted whole although only the new tokens' rows are read (2% of Llama-2-7B).

    Llama-2-7B, bf16, one decode step at context 1: 13,476,831,232 + 524,288 bytes.
    Taught in chapters 01 (decode) and 08 (roofline).
    """
    spec = get_model(model)
    if kv_dtype is None:
        kv_dtype = _compute_dtype(dtype)
    kv = kv_bytes_per_token(spec, kv_dtype)
    return weight_bytes(spec, dtype) + sum(kv * c for _, c in _step_pairs(spec, batch))


def decode_step_bytes(model: str | ModelSpec, batch: int = 1, context: int = 2048,
                      dtype: str = "bf16", kv_dtype: str | None = None) -> int:
    """Bytes of one decode step of ``batch`` sequences at ``context`` tokens:
    :func:`step_bytes` of ``batch`` pairs ``(1, context)`` — every weight once plus each
    sequence's KV cache, ``weight_bytes(dtype) + batch · context · kv_bytes_per_token``.

    Llama-2-7B, bf16, batch 1, context 1: 13,476,831,232 + 524,288 bytes.
    Taught in chapter 01 (why decode is memory-bound) and chapter 08 (roofline).
    """
    batch = _positive_int("batch", batch)
    return step_bytes(model, [(1, context)] * batch, dtype, kv_dtype)


def decode_step_flops(model: str | ModelSpec, batch: int = 1, context: int = 2048) -> int:
    """FLOPs of one decode step (one new token for each of ``batch`` sequences):
    :func:`step_flops` of ``batch`` pairs ``(1, context)``, i.e.
    ``B · (2 · active_params + 4 · L · H · head_dim · context)`` — a multiply and an add per
    weight (Kaplan et al., 2020, arXiv:2001.08361, Table 1, C_forward ≈ 2N) plus QKᵀ and AV
    over the ``context`` cached positions.

    Llama-2-7B, batch 1, context 1: 2 · 6,738,415,616 + 4 · 32 · 32 · 128 = 13,477,355,520.
    """
    batch = _positive_int("batch", batch)
    return step_flops(model, [(1, context)] * batch)


def decode_arithmetic_intensity(model: str | ModelSpec, batch: int = 1, context: int = 2048,
                                dtype: str = "bf16", kv_dtype: str | None = None) -> float:
    """FLOPs per byte of one decode step: :func:`decode_step_flops` / :func:`decode_step_bytes`.

    At batch 1 in bf16 this is about 1 (2 FLOPs per weight, 2 bytes per weight), far below a
    GPU's peak FLOP/s divided by its bandwidth (H100: ~300), so decode waits on memory
    (Williams et al., 2009, roofline model). Taught in chapter 01.
    """
    return decode_step_flops(model, batch, context) / decode_step_bytes(model, batch, context,
                                                                        dtype, kv_dtype)
