"""Attention three ways — naive, tiled (FlashAttention in PyTorch), Triton — and their IO.

Tensors are ``(batch, heads, tokens, head_dim)``: q ``(B, H, T, d)``, k and v ``(B, H_kv, S, d)``;
fewer key/value heads than query heads is grouped-query (``H_kv | H``) or multi-query
(``H_kv = 1``) attention. With ``causal=True`` and T < S the queries are the LAST T positions
(decoding with a KV cache). Every version has the signature ``fn(q, k, v, causal=False, ...)``,
so ``model.set_attention(flash_attention)`` plugs it into the tiny model. Chapter 06.

``flash_attention_triton`` needs ``triton``; the package imports without it.

Every attention the model can run lives here: :mod:`.reference` (the model's own naive and SDPA
versions), :mod:`.paged` / :mod:`.paged_triton` (decode over a paged KV cache, chapter 04), and
:mod:`.ragged` with :mod:`.step_metadata` (one ragged step of a serving engine, chapter 05).
"""

from llminfra.attention.flash import flash_attention
from llminfra.attention.flash_triton import flash_attention_triton
from llminfra.attention.io_accounting import IOCounter, flash_block_sizes, measure_io
from llminfra.attention.naive import naive_attention
from llminfra.attention.online_softmax import (merge_partials, merge_stats, online_softmax,
                                               online_softmax_stats, safe_softmax)
from llminfra.attention.paged import contiguous_decode_attention, gather_kv, paged_attention
from llminfra.attention.paged_triton import paged_attention_triton
from llminfra.attention.ragged import ragged_attention
from llminfra.attention.reference import causal_mask, reference_attention, sdpa_attention
from llminfra.attention.step_metadata import StepMetadata

__all__ = ["naive_attention", "flash_attention", "flash_attention_triton", "IOCounter",
           "flash_block_sizes", "measure_io", "online_softmax", "online_softmax_stats",
           "merge_stats", "merge_partials", "safe_softmax", "reference_attention", "sdpa_attention", "causal_mask",
           "paged_attention", "paged_attention_triton", "contiguous_decode_attention",
           "gather_kv", "ragged_attention", "StepMetadata"]
