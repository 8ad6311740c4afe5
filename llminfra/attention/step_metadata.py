"""The step metadata: what one forward pass of a serving step needs to know, built once per step.

A continuous-batching step mixes, in ONE forward pass, prefill chunks of different lengths and
single-token decodes of many sequences. The tokens of all of them are laid end to end in one flat
token dimension of N = Σ T_i tokens (no padding), and this object says where each one belongs.
For a step of n sequences, sequence i brings T_i new tokens and holds S_i tokens (its context)
once they are written::

    tokens          [ a0 a1 a2 a3 | b7 | c3 c4 ]        N = 4 + 1 + 2 = 7, n = 3
    query_lens      [ 4, 1, 2 ]                           T_i
    context_lens    [ 4, 8, 5 ]                           S_i (T_i new + S_i - T_i cached)
    query_start_loc [ 0, 4, 5, 7 ]                        cumulative T_i
    positions       [ 0 1 2 3 | 7 | 3 4 ]                 S_i - T_i .. S_i - 1
    slot_mapping    [ where each new token's K/V goes in a paged pool ]      (paged caches)
    block_tables    [ each sequence's physical blocks, padded ] (n, max_blocks) (paged caches)

It flows ``model(tokens, cache, meta=meta)`` → ``cache.update(layer, k, v, meta)`` →
``ragged_attention(q, k, v, meta)``: the cache that builds it (``cache.prepare_step``) reserves
the slots once, before layer 0, so no layer has to guess which step it is in. This is the
structure of vLLM's ``AttentionMetadata`` (Kwon et al. 2023, arXiv:2309.06180, §4.3 and the vLLM
source) and of nano-vllm's ``Context``, passed explicitly here instead of through a global.

``kv_layout`` names what ``cache.update`` returns for attention: ``"paged"`` (the layer's pools
``(num_blocks, B, H_kv, d)``, read through ``block_tables``), ``"padded"`` (``(n, H_kv, S_max,
d)``, sequence i valid up to S_i) or ``"flat"`` (no cache: the step's own ``(N, H_kv, d)`` keys;
every S_i = T_i).

Taught in chapter 05 (serving and continuous batching).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

KV_LAYOUTS = ("paged", "padded", "flat")


@dataclass(frozen=True)
class StepMetadata:
    """Everything about one step's ragged batch; see the module docstring for a worked example.

    Per sequence (length n): ``seq_ids`` (the cache's ids), ``query_lens`` T_i, ``context_lens``
    S_i, ``is_prefill`` (True while the sequence is still reading its prompt). Per token (length
    N): ``positions``. ``query_start_loc`` ``(n + 1,)`` cumulative T_i. Paged caches add
    ``slot_mapping`` ``(N,)``, ``block_tables`` ``(n, max_blocks)`` and ``block_size``.
    ``step_id`` lets a cache refuse metadata of an older step; ``logits_indices`` (flat token
    rows) asks the model for the logits of those tokens only.
    """

    seq_ids: tuple[int, ...]
    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    is_prefill: tuple[bool, ...]
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    kv_layout: str = "flat"
    slot_mapping: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    block_size: int | None = None
    step_id: int = 0
    logits_indices: torch.Tensor | None = None

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, seq_ids: Sequence[int], query_lens: Sequence[int],
              context_lens: Sequence[int], *, device: torch.device | str = "cpu",
              is_prefill: Sequence[bool] | None = None, kv_layout: str = "flat",
              slot_mapping: Sequence[int] | torch.Tensor | None = None,
              block_tables: Sequence[Sequence[int]] | None = None,
              block_size: int | None = None, step_id: int = 0) -> "StepMetadata":
        """Check the per-sequence lists and derive positions and ``query_start_loc``.

        ``ValueError`` unless the lists have one entry per sequence, every T_i >= 1,
        S_i >= T_i, sequence ids are distinct, and ``kv_layout`` is one of :data:`KV_LAYOUTS`.
        ``is_prefill`` defaults to ``T_i > 1``. ``block_tables`` rows are padded with block 0
        (never read: attention stops at S_i).
        """
        seq_ids, query_lens, context_lens = (tuple(int(x) for x in xs)
                                             for xs in (seq_ids, query_lens, context_lens))
        n = len(seq_ids)
        if n == 0:
            raise ValueError("a step needs at least one sequence; seq_ids is empty")
        if len(query_lens) != n or len(context_lens) != n:
            raise ValueError(f"{n} seq_ids but {len(query_lens)} query_lens and "
                             f"{len(context_lens)} context_lens; give one of each per sequence")
        if len(set(seq_ids)) != n:
            raise ValueError(f"a sequence appears twice in one step: seq_ids {list(seq_ids)}")
        bad = [(s, t, c) for s, t, c in zip(seq_ids, query_lens, context_lens)
               if t < 1 or c < t]
        if bad:
            raise ValueError(f"need query_len >= 1 and context_len >= query_len per sequence; "
                             f"(seq, T, S) = {bad[:3]}")
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout {kv_layout!r}; allowed: {KV_LAYOUTS}")
        prefill = (tuple(t > 1 for t in query_lens) if is_prefill is None
                   else tuple(bool(p) for p in is_prefill))
        if len(prefill) != n:
            raise ValueError(f"is_prefill has {len(prefill)} entries for {n} sequences")
        positions = torch.cat([torch.arange(c - t, c, dtype=torch.long)
                               for t, c in zip(query_lens, context_lens)]).to(device)
        starts = torch.tensor([0, *query_lens], dtype=torch.long).cumsum(0).to(device)
        slots = None
        if slot_mapping is not None:
            slots = torch.as_tensor(slot_mapping, dtype=torch.long).to(device)
            if slots.shape != (sum(query_lens),):
                raise ValueError(f"slot_mapping has shape {tuple(slots.shape)}, want "
                                 f"({sum(query_lens)},): one slot per new token")
        tables = None
        if block_tables is not None:
            if len(block_tables) != n:
                raise ValueError(f"{len(block_tables)} block tables for {n} sequences")
            width = max(1, max(len(t) for t in block_tables))
            tables = torch.tensor([list(t) + [0] * (width - len(t)) for t in block_tables],
                                  dtype=torch.long).to(device)
        return cls(seq_ids, query_lens, context_lens, prefill, positions, starts, kv_layout,
                   slots, tables, block_size, step_id)

    def with_logits_indices(self, indices: Sequence[int] | torch.Tensor) -> "StepMetadata":
        """The same step, asking the model for the logits of flat token rows ``indices`` only
        (the engine wants each sequence's last token, not every prefill position)."""
        idx = torch.as_tensor(indices, dtype=torch.long).to(self.positions.device)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.num_tokens):
            raise ValueError(f"logits_indices must lie in [0, {self.num_tokens}), got "
                             f"{idx.tolist()[:8]}")
        return dataclasses.replace(self, logits_indices=idx)

    # ------------------------------------------------------------------- queries
    @functools.cached_property
    def context_lens_tensor(self) -> torch.Tensor:
        """``context_lens`` as a ``(n,)`` long tensor on the step's device, built once per step
        (not once per layer)."""
        return torch.tensor(self.context_lens, device=self.positions.device)

    @property
    def num_seqs(self) -> int:
        """n, sequences in the step."""
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        """N = Σ T_i, tokens in the flat batch."""
        return sum(self.query_lens)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of sequences still reading their prompt."""
        return sum(t for t, p in zip(self.query_lens, self.is_prefill) if p)

    @property
    def num_decode_tokens(self) -> int:
        """Tokens of sequences generating (one each)."""
        return self.num_tokens - self.num_prefill_tokens

    def token_is_prefill(self) -> torch.Tensor:
        """``(N,)`` bool: True for tokens of prefill sequences."""
        flags = torch.tensor(self.is_prefill, dtype=torch.bool, device=self.positions.device)
        lens = torch.tensor(self.query_lens, device=self.positions.device)
        return flags.repeat_interleave(lens)

    def last_token_indices(self) -> list[int]:
        """Flat row of each sequence's last new token (where its next token is predicted)."""
        return [int(x) - 1 for x in self.query_start_loc[1:].tolist()]
