"""A paged KV cache behind the model's ``cache.update(layer_idx, k, v, meta)`` protocol.

Storage is one pool per layer, ``(num_blocks, B, H_kv, d)`` for K and for V, shared by all
sequences (``cache.k`` / ``cache.v``, views of one tensor ``store`` ``(L, 2, num_blocks + 1,
B, H_kv, d)`` whose last block is a scratch block no sequence gets: the padding lanes of a
fixed-shape step use it); each sequence owns a :class:`~llminfra.kvcache.blocks.BlockTable`.
The rest of the engine reads and writes K/V through the cache's verbs (``read_kv`` /
``write_kv``, ``gather_blocks`` / ``scatter_blocks``, ``layer_blocks``), never its tensors. Once per step,
before the forward pass, :meth:`PagedKVCache.prepare_step` reserves slots for the new tokens of
every sequence of the step (allocating blocks, copying shared last blocks first: copy-on-write)
and returns the step's :class:`~llminfra.attention.StepMetadata` (slot mapping, block tables,
context lengths). Every layer then scatters its new K/V into those slots, and attention reads the
pool through the block tables (Kwon et al., 2023, arXiv:2309.06180, §4.3):
:func:`llminfra.attention.paged.paged_attention` in PyTorch, or the fused Triton kernel
:func:`llminfra.attention.paged_triton.paged_attention_triton` on a GPU.

Sequences: ``add_sequence()`` names a new one; a serving engine (and
:func:`llminfra.model.generate`) names the sequences of each step in ``prepare_step`` — there is
no dense ``(B, T)`` call and no hidden "current batch". ``fork(seq)`` adds a sequence that
shares every block of ``seq`` (parallel sampling, beam search).

Taught in chapter 04; the serving engine of chapter 05 runs on it.
"""

from __future__ import annotations

import torch

from llminfra.attention.step_metadata import StepMetadata
from llminfra.kvcache.blocks import BlockAllocator, BlockPoolExhausted, BlockTable, blocks_needed
from llminfra.kvcache.prefix_cache import PrefixCachingAllocator, match_prefix, register_prefix
from llminfra.model.cache import check_update
from llminfra.validate import positive_int


