"""A paged KV cache behind the model's ``cache.update(layer_idx, k, v)`` protocol.

Storage is one pool per layer, ``(num_blocks, B, H_kv, d)`` for K and for V, shared by all
sequences; each sequence owns a :class:`~llminfra.kvcache.block_table.BlockTable`. In one forward
pass the first layer reserves slots for the new tokens (allocating blocks, copying shared last
blocks first: copy-on-write), every layer scatters its new K/V into those slots, then gathers the
sequence's K/V back in token order for attention (Kwon et al., 2023, arXiv:2309.06180, §4.3).
Gathering into a dense tensor keeps the model unchanged; the fused kernel that reads the pool
directly is :mod:`llminfra.kvcache.paged_attention_triton`.

Sequences: ``cache.batch`` lists the sequence ids that the rows of the next forward pass refer
to. If it is empty when a forward starts, one new sequence per row is created. ``fork(seq)``
adds a sequence that shares every block of ``seq`` (parallel sampling, beam search).

Taught in chapter 04.
"""

from __future__ import annotations

import torch

from llminfra.kvcache.block_allocator import BlockAllocator, BlockPoolExhausted
from llminfra.kvcache.block_table import BlockTable
from llminfra.kvcache.prefix_cache import PrefixCachingAllocator, match_prefix, register_prefix
from llminfra.model.cache import check_update


