"""Attention for a ragged step: prefill chunks of any length and single-token decodes, together.

The queries of one step are one flat tensor ``q (N, H, d)``, N = Σ T_i (see
:mod:`.step_metadata`). Sequence i's T_i queries are the LAST T_i of its S_i positions, so each
one attends causally to that sequence's own keys only (bottom-right mask, as in
:func:`llminfra.attention.reference.causal_mask`)::

    o_t = softmax(q_t K_iᵀ / √d + mask) V_i,   key j visible iff j <= S_i - T_i + (t - start_i)

Two paths, chosen per sequence from ``meta.query_lens``:

* **decode** (T_i = 1): all such sequences at once, one query each, against their K/V padded to
  the longest context — :func:`llminfra.attention.paged.paged_attention`'s gather from the
  block pool for a paged cache (the Triton kernel on CUDA when triton is installed), else
  :func:`llminfra.attention.paged.contiguous_decode_attention`;
* **prefill** (T_i > 1): one call per sequence of ``attn_fn(q_i, k_i, v_i, causal=True)`` on
  ``(1, H, T_i, d)`` / ``(1, H_kv, S_i, d)`` tensors — :func:`reference_attention` by default,
  or whatever the model was given (``model.set_attention(flash_attention)``); a custom
  ``attn_fn`` is then used for the decodes too.

vLLM splits a mixed batch the same way (prefill tokens first, decode tokens after, a
varlen prefill kernel and a paged decode kernel; Kwon et al. 2023, arXiv:2309.06180, §4.1).
Taught in chapter 05.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from llminfra.attention.paged import contiguous_decode_attention, gather_decode_attention
from llminfra.attention.reference import reference_attention
from llminfra.attention.step_metadata import StepMetadata


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: StepMetadata) -> None:
    if not isinstance(meta, StepMetadata):
        raise ValueError(f"meta must be a StepMetadata, got {type(meta).__name__}")
    if q.dim() != 3 or q.shape[0] != meta.num_tokens:
        raise ValueError(f"q must be (N={meta.num_tokens}, H, d) for this step, got "
                         f"{tuple(q.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    want = {"paged": 4, "padded": 4, "flat": 3}[meta.kv_layout]
    if k.dim() != want:
        raise ValueError(f"kv_layout {meta.kv_layout!r} wants {want}-D k/v, got "
                         f"{tuple(k.shape)}")
    if meta.kv_layout == "flat" and meta.context_lens != meta.query_lens:
        raise ValueError("without a cache every sequence must be all new tokens (S_i = T_i); "
                         f"got query_lens {meta.query_lens}, context_lens {meta.context_lens}")


def sequence_kv(k: torch.Tensor, v: torch.Tensor, meta: StepMetadata,
                i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence i's keys and values so far, ``(1, H_kv, S_i, d)`` each, from any layout."""
    S = meta.context_lens[i]
    if meta.kv_layout == "paged":
        B = k.shape[1]
        blocks = meta.block_tables[i, :-(-S // B)]
        K = k[blocks].flatten(0, 1)[:S]                       # (S, H_kv, d)
        V = v[blocks].flatten(0, 1)[:S]
    elif meta.kv_layout == "padded":
        return k[i:i + 1, :, :S], v[i:i + 1, :, :S]
    else:
        a, b = int(meta.query_start_loc[i]), int(meta.query_start_loc[i + 1])
        K, V = k[a:b], v[a:b]                                 # (S, H_kv, d)
    return K.transpose(0, 1).unsqueeze(0), V.transpose(0, 1).unsqueeze(0)


def _decode_batch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: StepMetadata,
                  rows: list[int]) -> torch.Tensor:
    """One query per sequence in ``rows`` (all T_i = 1): ``(len(rows), H, d)``."""
    everyone = len(rows) == meta.num_seqs                     # a pure decode step
    tok = slice(None) if everyone else meta.query_start_loc[rows]   # their flat token index
    lens = [meta.context_lens[i] for i in rows]
    ctx = meta.context_lens_tensor if everyone else meta.context_lens_tensor[rows]
    if meta.kv_layout == "paged":
        tables = meta.block_tables if everyone else meta.block_tables[rows]
        if q.is_cuda:
            from llminfra.attention.paged_triton import paged_attention_triton, triton
            if triton is not None and not (k.shape[1] & (k.shape[1] - 1)):
                return paged_attention_triton(q[tok], k, v, tables, ctx)
        return gather_decode_attention(q[tok], k, v, tables, ctx, max(lens))
    if meta.kv_layout == "padded":
        return contiguous_decode_attention(q[tok], k[rows], v[rows], ctx)
    return contiguous_decode_attention(q[tok], k[tok].unsqueeze(2), v[tok].unsqueeze(2), ctx)


def ragged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: StepMetadata,
                     attn_fn: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """Causal attention of every sequence of a ragged step over its own keys.

    q ``(N, H, d)``; k, v in ``meta.kv_layout`` (module docstring of :mod:`.step_metadata`);
    returns ``(N, H, d)`` in q's dtype. ``attn_fn(q, k, v, causal=True)`` on
    ``(1, heads, tokens, d)`` tensors replaces the built-in paths (default: the decode batch +
    :func:`reference_attention` per prefill sequence).
    """
    _check(q, k, v, meta)
    decodes = [i for i, t in enumerate(meta.query_lens) if t == 1] if attn_fn is None else []
    if len(decodes) == meta.num_seqs:
        return _decode_batch(q, k, v, meta, decodes)
    out = torch.empty_like(q)
    starts = meta.query_start_loc.tolist()
    if decodes:
        out[meta.query_start_loc[decodes]] = _decode_batch(q, k, v, meta, decodes)
    fn = reference_attention if attn_fn is None else attn_fn
    done = set(decodes)
    for i in range(meta.num_seqs):
        if i in done:
            continue
        a, b = starts[i], starts[i + 1]
        K, V = sequence_kv(k, v, meta, i)                     # (1, H_kv, S_i, d)
        q_i = q[a:b].transpose(0, 1).unsqueeze(0)             # (1, H, T_i, d)
        out[a:b] = fn(q_i, K.to(q.dtype), V.to(q.dtype), causal=True)[0].transpose(0, 1)
    return out
