"""A pool of fixed-size KV blocks with reference counts and a free list.

The KV cache of every sequence is stored in *blocks* of ``block_size`` token slots, like pages of
virtual memory (Kwon et al., 2023, "Efficient Memory Management for Large Language Model Serving
with PagedAttention", arXiv:2309.06180, §4.2 "KV Cache Manager"). A block that several sequences
share (a forked prompt, beams with a common prefix) carries a *reference count*: it returns to the
free list only when the last sequence lets it go.

Invariants (checked by :meth:`BlockAllocator.check_invariants` and the property tests):

* every block is either free (ref count 0, on the free list exactly once) or used (ref count ≥ 1);
* ``num_free + num_used == num_blocks`` — blocks are conserved;
* ref counts are never negative.

Taught in chapter 04 (``notebooks/04_kv_cache_and_paged_attention.ipynb``).
"""

from __future__ import annotations

from collections import deque

from llminfra.validate import positive_int


class BlockPoolExhausted(RuntimeError):
    """The block pool has no free block left.

    Raised by :meth:`BlockAllocator.allocate`. A serving engine answers it the way vLLM's
    scheduler does (arXiv:2309.06180, §4.5): preempt a running sequence and later *recompute*
    it, *swap* a sequence's blocks out to CPU memory (:mod:`llminfra.kvcache.offload`), or make
    the new request *wait* until running sequences finish and free their blocks.
    """


class BlockAllocator:
    """Hands out block ids ``0 .. num_blocks-1`` and counts who holds each one.

    ``allocate()`` pops the free list (ref count 1); ``incref(b)`` adds a holder (a fork);
    ``free(b)`` drops one holder and returns the block to the free list at zero. Freed blocks
    are reused first-in-first-out, so the numbers in the chapter's widget move visibly.

    >>> a = BlockAllocator(num_blocks=4, block_size=16)
    >>> b = a.allocate(); a.incref(b); a.ref_count(b)
    2
    >>> a.free(b); a.free(b); a.num_free
    4
    """

    def __init__(self, num_blocks: int, block_size: int):
        positive_int("num_blocks", num_blocks)
        positive_int("block_size", block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    # ------------------------------------------------------------------ queries
    @property
    def num_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks with at least one holder."""
        return self.num_blocks - self.num_free

    def ref_count(self, block_id: int) -> int:
        """How many sequences hold ``block_id`` (0 = free)."""
        self._check_id(block_id)
        return self._ref[block_id]

    def free_list(self) -> list[int]:
        """The free block ids in the order they will be handed out."""
        return list(self._free)

    def ref_counts(self) -> list[int]:
        """Reference count of every block, indexed by block id."""
        return list(self._ref)

    # ---------------------------------------------------------------- mutations
    def allocate(self) -> int:
        """Take a free block (ref count becomes 1); :class:`BlockPoolExhausted` if none."""
        if not self._free:
            raise BlockPoolExhausted(
                f"all {self.num_blocks} KV blocks of {self.block_size} tokens are in use; "
                "preempt a running sequence (free its blocks and recompute it later), swap one "
                "out to CPU memory (llminfra.kvcache.offload.swap_out), or make this request "
                "wait until running sequences finish")
        block_id = self._free.popleft()
        self._ref[block_id] = 1
        return block_id

    def incref(self, block_id: int) -> None:
        """Add a holder to a used block (a fork shares it instead of copying it)."""
        self._check_id(block_id)
        if self._ref[block_id] == 0:
            raise ValueError(f"block {block_id} is free; only a used block can be shared")
        self._ref[block_id] += 1

    def free(self, block_id: int) -> bool:
        """Drop one holder; at zero the block goes back on the free list. Returns True then."""
        self._check_id(block_id)
        if self._ref[block_id] == 0:
            raise ValueError(f"block {block_id} is already free (double free)")
        self._ref[block_id] -= 1
        if self._ref[block_id] == 0:
            self._release(block_id)
            return True
        return False

    def _release(self, block_id: int) -> None:
        """Put a block whose count reached zero back on the free list (subclasses may keep it)."""
        self._free.append(block_id)

    # ----------------------------------------------------------------- checking
    def _check_id(self, block_id: int) -> None:
        if isinstance(block_id, bool) or not isinstance(block_id, int) \
                or not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block id {block_id!r} is outside 0..{self.num_blocks - 1}")

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if blocks are not conserved or a ref count is negative."""
        free = list(self._free)
        assert len(set(free)) == len(free), "a block is on the free list twice"
        assert all(r >= 0 for r in self._ref), "negative reference count"
        assert all(self._ref[b] == 0 for b in free), "a block on the free list has holders"
        held = sum(1 for r in self._ref if r > 0)
        assert held + self._parked() + len(free) == self.num_blocks, "blocks not conserved"

    def _parked(self) -> int:
        """Blocks with ref count 0 kept off the free list (a prefix cache's evictable blocks)."""
        return 0
