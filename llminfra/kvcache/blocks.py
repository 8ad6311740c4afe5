"""The blocks of the paged KV cache: the pool, copy-on-write sharing, each sequence's table.

The KV cache of every sequence is stored in *blocks* of ``block_size`` token slots, like pages of
virtual memory (Kwon et al., 2023, "Efficient Memory Management for Large Language Model Serving
with PagedAttention", arXiv:2309.06180, §4.2 "KV Cache Manager").

**The pool** (:class:`BlockAllocator`). A block that several sequences share (a forked prompt,
beams with a common prefix) carries a *reference count*: it returns to the free list only when
the last sequence lets it go. Invariants (checked by :meth:`BlockAllocator.check_invariants` and
the property tests): every block is either free (ref count 0, on the free list exactly once) or
used (ref count ≥ 1); ``num_free + num_used == num_blocks`` — blocks are conserved; ref counts
are never negative.

**Copy-on-write** (:func:`fork_blocks`, :func:`copy_on_write`). Parallel sampling (n outputs
from one prompt) and beam search fork a sequence: the child gets the parent's block table and
every block's reference count goes up by one — no K/V is copied. Blocks that are full are never
written again, so they stay shared for ever. Only the *last*, partially filled block is written
by the next token; if it is shared, the writer first gets a private copy (§4.4, Fig. 8:
"copy-on-write at the block granularity").

**Block tables** (:class:`BlockTable`). A sequence's K/V live in blocks scattered anywhere in
the pool; its *block table* lists them in token order (logical block ``j`` -> physical block
``blocks[j]``). Token position ``p`` is stored in *slot*

    slot(p) = blocks[p // B] · B + p mod B          (B = block_size)

of the pool viewed as one flat array of ``num_blocks · B`` token slots (§4.2, Fig. 6; vLLM calls
the list of slots of the new tokens the ``slot_mapping``). Blocks are allocated only when a
token needs one, so a sequence wastes at most ``B - 1`` slots, all in its last block.

Taught in chapter 04 (``notebooks/04_kv_cache_and_paged_attention.ipynb``).
"""

from __future__ import annotations

import operator
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


