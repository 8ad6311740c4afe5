"""One forward step's work: FLOPs and bytes moved, for a batch of sequences.

A step is a list of ``(new_tokens, context_tokens)`` pairs, one per sequence (``context_tokens``
includes the new tokens): decode is ``(1, c)``, a whole-prompt prefill ``(c, c)``, a prefill
chunk anything between. :func:`step_flops` and :func:`step_bytes` are the accounting of
:mod:`llminfra.calc.roofline` (and so of the serving simulator); the ``decode_*`` functions are
their batch-of-decodes case, taught in chapter 01. The bytes build on the memory model
(:mod:`llminfra.calc.memory`): weights once per step, each sequence's KV cache. A
mixture-of-experts model stores every expert but a step reads only the experts its tokens
were routed to (:func:`weight_bytes_read`): one decode token of DeepSeek-V3 reads 8 of 256
routed experts per layer, a long prefill reads them all.
"""

from __future__ import annotations

from llminfra.calc.kv_layout import QUANTIZED_KV
from llminfra.calc.memory import (QUANTIZED, _check_context, _compute_dtype, _dtype_key,
                                  kv_bytes_per_token, weight_bytes)
from llminfra.calc.params import active_param_count, expected_experts_touched, expert_param_count
from llminfra.specs.formats import dtype_bytes
from llminfra.specs.models import ModelSpec, get_model
from llminfra.validate import positive_int


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
        n, c = positive_int(f"batch[{i}] new_tokens", p[0]), _check_context(spec, p[1])
        if n > c:
            raise ValueError(f"batch[{i}]: new_tokens {n} > context_tokens {c} (the context "
                             f"includes the new tokens); allowed: 1..{c}")
        out.append((n, c))
    return out


#: how many new tokens of a sequence go through the output layer (:func:`step_flops`)
LOGITS = ("every", "last")


