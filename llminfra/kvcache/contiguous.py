"""Contiguous KV caches: reserved at the maximum length, or grown by doubling.

Before paging, a serving system gave each request one contiguous stretch of memory for its K/V.
Since the output length is unknown in advance, it reserved the *maximum* sequence length
(Orca "Max" in Kwon et al., 2023, arXiv:2309.06180, §3.1 and Fig. 2): a request of ``n`` tokens
holds ``max_len`` slots, so ``max_len - n`` slots are wasted — *reserved* for tokens still to
come, or *internal fragmentation* for tokens that never come. A cache that grows as it goes
(doubling its capacity when full, like ``std::vector``) wastes less but copies its whole
contents on every growth and still leaves up to half its capacity empty.

Both implement the model's cache protocol ``update(layer_idx, k, v) -> (k_all, v_all)`` with
k, v ``(B, H_kv, T, d)`` (see :class:`llminfra.model.cache.DenseKVCache`).

Taught in chapter 04.
"""

from __future__ import annotations

import torch

from llminfra.attention.step_metadata import StepMetadata
from llminfra.model.cache import check_update
from llminfra.validate import positive_int


class ContiguousKVCache:
    """K/V of ``batch`` sequences, each reserved at ``max_seq_len`` slots up front.

    Storage per layer: ``(batch, H_kv, max_seq_len, d)`` allocated in ``__init__``. ``update``
    writes the new tokens at position ``seq_len`` and returns views of positions
    ``0 .. seq_len + T - 1``. ``nbytes`` is the reserved memory, ``used_bytes`` the part
    holding real tokens: ``used / reserved = seq_len / max_seq_len``.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, head_dim: int,
                 max_seq_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        for name, val in (("n_layers", n_layers), ("batch", batch), ("n_kv_heads", n_kv_heads),
                          ("head_dim", head_dim), ("max_seq_len", max_seq_len)):
            positive_int(name, val)
        shape = (n_layers, batch, n_kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len
        self.lengths = [0] * n_layers
        self.row_lengths = [0] * batch          # ragged steps: tokens held by each row
        self._step, self._undo = 0, None

    def prepare_step(self, seq_ids: list[int], query_lens: list[int],
                     is_prefill: list[bool] | None = None) -> StepMetadata:
        """Start a ragged step: sequence ``seq_ids[i]`` is reserved row ``seq_ids[i]`` (0 ..
        batch-1) and brings ``query_lens[i]`` tokens; ``"padded"`` layout."""
        if len(seq_ids) != len(query_lens):
            raise ValueError(f"{len(seq_ids)} seq_ids but {len(query_lens)} query_lens")
        rows = self.k.shape[1]
        bad = [s for s in seq_ids if not (isinstance(s, int) and 0 <= s < rows)]
        if bad:
            raise ValueError(f"sequence ids {bad} are not rows 0..{rows - 1} of this cache")
        ctx = [self.row_lengths[s] + int(t) for s, t in zip(seq_ids, query_lens)]
        if max(ctx) > self.max_seq_len:
            raise ValueError(f"{max(ctx)} tokens exceed the reserved max_seq_len "
                             f"{self.max_seq_len}; reserve more or stop generating")
        meta = StepMetadata.build(seq_ids, query_lens, ctx, device=self.k.device,
                                  is_prefill=is_prefill, kv_layout="padded",
                                  step_id=self._step + 1)
        self._step += 1
        self._undo = {s: self.row_lengths[s] for s in seq_ids}
        for s, c in zip(seq_ids, ctx):
            self.row_lengths[s] = c
        return meta

    def rollback_step(self, meta: StepMetadata) -> None:
        """Undo the latest step: rows back to their lengths before it (slots are overwritten
        by the next step)."""
        if meta.step_id == self._step and self._undo is not None:
            for s, n in self._undo.items():
                self.row_lengths[s] = n
            self._undo, self._step = None, self._step + 1

    def _update_step(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor,
                     meta: StepMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if meta.kv_layout != "padded" or meta.step_id != self._step or self._undo is None:
            raise ValueError(f"stale step metadata (step {meta.step_id}, cache at step "
                             f"{self._step}): call prepare_step for this forward pass")
        rows = torch.tensor(meta.seq_ids, device=self.k.device)
        seq_of_token = torch.repeat_interleave(
            rows, torch.tensor(meta.query_lens, device=self.k.device))   # (N,)
        self.k[layer_idx, seq_of_token, :, meta.positions] = k.to(self.k.dtype)
        self.v[layer_idx, seq_of_token, :, meta.positions] = v.to(self.v.dtype)
        S_max = max(meta.context_lens)
        return self.k[layer_idx, rows, :, :S_max], self.v[layer_idx, rows, :, :S_max]

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor,
               meta: StepMetadata | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ``(B, H_kv, T, d)`` after the cached tokens; return views ``(B, H_kv, S, d)``.
        With a step's ``meta``: write the flat ``(N, H_kv, d)`` k, v at each token's row and
        position; return ``(n, H_kv, S_max, d)`` (the step's rows, padded)."""
        check_update(layer_idx, len(self.lengths), k, v, meta)
        if meta is not None:
            return self._update_step(layer_idx, k, v, meta)
        if k.shape[0] != self.k.shape[1] or k.shape[1] != self.k.shape[2] \
                or k.shape[3] != self.k.shape[4]:
            raise ValueError(f"k {tuple(k.shape)} does not match the reserved (batch, H_kv, d) = "
                             f"{(self.k.shape[1], self.k.shape[2], self.k.shape[4])}")
        start, T = self.lengths[layer_idx], k.shape[2]
        if start + T > self.max_seq_len:
            raise ValueError(f"{start + T} tokens exceed the reserved max_seq_len "
                             f"{self.max_seq_len}; reserve more or stop generating")
        self.k[layer_idx, :, :, start:start + T] = k
        self.v[layer_idx, :, :, start:start + T] = v
        self.lengths[layer_idx] = start + T
        return self.k[layer_idx, :, :, :start + T], self.v[layer_idx, :, :, :start + T]

    @property
    def seq_len(self) -> int:
        """Tokens held per sequence (layer 0's count)."""
        return self.lengths[0]

    @property
    def nbytes(self) -> int:
        """Reserved bytes (all layers, K and V)."""
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def used_bytes(self) -> int:
        """Bytes holding real tokens: ``nbytes · seq_len / max_seq_len``."""
        return self.nbytes * self.seq_len // self.max_seq_len