class PagedKVCache:
    """K/V of many sequences in a pool of ``num_blocks`` blocks of ``block_size`` tokens.

    Works on ragged steps (``needs_step_metadata``): ``meta = prepare_step(seq_ids,
    query_lens)``, then ``model(tokens, cache, meta=meta)``.

    ``PagedKVCache(n_layers, n_kv_heads, head_dim, num_blocks, block_size)``; pass an
    ``allocator`` (e.g. a :class:`~llminfra.kvcache.prefix_cache.PrefixCachingAllocator`) to
    replace the plain one. ``nbytes`` is the pool, ``used_bytes`` the blocks in use.
    """

    needs_step_metadata = True

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", allocator: BlockAllocator | None = None):
        for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads),
                            ("head_dim", head_dim), ("num_blocks", num_blocks),
                            ("block_size", block_size)):
            positive_int(name, value, where="PagedKVCache: ")
        self.allocator = allocator or BlockAllocator(num_blocks, block_size)
        if (self.allocator.num_blocks, self.allocator.block_size) != (num_blocks, block_size):
            raise ValueError("allocator's num_blocks/block_size differ from the cache's")
        # one allocation: K and V of every layer, each with one scratch block past the pool
        # (block ``num_blocks``, never handed out) that the padding lanes of a fixed-shape
        # (CUDA-graph) step write to and read from instead of a sequence's blocks
        self.store = torch.zeros((n_layers, 2, num_blocks + 1, block_size, n_kv_heads,
                                  head_dim), dtype=dtype, device=device)
        self.k = self.store[:, 0, :num_blocks]        # (L, num_blocks, B, H_kv, d) views
        self.v = self.store[:, 1, :num_blocks]
        self.n_layers = n_layers
        self.tables: dict[int, BlockTable] = {}
        self._next_id = 0
        self._step = 0                                 # id of the latest prepare_step
        self._undo: list | None = None                 # what rollback_step gives back

    @classmethod
    def for_model(cls, config, num_blocks: int, block_size: int = 16,
                  dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                  allocator: BlockAllocator | None = None) -> "PagedKVCache":
        """A pool shaped for a :class:`llminfra.model.ModelConfig` (layers, K/V heads, head_dim)."""
        return cls(config.n_layers, config.n_kv_heads, config.head_dim, num_blocks, block_size,
                   dtype, device, allocator)

    @property
    def token_kv_shape(self) -> tuple[int, int, int]:
        """``(L, H_kv, d)``: what one token's K (or V) is, over every layer."""
        L, _, _, _, H, d = self.store.shape
        return L, H, d

    @property
    def dtype(self) -> torch.dtype:
        """The pool's dtype."""
        return self.store.dtype

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
        """Release ``seq``'s blocks and forget it."""
        self._table(seq).free()
        del self.tables[seq]

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

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds (a prefix cache's evictable blocks included)."""
        return self.allocator.num_free

    def blocks_to_append(self, seq: int, n: int) -> int:
        """Blocks ``n`` more tokens of ``seq`` take from the pool (copy-on-write included);
        a sequence not yet added needs ``blocks_needed(n)``."""
        if seq is None:
            return blocks_needed(n, self.block_size)
        return self._table(seq).blocks_to_append(n)

    def can_append(self, seq: int | None, n: int, promised: int = 0) -> bool:
        """True if ``n`` more tokens of ``seq`` fit the free blocks, ``promised`` of which are
        already spoken for by this step."""
        return self.blocks_to_append(seq, n) <= self.num_free_blocks - promised

    def truncate(self, seq: int, num_tokens: int) -> None:
        """Keep ``seq``'s first ``num_tokens`` tokens (:meth:`BlockTable.truncate`)."""
        self._table(seq).truncate(num_tokens)

    def seq_len(self, seq: int) -> int:
        """Tokens held by ``seq``."""
        return self._table(seq).num_tokens

    def _table(self, seq: int) -> BlockTable:
        if seq not in self.tables:
            raise KeyError(f"no sequence {seq!r}; live sequences: {sorted(self.tables)}")
        return self.tables[seq]

    # ------------------------------------------------------------- protocol
    def prepare_step(self, seq_ids: list[int], query_lens: list[int],
                     is_prefill: list[bool] | None = None) -> StepMetadata:
        """Reserve slots for ``query_lens[i]`` new tokens of each sequence ``seq_ids[i]`` and
        return the step's :class:`~llminfra.attention.StepMetadata` (paged layout).

        All or nothing: blocks are allocated (copying a shared last block first:
        copy-on-write) for every sequence, or — on
        :class:`~llminfra.kvcache.blocks.BlockPoolExhausted` — for none, and any
        metadata handed out before becomes stale (``update`` refuses it). Called once per step,
        before layer 0; :meth:`rollback_step` undoes it if the forward pass fails.
        """
        slots = self.reserve_slots(seq_ids, query_lens)
        tables = [self.tables[s] for s in seq_ids]
        return StepMetadata.build(
            seq_ids, query_lens, [t.num_tokens for t in tables], device=self.k.device,
            is_prefill=is_prefill, kv_layout="paged", slot_mapping=slots,
            block_tables=[t.blocks for t in tables], block_size=self.block_size,
            step_id=self._step)

    def reserve_slots(self, seq_ids: list[int], query_lens: list[int]) -> list[int]:
        """The block bookkeeping of :meth:`prepare_step` without the step's metadata: reserve
        the slots (all sequences or none) and return them in order. The serving simulator calls
        it, as its steps run no forward pass."""
        if len(seq_ids) != len(query_lens):
            raise ValueError(f"{len(seq_ids)} seq_ids but {len(query_lens)} query_lens")
        self._step += 1                               # older metadata is stale from here on
        self._undo = None
        slots, done = [], []
        for seq, n in zip(seq_ids, query_lens):
            table = self._table(seq)
            before = table.snapshot()
            try:
                new, copies = table.append(n)
            except BlockPoolExhausted:
                self._undo_appends(done)        # all sequences or none
                raise
            done.append((table, before, copies))
            for src, dst in copies:             # copy-on-write, every layer at once
                self.k[:, dst] = self.k[:, src]
                self.v[:, dst] = self.v[:, src]
            slots.extend(new)
        self._undo = done
        return slots

    def rollback_step(self, meta: StepMetadata) -> None:
        """Undo the reservation of the step ``meta`` belongs to (if it is the latest): its new
        blocks go back, tables return to their lengths before, copy-on-write is reverted."""
        if meta.step_id == self._step:
            self.rollback_last()

    def _undo_appends(self, done: list) -> None:
        """Give back what the sequences appended (:meth:`BlockTable.restore`)."""
        for table, snap, copies in reversed(done):
            table.restore(snap, copies)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor,
               meta: StepMetadata | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter the step's new k, v ``(N, H_kv, d)`` into the slots ``meta.slot_mapping``
        reserved; return the layer's pools ``(num_blocks, B, H_kv, d)`` (``meta.kv_layout`` is
        ``"paged"``: attention reads them through ``meta.block_tables``).

        ``meta`` must come from the latest :meth:`prepare_step`: metadata of an earlier or a
        failed step is refused, so a layer can never write into slots nobody reserved.
        """
        if meta is None:
            raise ValueError("PagedKVCache.update needs the step's metadata: meta = "
                             "cache.prepare_step(seq_ids, query_lens), then "
                             "model(tokens, cache, meta=meta)")
        check_update(layer_idx, self.n_layers, k, v, meta)
        N, H_kv, d = k.shape
        if (H_kv, d) != tuple(self.k.shape[3:]):
            raise ValueError(f"k has (H_kv, d) = {(H_kv, d)}, the pool {tuple(self.k.shape[3:])}")
        if meta.kv_layout != "paged" or meta.step_id != self._step or self._undo is None:
            raise ValueError(f"stale step metadata (step {meta.step_id}, cache at step "
                             f"{self._step}): call prepare_step for this forward pass")
        k_flat = self.k[layer_idx].view(-1, H_kv, d)      # (num_blocks·B, H_kv, d)
        v_flat = self.v[layer_idx].view(-1, H_kv, d)
        k_flat[meta.slot_mapping] = k.to(k_flat.dtype)
        v_flat[meta.slot_mapping] = v.to(v_flat.dtype)
        return self.k[layer_idx], self.v[layer_idx]

    # --------------------------------------------------- the fast runner's view
    @property
    def scratch_block(self) -> int:
        """The block id of the scratch block (one past the pool): padding lanes of a
        fixed-shape step write and read it, so that they touch no sequence's K/V."""
        return self.allocator.num_blocks

    def layer_blocks(self, layer_idx: int) -> torch.Tensor:
        """Layer ``layer_idx``'s K and V blocks as one tensor ``(2 · (num_blocks + 1), B, H_kv,
        d)``: K block b at row b, V block b at row ``num_blocks + 1 + b`` (scratch included).
        The fast model runner gathers and writes both with one op each through it."""
        return self.store[layer_idx].flatten(0, 1)

    def block_table(self, seq: int) -> list[int]:
        """``seq``'s physical block ids, in token order."""
        return list(self._table(seq).blocks)

    def last_block_shared(self, seq: int) -> bool:
        """True when another sequence holds ``seq``'s last block too (its next token copies
        it first: copy-on-write)."""
        blocks = self._table(seq).blocks
        return bool(blocks) and self.allocator.ref_count(blocks[-1]) > 1

    # ------------------------------------------------- K/V in and out, by block and token
    def gather_blocks(self, block_ids: list[int]) -> torch.Tensor:
        """K and V of ``block_ids``, every layer: ``(L, 2, len(block_ids), B, H_kv, d)`` (a copy).
        Swapping out to CPU memory (:mod:`.offload`) and handing a request off to another
        engine both read the pool through it."""
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.store.device)
        return self.store[:, :, ids]

    def scatter_blocks(self, block_ids: list[int], kv: torch.Tensor) -> None:
        """Write ``kv`` ``(L, 2, len(block_ids), B, H_kv, d)`` into ``block_ids``."""
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.store.device)
        self.store[:, :, ids] = kv.to(device=self.store.device, dtype=self.store.dtype)

    def read_kv(self, seq: int, num_tokens: int | None = None) -> torch.Tensor:
        """K and V of ``seq``'s first ``num_tokens`` tokens (default all it holds):
        ``(2, L, T, H_kv, d)``."""
        table = self._table(seq)
        T = table.num_tokens if num_tokens is None else num_tokens
        if not 0 <= T <= table.num_tokens:
            raise ValueError(f"read_kv: {T} tokens asked of a sequence holding "
                             f"{table.num_tokens}")
        kv = self.gather_blocks(table.blocks).flatten(2, 3)[:, :, :T]   # (L, 2, T, H_kv, d)
        return kv.transpose(0, 1).contiguous()

    def check_kv(self, kv: torch.Tensor) -> None:
        """``ValueError`` unless ``kv`` is ``(2, L, T, H_kv, d)`` for this pool and floating
        point (integers would become wrong values in the pool)."""
        L, H, d = self.token_kv_shape
        if kv.dim() != 5 or kv.shape[0] != 2 or (kv.shape[1], kv.shape[3], kv.shape[4]) != (L, H, d):
            raise ValueError(f"kv has shape {tuple(kv.shape)}; the pool needs "
                             f"(2, L={L}, T, H_kv={H}, d={d})")
        if not kv.is_floating_point():
            raise ValueError(f"K/V of dtype {kv.dtype}; a floating-point K/V is needed (cast to "
                             f"the pool's {self.dtype}, integers would become wrong values)")

    def write_kv(self, seq: int, kv: torch.Tensor) -> list[int]:
        """Append ``kv`` ``(2, L, T, H_kv, d)`` to ``seq``: reserve T slots (all or nothing,
        :meth:`reserve_slots`) and write the K/V into them; returns the slots. ``ValueError``
        for a shape that does not fit the pool or a K/V that is not floating point."""
        self.check_kv(kv)
        slots = self.reserve_slots([seq], [kv.shape[2]])
        index = torch.tensor(slots, dtype=torch.long, device=self.store.device)
        rows = self.store.flatten(2, 3)                       # (L, 2, (num_blocks+1)·B, H_kv, d)
        rows[:, :, index] = kv.transpose(0, 1).to(device=self.store.device,
                                                  dtype=self.store.dtype)
        return slots

    def rollback_last(self) -> None:
        """Undo the latest :meth:`reserve_slots` (a failed forward pass of the fast runner,
        which builds no :class:`StepMetadata`)."""
        if self._undo is not None:
            self._undo_appends(self._undo)
            self._undo = None
            self._step += 1

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