class PagedKVCache:
    """K/V of many sequences in a pool of ``num_blocks`` blocks of ``block_size`` tokens.

    ``PagedKVCache(n_layers, n_kv_heads, head_dim, num_blocks, block_size)``; pass an
    ``allocator`` (e.g. a :class:`~llminfra.kvcache.prefix_cache.PrefixCachingAllocator`) to
    replace the plain one. ``nbytes`` is the pool, ``used_bytes`` the blocks in use.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", allocator: BlockAllocator | None = None):
        self.allocator = allocator or BlockAllocator(num_blocks, block_size)
        if (self.allocator.num_blocks, self.allocator.block_size) != (num_blocks, block_size):
            raise ValueError("allocator's num_blocks/block_size differ from the cache's")
        shape = (n_layers, num_blocks, block_size, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.n_layers = n_layers
        self.tables: dict[int, BlockTable] = {}
        self.batch: list[int] = []
        self._next_id = 0
        self._new_slots: torch.Tensor | None = None   # (rows, T) slots written this forward

    @classmethod
    def for_model(cls, config, num_blocks: int, block_size: int = 16,
                  dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                  allocator: BlockAllocator | None = None) -> "PagedKVCache":
        """A pool shaped for a :class:`llminfra.model.ModelConfig` (layers, K/V heads, head_dim)."""
        return cls(config.n_layers, config.n_kv_heads, config.head_dim, num_blocks, block_size,
                   dtype, device, allocator)

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self.allocator.block_size

    # ------------------------------------------------------------ sequences
    def add_sequence(self) -> int:
        """A new, empty sequence; returns its id."""
        seq = self._next_id
        self._next_id += 1
        self.tables[seq] = BlockTable(self.allocator)
        return seq

    def fork(self, seq: int) -> int:
        """A new sequence sharing every block of ``seq`` (no K/V copied); returns its id."""
        child = self._next_id
        self._next_id += 1
        self.tables[child] = self._table(seq).fork()
        return child

    def free(self, seq: int) -> None:
        """Release ``seq``'s blocks and forget it (also drops it from ``batch``)."""
        self._table(seq).free()
        del self.tables[seq]
        self.batch = [s for s in self.batch if s != seq]

    def add_prefix_sequence(self, tokens: list[int]) -> tuple[int, int]:
        """A new sequence starting with the longest cached prefix of ``tokens``.

        Returns ``(seq, n_cached)``: run the model on ``tokens[n_cached:]`` with
        ``start_pos=n_cached``, then call :meth:`cache_prefix`. Needs a
        :class:`~llminfra.kvcache.prefix_cache.PrefixCachingAllocator`.
        """
        if not isinstance(self.allocator, PrefixCachingAllocator):
            raise ValueError("prefix caching needs PagedKVCache(..., allocator="
                             "PrefixCachingAllocator(num_blocks, block_size))")
        seq = self._next_id
        self._next_id += 1
        self.tables[seq], n_cached = match_prefix(self.allocator, list(tokens))
        return seq, n_cached

    def cache_prefix(self, seq: int, tokens: list[int]) -> None:
        """Record ``seq``'s full blocks (K/V of ``tokens`` already written) in the prefix cache."""
        if not isinstance(self.allocator, PrefixCachingAllocator):
            raise ValueError("prefix caching needs a PrefixCachingAllocator")
        register_prefix(self.allocator, self._table(seq), list(tokens))

    def seq_len(self, seq: int) -> int:
        """Tokens held by ``seq``."""
        return self._table(seq).num_tokens

    def _table(self, seq: int) -> BlockTable:
        if seq not in self.tables:
            raise KeyError(f"no sequence {seq!r}; live sequences: {sorted(self.tables)}")
        return self.tables[seq]

    # ------------------------------------------------------------- protocol
    def _begin_forward(self, rows: int, T: int) -> None:
        if not self.batch:
            self.batch = [self.add_sequence() for _ in range(rows)]
        if len(self.batch) != rows:
            raise ValueError(f"the forward pass has {rows} rows but cache.batch lists "
                             f"{len(self.batch)} sequences {self.batch}")
        slots, done = [], []
        for seq in self.batch:
            table = self._table(seq)
            before = (list(table.blocks), table.num_tokens)
            try:
                new, copies = table.append(T)
            except BlockPoolExhausted:
                self._undo_appends(done)        # all rows or none: lengths stay equal
                raise
            done.append((table, before, copies))
            for src, dst in copies:             # copy-on-write, every layer at once
                self.k[:, dst] = self.k[:, src]
                self.v[:, dst] = self.v[:, src]
            slots.append(new)
        self._new_slots = torch.tensor(slots, dtype=torch.long, device=self.k.device)

    def _undo_appends(self, done: list) -> None:
        """Give back what the rows appended before the pool ran out: their new blocks, and the
        shared blocks that copy-on-write had let go."""
        for table, (blocks, num_tokens), copies in reversed(done):
            for src, _ in copies:
                self.allocator.incref(src)
            for b in table.blocks:
                if b not in blocks:
                    self.allocator.free(b)
            table.blocks, table.num_tokens = blocks, num_tokens

    def update(self, layer_idx: int, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter k, v ``(rows, H_kv, T, d)`` into the pool; gather ``(rows, H_kv, S, d)`` back.

        Layer 0 reserves the slots (and may raise
        :class:`~llminfra.kvcache.block_allocator.BlockPoolExhausted`); every sequence in the
        batch must hold the same number of tokens S, as the model works on dense tensors.
        """
        check_update(layer_idx, self.n_layers, k, v)
        rows, H_kv, T, d = k.shape
        if (H_kv, d) != tuple(self.k.shape[3:]):
            raise ValueError(f"k has (H_kv, d) = {(H_kv, d)}, the pool {tuple(self.k.shape[3:])}")
        if layer_idx == 0:
            self._begin_forward(rows, T)
        if self._new_slots is None or self._new_slots.shape != (rows, T):
            raise ValueError("layer 0 must be updated first in each forward pass")
        k_flat = self.k[layer_idx].view(-1, H_kv, d)      # (num_blocks·B, H_kv, d)
        v_flat = self.v[layer_idx].view(-1, H_kv, d)
        idx = self._new_slots.reshape(-1)
        k_flat[idx] = k.transpose(1, 2).reshape(-1, H_kv, d).to(k_flat.dtype)
        v_flat[idx] = v.transpose(1, 2).reshape(-1, H_kv, d).to(v_flat.dtype)
        lengths = {self.tables[s].num_tokens for s in self.batch}
        if len(lengths) != 1:
            raise ValueError(f"sequences in one batch hold different lengths {sorted(lengths)}; "
                             "the dense model needs equal lengths")
        all_slots = torch.tensor([self.tables[s].slots() for s in self.batch],
                                 dtype=torch.long, device=self.k.device)          # (rows, S)
        K = k_flat[all_slots].transpose(1, 2)               # (rows, H_kv, S, d)
        V = v_flat[all_slots].transpose(1, 2)
        return K.to(k.dtype), V.to(v.dtype)

    # ------------------------------------------------------------ accounting
    @property
    def nbytes(self) -> int:
        """Bytes of the whole pool (all layers, K and V)."""
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def used_bytes(self) -> int:
        """Bytes of the blocks in use."""
        return self.nbytes * self.allocator.num_used // self.allocator.num_blocks

    def block_tables(self) -> dict[int, list[int]]:
        """Sequence id -> its physical block ids, in token order."""
        return {s: list(t.blocks) for s, t in self.tables.items()}
