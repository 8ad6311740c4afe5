"""Prefix caching: reuse the K/V blocks of a prompt prefix that an earlier request computed.

A *full* block is identified by a hash of its tokens **and** of the prefix before it,

    h_j = H(h_{j-1}, tokens[j·B : (j+1)·B]),   h_{-1} = H("")

so two blocks get the same hash only if the whole prefix up to and including them is the same
(the K/V of a token depend on every token before it). This is vLLM's automatic prefix caching
(vLLM documentation, "Automatic Prefix Caching" design; the shared-prefix experiment is Kwon et
al., 2023, arXiv:2309.06180, §4.4 and §6.4). When a request finishes, its cached blocks are not
returned to the free list: they wait, reference count 0, in an LRU list, where a later request
with the same prefix can take them back. A new allocation uses the free list first and then
evicts the least-recently-used of these blocks.

Taught in chapter 04.
"""

from __future__ import annotations

import hashlib
import operator
from collections import OrderedDict

from llminfra.kvcache.blocks import BlockAllocator, BlockPoolExhausted, BlockTable

_ROOT = hashlib.sha256(b"llminfra-prefix-root").hexdigest()


def block_hash(prefix_hash: str, tokens: list[int] | tuple[int, ...]) -> str:
    """``H(prefix_hash, tokens)``: SHA-256 of the parent hash and the block's token ids.

    Unambiguous by construction, as vLLM's ``hash_block_tokens`` (which hashes the tuple
    ``(parent_hash, token_ids)``): the parent hash is fixed-width (64 hex digits), then the
    number of tokens, then every id as 8 signed little-endian bytes. Token ids written as text
    and joined without a separator would make ``[1, 23]`` and ``[12, 3]`` the same block.
    """
    if not isinstance(prefix_hash, str) or len(prefix_hash) != 64:
        raise ValueError(f"prefix_hash must be a 64-digit hex SHA-256, got {prefix_hash!r}")
    ids = []
    for t in tokens:
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise ValueError(f"token ids must be integers, got {t!r}")
        ids.append(operator.index(t))
    data = bytearray(prefix_hash.encode("ascii"))
    data += len(ids).to_bytes(8, "little")
    for t in ids:
        data += t.to_bytes(8, "little", signed=True)
    return hashlib.sha256(bytes(data)).hexdigest()


def prefix_block_hashes(tokens: list[int], block_size: int) -> list[str]:
    """Hash of every *full* block of ``tokens`` (a partial last block is never cached)."""
    out, h = [], _ROOT
    for j in range(len(tokens) // block_size):
        h = block_hash(h, tokens[j * block_size:(j + 1) * block_size])
        out.append(h)
    return out


class PrefixCachingAllocator(BlockAllocator):
    """A :class:`BlockAllocator` that remembers full blocks by prefix hash, evicting LRU.

    ``lookup(h)`` returns the block cached under ``h`` (one more holder) or None;
    ``register(block, h)`` records a computed full block. Blocks whose count reaches zero
    stay cached (``num_evictable``) and count as free: ``allocate`` takes them, oldest first,
    once the free list is empty. ``hits`` / ``queries`` count lookups in blocks.
    """

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self._cached: dict[str, int] = {}
        self._hash_of: dict[int, str] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.hits = 0
        self.queries = 0

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated: free list plus evictable cached blocks."""
        return len(self._free) + len(self._evictable)

    @property
    def num_evictable(self) -> int:
        """Cached blocks nobody holds (reference count 0), kept until evicted."""
        return len(self._evictable)

    def _parked(self) -> int:
        return len(self._evictable)

    def lookup(self, h: str) -> int | None:
        """The block cached under hash ``h`` with one more holder, or None on a miss."""
        self.queries += 1
        block = self._cached.get(h)
        if block is None:
            return None
        self.hits += 1
        if self._ref[block] == 0:
            del self._evictable[block]
            self._ref[block] = 1
        else:
            self._ref[block] += 1
        return block

    def register(self, block_id: int, h: str) -> None:
        """Remember that used block ``block_id`` holds the full block with prefix hash ``h``."""
        self._check_id(block_id)
        if self._ref[block_id] == 0:
            raise ValueError(f"block {block_id} is free; register a block you hold")
        if h in self._cached or block_id in self._hash_of:
            return                       # same prefix computed twice: keep the first copy
        self._cached[h] = block_id
        self._hash_of[block_id] = h

    def allocate(self) -> int:
        """A free block if any, else the least-recently-used evictable cached block."""
        if self._free or not self._evictable:
            return super().allocate()
        block, _ = self._evictable.popitem(last=False)
        del self._cached[self._hash_of.pop(block)]
        self._ref[block] = 1
        return block

    def _release(self, block_id: int) -> None:
        if block_id in self._hash_of:
            self._evictable[block_id] = None    # most recently used at the end
        else:
            self._free.append(block_id)

    def hit_rate(self) -> float:
        """``hits / queries`` (0.0 before any lookup)."""
        return self.hits / self.queries if self.queries else 0.0


def match_prefix(allocator: PrefixCachingAllocator, tokens: list[int]) -> tuple[BlockTable, int]:
    """A new block table holding the longest cached prefix of ``tokens``; returns it and the
    number of tokens whose K/V are already there (a multiple of the block size).

    At least one token is always left to compute, so the model has a query for the next token.
    """
    table, B = BlockTable(allocator), allocator.block_size
    hashes = prefix_block_hashes(tokens, B)
    if hashes and len(hashes) * B == len(tokens):
        hashes = hashes[:-1]             # keep the last token for the model to run
    for h in hashes:
        block = allocator.lookup(h)
        if block is None:
            break
        table.blocks.append(block)
    table.num_tokens = len(table.blocks) * B
    return table, table.num_tokens


def register_prefix(allocator: PrefixCachingAllocator, table: BlockTable,
                    tokens: list[int]) -> None:
    """After ``tokens``' K/V are written into ``table``'s blocks, cache every full block."""
    if len(tokens) > table.num_tokens:
        raise ValueError(f"{len(tokens)} tokens but the table holds only {table.num_tokens}")
    for block, h in zip(table.blocks, prefix_block_hashes(tokens, allocator.block_size)):
        allocator.register(block, h)


__all__ = ["BlockPoolExhausted", "PrefixCachingAllocator", "block_hash", "match_prefix",
           "prefix_block_hashes", "register_prefix"]