class GrowingKVCache:
    """K/V that start at ``initial_capacity`` slots and double (with a full copy) when full.

    Same protocol as :class:`ContiguousKVCache`; ``nbytes`` is the capacity held and
    ``num_copies`` how many times the contents were copied into a bigger buffer.
    """

    def __init__(self, n_layers: int, initial_capacity: int = 16):
        if not isinstance(n_layers, int) or n_layers < 1 or initial_capacity < 1:
            raise ValueError(f"need n_layers >= 1 and initial_capacity >= 1, got "
                             f"{n_layers!r}, {initial_capacity!r}")
        self.initial_capacity = initial_capacity
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.lengths = [0] * n_layers
        self.num_copies = 0

    def _grow(self, layer_idx: int, like: torch.Tensor, need: int) -> None:
        old = self.k[layer_idx]
        cap = self.initial_capacity if old is None else old.shape[2]
        while cap < need:
            cap *= 2
        if old is not None and cap == old.shape[2]:
            return
        B, H, _, d = like.shape
        new_k = like.new_zeros(B, H, cap, d)
        new_v = like.new_zeros(B, H, cap, d)
        if old is not None:
            n = self.lengths[layer_idx]
            new_k[:, :, :n] = old[:, :, :n]
            new_v[:, :, :n] = self.v[layer_idx][:, :, :n]
            self.num_copies += 1
        self.k[layer_idx], self.v[layer_idx] = new_k, new_v

    def update(self, layer_idx: int, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v ``(B, H_kv, T, d)``, doubling the buffer if needed; return all K/V so far
        ``(B, H_kv, S, d)``."""
        check_update(layer_idx, len(self.lengths), k, v)
        start, T = self.lengths[layer_idx], k.shape[2]
        self._grow(layer_idx, k, start + T)
        self.k[layer_idx][:, :, start:start + T] = k
        self.v[layer_idx][:, :, start:start + T] = v
        self.lengths[layer_idx] = start + T
        return self.k[layer_idx][:, :, :start + T], self.v[layer_idx][:, :, :start + T]

    @property
    def seq_len(self) -> int:
        """Tokens held per sequence (layer 0's count)."""
        return self.lengths[0]

    @property
    def nbytes(self) -> int:
        """Bytes of capacity held (all layers, K and V)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)


def contiguous_waste(lengths: list[int], max_seq_len: int) -> float:
    """Share of reserved slots that hold no token: ``1 - Σ n_i / (N · max_seq_len)``.

    Worked by hand: lengths ``[100, 412]``, max 1024 -> ``1 - 512 / 2048 = 0.75``.
    ``ValueError`` if a length exceeds ``max_seq_len`` or is negative, or the list is empty.
    """
    if not lengths:
        raise ValueError("lengths is empty; give at least one request length")
    bad = [n for n in lengths if not 0 <= n <= max_seq_len]
    if bad:
        raise ValueError(f"lengths {bad} are outside 0..max_seq_len={max_seq_len}")
    return 1.0 - sum(lengths) / (len(lengths) * max_seq_len)
