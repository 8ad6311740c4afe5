"""KV caches: contiguous, paged, shared (copy-on-write), prefix-cached, offloaded (chapter 04).

The design follows vLLM (Kwon et al., 2023, "Efficient Memory Management for Large Language
Model Serving with PagedAttention", arXiv:2309.06180). Modules, one concept each:

* :mod:`.contiguous` — caches reserved at the maximum length, or grown by doubling;
* :mod:`.blocks` — the block pool (reference counts, a free list), forks that share blocks
  and copy one only when it is written, per-sequence block tables and the slot mapping;
* attention through block tables (PyTorch gather; a Triton kernel for CUDA, also run under
  ``TRITON_INTERPRET=1``) lives with every other attention in :mod:`llminfra.attention.paged`
  and :mod:`llminfra.attention.paged_triton`; it is re-exported here;
* :mod:`.paged_cache` — the paged cache behind the model's ``cache.update`` protocol;
* :mod:`.prefix_cache` — blocks found again by the hash of their prefix, LRU eviction;
* :mod:`.offload` — swap to CPU memory and back, or recompute, with their costs;
* :mod:`.trace`, :mod:`.simulate`, :mod:`.sharing` — request traces and the measurements.
"""

from llminfra.kvcache.blocks import (BlockAllocator, BlockPoolExhausted, BlockTable, blocks_needed,
                                     copy_on_write, fork_blocks, slot_mapping)
from llminfra.kvcache.contiguous import ContiguousKVCache, GrowingKVCache, contiguous_waste
from llminfra.kvcache.offload import (SwappedSequence, recompute_time_s, swap_in, swap_out,
                                      swap_time_s)
from llminfra.attention.paged import contiguous_decode_attention, gather_kv, paged_attention
from llminfra.attention.paged_triton import paged_attention_triton
from llminfra.kvcache.paged_cache import PagedKVCache
from llminfra.kvcache.prefix_cache import (PrefixCachingAllocator, block_hash, match_prefix,
                                           prefix_block_hashes, register_prefix)
from llminfra.kvcache.trace import Request, request_trace, trace_summary

__all__ = [
    "BlockAllocator", "BlockPoolExhausted", "BlockTable", "blocks_needed", "slot_mapping",
    "ContiguousKVCache", "GrowingKVCache", "contiguous_waste", "copy_on_write", "fork_blocks",
    "SwappedSequence", "swap_in", "swap_out", "swap_time_s", "recompute_time_s",
    "contiguous_decode_attention", "gather_kv", "paged_attention", "paged_attention_triton",
    "PagedKVCache", "PrefixCachingAllocator", "block_hash", "match_prefix",
    "prefix_block_hashes", "register_prefix", "Request", "request_trace", "trace_summary",
]
