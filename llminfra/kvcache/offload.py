"""Offloading: move a sequence's KV blocks to CPU memory and back, or drop and recompute them.

When the block pool runs out, a server must evict some sequence's K/V (Kwon et al., 2023,
arXiv:2309.06180, §4.5). Two ways back:

* **swapping** — copy the sequence's blocks to CPU memory and free them; later allocate fresh
  blocks and copy the K/V back (the block ids change, the block table is rewritten). Cost: the
  bytes over the host link, twice (out and in):

      t_swap = 2 · n_tokens · kv_bytes_per_token / link_bytes_per_s

* **recomputation** — free the blocks and later run the prompt and the tokens generated so far
  through the model again as one prefill. Cost: about ``2 · params`` FLOPs per token
  (Kaplan et al., 2020, arXiv:2001.08361, §2.1), at the GPU's compute rate:

      t_recompute = 2 · params · n_tokens / flops_per_s

The paper measures both (§7, Fig. 19): swapping costs more for small blocks (many small PCIe
transfers), recomputation does not depend on the block size.

Taught in chapter 04.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llminfra.kvcache.blocks import BlockTable
from llminfra.kvcache.paged_cache import PagedKVCache


@dataclass
class SwappedSequence:
    """K/V of one sequence held in CPU memory: ``(n_layers, n_blocks, B, H_kv, d)`` each."""

    k: torch.Tensor
    v: torch.Tensor
    num_tokens: int

    @property
    def nbytes(self) -> int:
        """Bytes held in CPU memory (K and V)."""
        return 2 * self.k.numel() * self.k.element_size()


def swap_out(cache: PagedKVCache, seq: int, pin_memory: bool = False) -> SwappedSequence:
    """Copy ``seq``'s blocks to CPU memory and free them on the device; the sequence leaves
    ``cache`` (its id is forgotten). ``pin_memory`` uses page-locked memory (CUDA only)."""
    table = cache.tables[seq] if seq in cache.tables else None
    if table is None:
        raise KeyError(f"no sequence {seq!r} in the cache; live: {sorted(cache.tables)}")
    kv = cache.gather_blocks(table.blocks).to("cpu")           # (L, 2, n, B, H_kv, d)
    k, v = kv[:, 0], kv[:, 1]
    if pin_memory:
        k, v = k.pin_memory(), v.pin_memory()
    swapped = SwappedSequence(k, v, table.num_tokens)
    cache.free(seq)
    return swapped


def swap_in(cache: PagedKVCache, swapped: SwappedSequence) -> int:
    """Allocate blocks for a swapped-out sequence, copy its K/V back; return its new id.

    Raises :class:`~llminfra.kvcache.blocks.BlockPoolExhausted` (changing nothing)
    when the pool is too full.
    """
    seq = cache.add_sequence()
    table: BlockTable = cache.tables[seq]
    try:
        table.append(swapped.num_tokens)
    except Exception:
        cache.free(seq)
        raise
    cache.scatter_blocks(table.blocks, torch.stack((swapped.k, swapped.v), dim=1))
    return seq


def swap_time_s(num_tokens: int, kv_bytes_per_token: int, link_bytes_per_s: float) -> float:
    """``2 · n · kv_bytes_per_token / link``: swap out and back in over the host link.

    Worked by hand: 1000 tokens of Llama-2-7B (524,288 B each) over 25 GB/s -> 0.0419 s.
    """
    if num_tokens < 0 or kv_bytes_per_token <= 0 or link_bytes_per_s <= 0:
        raise ValueError("need num_tokens >= 0 and positive kv_bytes_per_token, link_bytes_per_s")
    return 2 * num_tokens * kv_bytes_per_token / link_bytes_per_s


def recompute_time_s(num_tokens: int, params: int, flops_per_s: float) -> float:
    """``2 · params · n / flops_per_s``: re-run the sequence as one prefill (compute-bound).

    Worked by hand: 1000 tokens of a 6.74e9-parameter model at 312e12 FLOP/s -> 0.0432 s.
    """
    if num_tokens < 0 or params <= 0 or flops_per_s <= 0:
        raise ValueError("need num_tokens >= 0 and positive params, flops_per_s")
    return 2 * params * num_tokens / flops_per_s