def step_flops(model: str | ModelSpec, batch, logits: str = "every") -> int:
    """FLOPs of one forward step over ``batch``, a sequence of ``(new_tokens, context_tokens)``
    pairs, one per sequence (``context_tokens`` includes the new tokens).

    ``logits``: ``"every"`` (default) puts every new token through every weight, the output
    layer too (a training forward pass; chapter 01's model); ``"last"`` puts only each
    sequence's last new token through the output layer (``V × h``), as a serving engine does:
    a prefill needs the last position's logits only, so a prompt of ``n`` tokens charges the
    output layer once, not ``n`` times — ``2 · V · h · (n − 1)`` FLOPs fewer per sequence
    (decode, ``n = 1``, is the same either way).

    Per sequence with ``n`` new tokens at context ``c``: ``2 · active_params · n`` (a multiply
    and an add per weight, Kaplan et al., 2020, arXiv:2001.08361, Table 1, C_forward ≈ 2N) plus
    causal attention, ``2 · L · H · (d_qk + d_v)`` per attended (query, key) pair (QKᵀ and AV;
    ``4 · L · H · head_dim`` when d_qk = d_v; latent attention counted in its plain,
    non-absorbed form: d_qk = d_h + d_h^R = 192, d_v = 128 for DeepSeek): new
    token ``j`` sits at position ``c - n + j`` and attends to that many keys, so the pairs number
    ``n · c - n(n-1)/2`` (decode, n = 1: ``c``; whole-prompt prefill, n = c: ``c(c+1)/2``).

    Llama-2-7B, one decode step at context 1: 2 · 6,738,415,616 + 4 · 32 · 32 · 128 · 1
    = 13,477,355,520. Taught in chapters 01 (decode) and 08 (roofline).
    """
    spec = get_model(model)
    if logits not in LOGITS:
        raise ValueError(f"logits must be one of {LOGITS}, got {logits!r}")
    per_pair = 2 * spec.num_layers * spec.num_heads * (spec.head_dim + spec.value_head_dim)
    per_token = 2 * active_param_count(spec)
    output_layer = 2 * spec.vocab_size * spec.hidden_size
    total = 0
    for n, c in _step_pairs(spec, batch):
        total += per_token * n + per_pair * (n * c - n * (n - 1) // 2)
        if logits == "last":
            total -= output_layer * (n - 1)
    return total


def weight_bytes_read(model: str | ModelSpec, dtype: str = "bf16", tokens: int = 1,
                      group_size: int | None = 128, whole_input_embedding: bool = False) -> int:
    """Weight bytes one step over ``tokens`` new tokens reads: :func:`weight_bytes`, less

    * the input-embedding rows no token looks up: a token reads one row of the ``V × h``
      table, so ``(V - min(V, tokens)) · h`` elements are not read (an untied model only: a
      tied table is the output layer too, read whole by its matrix product; kept in
      ``dtype``, or bf16 beside quantized blocks, as :func:`weight_bytes` stores it).
      ``whole_input_embedding=True`` counts the table whole — chapter 01's simple model,
      "every weight once per step", which its exercise and :func:`decode_step_bytes` keep;
    * for mixture-of-experts, the routed experts no token picked:
      ``L_moe · (E - E_touched) · expert_bytes`` with ``E_touched`` from
      :func:`llminfra.calc.params.expected_experts_touched` (uniform routing; rounded to
      whole bytes) and ``expert_bytes`` one expert's weights in ``dtype`` (+ one 2-byte scale
      per ``group_size`` weights when quantized).

    DeepSeek-V3 in bf16, one token: 2 · (671,026,419,200 - 58 · 248 · 44,040,192
    - 129,279 · 7,168) = 73,251,251,200 bytes of 1,342,052,838,400 stored (5.5 %).
    Llama-2-7B in bf16, one token: 13,476,831,232 - 2 · 31,999 · 4,096 = 13,214,695,424.
    Taught in chapters 08 and 11.
    """
    spec = get_model(model)
    tokens = positive_int("tokens", tokens)
    stored = weight_bytes(spec, dtype, group_size)
    if not (whole_input_embedding or spec.tied_embeddings):
        row_bytes = spec.hidden_size * (dtype_bytes("bf16") if _dtype_key(dtype) in QUANTIZED
                                        else dtype_bytes(dtype))
        stored -= int((spec.vocab_size - min(spec.vocab_size, tokens)) * row_bytes)
    if not spec.num_moe_layers:
        return stored
    n = expert_param_count(spec)
    expert = n * dtype_bytes(dtype)
    if _dtype_key(dtype) in QUANTIZED_KV and group_size is not None:
        expert += 2 * -(-n // group_size)
    untouched = spec.num_experts - expected_experts_touched(spec, tokens)
    return int(round(stored - spec.num_moe_layers * untouched * expert))


def step_bytes(model: str | ModelSpec, batch, dtype: str = "bf16",
               kv_dtype: str | None = None, whole_input_embedding: bool = False) -> int:
    """Bytes moved to and from GPU memory by one forward step over ``batch`` (pairs of
    ``(new_tokens, context_tokens)``, as in :func:`step_flops`):

    :func:`weight_bytes_read` once per step (shared by the batch: every weight of a dense
    model; a mixture-of-experts reads only the experts the step's tokens were routed to) +
    per sequence the cached
    keys and values read, ``(c - n) · kv_bytes_per_token``, and the new tokens' written,
    ``n · kv_bytes_per_token`` — together ``c · kv_bytes_per_token``. The new tokens' keys and
    values are counted once: a fused kernel uses them from on-chip memory (FlashAttention
    prefill re-reads them per query tile, which only adds to a step that is compute-bound).
    Activations are not counted (one layer's at a time, small beside the weights in decode).
    ``kv_dtype`` defaults to the compute dtype (``bf16`` for quantized weights). Of an untied
    input-embedding table only the new tokens' rows are read (the rest is 1.9 % of
    Llama-2-7B's bytes, 2.5 % of DeepSeek-V3's per decode token);
    ``whole_input_embedding=True`` counts it whole (chapter 01's model).

    Llama-2-7B, bf16, one decode step at context 1: 13,214,695,424 + 524,288 bytes
    (13,476,831,232 + 524,288 with the whole table). Taught in chapters 08 (roofline) and 11.
    """
    spec = get_model(model)
    if kv_dtype is None:
        kv_dtype = _compute_dtype(dtype)
    kv = kv_bytes_per_token(spec, kv_dtype)
    pairs = _step_pairs(spec, batch)
    tokens = sum(n for n, _ in pairs)
    return (weight_bytes_read(spec, dtype, tokens, whole_input_embedding=whole_input_embedding)
            + sum(kv * c for _, c in pairs))


def decode_step_bytes(model: str | ModelSpec, batch: int = 1, context: int = 2048,
                      dtype: str = "bf16", kv_dtype: str | None = None) -> int:
    """Bytes of one decode step of ``batch`` sequences at ``context`` tokens:
    :func:`step_bytes` of ``batch`` pairs ``(1, context)`` — the weights once (for
    mixture-of-experts only the experts the ``batch`` tokens reach) plus each sequence's KV
    cache, ``weight_bytes_read(dtype, batch) + batch · context · kv_bytes_per_token``, with
    the input-embedding table counted whole: chapter 01's model, every weight once per step
    (its exercise checks against this function). A step reads only the tokens' rows of it:
    :func:`step_bytes`, which the roofline uses, counts so (1.9 % fewer bytes for Llama-2-7B).

    Llama-2-7B, bf16, batch 1, context 1: 13,476,831,232 + 524,288 bytes.
    Taught in chapter 01 (why decode is memory-bound).
    """
    batch = positive_int("batch", batch)
    return step_bytes(model, [(1, context)] * batch, dtype, kv_dtype, whole_input_embedding=True)


def decode_step_flops(model: str | ModelSpec, batch: int = 1, context: int = 2048) -> int:
    """FLOPs of one decode step (one new token for each of ``batch`` sequences):
    :func:`step_flops` of ``batch`` pairs ``(1, context)``, i.e.
    ``B · (2 · active_params + 4 · L · H · head_dim · context)`` — a multiply and an add per
    weight (Kaplan et al., 2020, arXiv:2001.08361, Table 1, C_forward ≈ 2N) plus QKᵀ and AV
    over the ``context`` cached positions.

    Llama-2-7B, batch 1, context 1: 2 · 6,738,415,616 + 4 · 32 · 32 · 128 = 13,477,355,520.
    """
    batch = positive_int("batch", batch)
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
