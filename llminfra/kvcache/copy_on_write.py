"""Copy-on-write: share blocks between sequences, copy one only when a holder writes to it.

Parallel sampling (n outputs from one prompt) and beam search fork a sequence: the child gets the
parent's block table and every block's reference count goes up by one — no K/V is copied.
Blocks that are full are never written again, so they stay shared for ever. Only the *last*,
partially filled block is written by the next token; if it is shared, the writer first gets a
private copy (Kwon et al., 2023, arXiv:2309.06180, §4.4, Fig. 8: "copy-on-write at the block
granularity").

Taught in chapter 04.
"""

from __future__ import annotations

from llminfra.kvcache.block_allocator import BlockAllocator


def copy_on_write(allocator: BlockAllocator, blocks: list[int],
                  index: int) -> tuple[int, int] | None:
    """Make ``blocks[index]`` private before it is written; return the copy ``(src, dst)`` or None.

    If the block's reference count is 1 the writer already owns it: nothing happens. Otherwise a
    fresh block ``dst`` is allocated, ``blocks[index]`` is replaced by it, the old block loses one
    holder, and the caller must copy the K/V of ``src`` into ``dst`` in its storage
    (:meth:`llminfra.kvcache.paged_cache.PagedKVCache` does).
    """
    src = blocks[index]
    if allocator.ref_count(src) == 1:
        return None
    dst = allocator.allocate()
    allocator.free(src)          # one holder fewer; the others keep it
    blocks[index] = dst
    return src, dst


def fork_blocks(allocator: BlockAllocator, blocks: list[int]) -> list[int]:
    """A child's block list sharing every block of ``blocks`` (each ref count + 1, no copy)."""
    for b in blocks:
        allocator.incref(b)
    return list(blocks)