def slot_mapping(block_ids: list[int], positions: list[int], block_size: int) -> list[int]:
    """Flat slot of each token position: ``block_ids[p // B] · B + p % B``.

    Worked by hand: blocks ``[7, 2]``, ``B = 4``, positions ``[0, 3, 4, 6]`` -> ``[28, 31, 8, 10]``.
    ``ValueError`` if a position is negative or beyond the blocks listed.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    out = []
    for p in positions:
        if not 0 <= p < len(block_ids) * block_size:
            raise ValueError(f"position {p} is outside 0..{len(block_ids) * block_size - 1} "
                             f"covered by {len(block_ids)} blocks of {block_size}")
        out.append(block_ids[p // block_size] * block_size + p % block_size)
    return out


def _check_int(name: str, value) -> int:
    """``value`` as an ``int`` if it is an integer (Python, NumPy or 0-d torch; not a bool);
    ``ValueError`` naming it otherwise (2.5 tokens or blocks mean nothing)."""
    try:
        if not isinstance(value, bool):
            return operator.index(value)
    except TypeError:
        pass
    raise ValueError(f"{name} must be an integer, got {value!r}")


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """``ceil(num_tokens / block_size)``: blocks that hold ``num_tokens`` tokens."""
    num_tokens = _check_int("num_tokens", num_tokens)
    block_size = _check_int("block_size", block_size)
    if block_size < 1 or num_tokens < 0:
        raise ValueError(f"need block_size >= 1 and num_tokens >= 0, got block_size "
                         f"{block_size!r}, num_tokens {num_tokens!r}")
    return -(-num_tokens // block_size)


class BlockTable:
    """One sequence's blocks, in token order, and how many tokens they hold.

    ``blocks_to_append(n)`` says how many blocks ``append(n)`` would take from the pool;
    ``append(n)`` reserves slots for ``n`` new tokens (allocating blocks, copying a shared last
    block first) and returns their slots plus the block copies the storage must perform;
    ``snapshot()`` / ``restore(snap, copies)`` undo appends; ``truncate(n)`` drops the tokens past
    the first ``n`` (rejected speculative tokens); ``fork()`` returns a child that shares every
    block; ``free()`` lets every block go.
    """

    def __init__(self, allocator: BlockAllocator):
        self.allocator = allocator
        self.blocks: list[int] = []
        self.num_tokens = 0

    @property
    def block_size(self) -> int:
        """Token slots per block (the allocator's)."""
        return self.allocator.block_size

    def blocks_to_append(self, n: int) -> int:
        """Blocks :meth:`append` of ``n`` tokens takes from the pool: the new blocks past the
        last, plus one if the last block is shared and gets written (copy-on-write)."""
        n = _check_int("n (tokens to append)", n)
        if n < 0:
            raise ValueError(f"cannot append {n} tokens; n must be >= 0")
        B = self.block_size
        new = blocks_needed(self.num_tokens + n, B) - len(self.blocks)
        writes_last = n > 0 and self.num_tokens % B != 0
        return new + int(writes_last and self.allocator.ref_count(self.blocks[-1]) > 1)

    def append(self, n: int) -> tuple[list[int], list[tuple[int, int]]]:
        """Reserve ``n`` slots; return ``(slots, copies)`` with ``copies`` as ``(src, dst)`` pairs.

        All or nothing: if the pool cannot provide every block needed, nothing changes and
        :class:`BlockPoolExhausted` is raised.
        """
        need = self.blocks_to_append(n)
        if need > self.allocator.num_free:
            raise BlockPoolExhausted(
                f"sequence needs {need} more blocks for {n} tokens but only "
                f"{self.allocator.num_free} are free; preempt a running sequence, swap one out "
                "to CPU memory, or make this request wait")
        B = self.block_size
        new = blocks_needed(self.num_tokens + n, B) - len(self.blocks)
        copies = []
        if n > 0 and self.num_tokens % B != 0:
            op = copy_on_write(self.allocator, self.blocks, -1)
            if op is not None:
                copies.append(op)
        self.blocks.extend(self.allocator.allocate() for _ in range(new))
        positions = list(range(self.num_tokens, self.num_tokens + n))
        self.num_tokens += n
        return slot_mapping(self.blocks, positions, B), copies

    def snapshot(self) -> tuple[tuple[int, ...], int]:
        """What :meth:`restore` returns the table to: its blocks and token count now."""
        return tuple(self.blocks), self.num_tokens

    def restore(self, snap: tuple[tuple[int, ...], int],
                copies: list[tuple[int, int]] = ()) -> None:
        """Undo the appends since ``snap``: blocks added since go back to the pool, and each
        ``(src, dst)`` copy-on-write those appends made gives ``src`` its holder back."""
        blocks, num_tokens = snap
        for src, _ in copies:
            self.allocator.incref(src)
        for b in self.blocks:
            if b not in blocks:
                self.allocator.free(b)
        self.blocks, self.num_tokens = list(blocks), num_tokens

    def truncate(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` tokens; blocks wholly past them go back to the pool
        (the slots of rejected speculative tokens). The kept last block's later slots are
        simply written again."""
        num_tokens = _check_int("num_tokens", num_tokens)
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"truncate to {num_tokens} tokens: must be in [0, "
                             f"{self.num_tokens}] (the tokens held)")
        keep = blocks_needed(num_tokens, self.block_size)
        for b in self.blocks[keep:]:
            self.allocator.free(b)
        self.blocks, self.num_tokens = self.blocks[:keep], num_tokens

    def slots(self) -> list[int]:
        """Slots of all tokens held, in order (what paged attention gathers)."""
        return slot_mapping(self.blocks, list(range(self.num_tokens)), self.block_size)

    def fork(self) -> "BlockTable":
        """A child sequence sharing all blocks (copy-on-write happens on its next append)."""
        child = BlockTable(self.allocator)
        child.blocks = fork_blocks(self.allocator, self.blocks)
        child.num_tokens = self.num_tokens
        return child

    def free(self) -> None:
        """Release every block (each ref count - 1) and empty the table."""
        for b in self.blocks:
            self.allocator.free(b)
        self.blocks, self.num_tokens = [], 0

    def __repr__(self) -> str:
        return f"BlockTable(blocks={self.blocks}, num_tokens={self.num_tokens})"
