"""Per-sequence block tables and the slot mapping.

A sequence's K/V live in blocks scattered anywhere in the pool; its *block table* lists them in
token order (logical block ``j`` -> physical block ``blocks[j]``). Token position ``p`` is stored
in *slot*

    slot(p) = blocks[p // B] · B + p mod B          (B = block_size)

of the pool viewed as one flat array of ``num_blocks · B`` token slots (Kwon et al., 2023,
arXiv:2309.06180, §4.2, Fig. 6; vLLM calls the list of slots of the new tokens the
``slot_mapping``). Blocks are allocated only when a token needs one, so a sequence wastes at most
``B - 1`` slots, all in its last block.

Taught in chapter 04.
"""

from __future__ import annotations

import operator

from llminfra.kvcache.block_allocator import BlockAllocator, BlockPoolExhausted
from llminfra.kvcache.copy_on_write import copy_on_write, fork_blocks


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
