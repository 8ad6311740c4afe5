"""The simplest KV cache: one growing tensor per layer, extended by concatenation.

Protocol (what :class:`llminfra.model.Transformer` needs from any cache): each attention layer
calls ``k_all, v_all = cache.update(layer_idx, k, v)`` with the new, already rotated keys and
values ``(B, H_kv, T, d)`` and gets every key and value so far, ``(B, H_kv, S, d)``, S = tokens
before + T. :mod:`llminfra.kvcache` provides the contiguous pre-reserved and the paged designs
(Kwon et al. 2023, arXiv:2309.06180) behind the same call.

Ragged steps (a serving engine's batch, chapter 05): ``meta = cache.prepare_step(seq_ids,
query_lens)`` once per step, then each layer calls ``cache.update(layer_idx, k, v, meta)`` with
the step's flat ``(N, H_kv, d)`` keys and values; the cache returns them in the layout
``meta.kv_layout`` names (:mod:`llminfra.attention.step_metadata`). ``rollback_step(meta)``
undoes a step whose forward pass failed.

Cost: concatenation copies the whole cache at every step, O(S) bytes per token per layer —
the reason real engines reserve or page memory instead (chapter 04).

Taught in chapter 04 (``notebooks/04_kv_cache_and_paged_attention.ipynb``).
"""

from __future__ import annotations

import torch

from llminfra.attention.step_metadata import StepMetadata
from llminfra.validate import positive_int


def check_update(layer_idx: int, n_layers: int, k: torch.Tensor, v: torch.Tensor,
                 meta: StepMetadata | None = None) -> None:
    """Validate the arguments of the cache protocol's ``update(layer_idx, k, v[, meta])``: a
    layer in ``[0, n_layers)`` and k, v of one shape ``(B, H_kv, T, d)`` — or, with a step's
    ``meta``, ``(N, H_kv, d)`` with N its token count. Every cache calls this."""
    if not 0 <= layer_idx < n_layers:
        raise ValueError(f"layer_idx {layer_idx} out of range [0, {n_layers})")
    if meta is None:
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"k and v must both be (B, H_kv, T, d), got {tuple(k.shape)} and "
                             f"{tuple(v.shape)}")
        return
    if not isinstance(meta, StepMetadata):
        raise ValueError(f"meta must be a StepMetadata, got {type(meta).__name__}")
    if k.dim() != 3 or k.shape != v.shape or k.shape[0] != meta.num_tokens:
        raise ValueError(f"k and v of a ragged step must both be (N={meta.num_tokens}, H_kv, d), "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")


def pad_sequences(per_seq: list[torch.Tensor]) -> torch.Tensor:
    """Stack ``(H_kv, S_i, d)`` tensors into ``(n, H_kv, max S_i, d)``, zeros after S_i (the
    ``"padded"`` layout of :class:`~llminfra.attention.StepMetadata`)."""
    H_kv, _, d = per_seq[0].shape
    S_max = max(t.shape[1] for t in per_seq)
    out = per_seq[0].new_zeros(len(per_seq), H_kv, S_max, d)
    for i, t in enumerate(per_seq):
        out[i, :, :t.shape[1]] = t
    return out


class DenseKVCache:
    """A KV cache that grows by ``torch.cat`` along the token axis.

    ``DenseKVCache(n_layers)``; ``update(layer_idx, k, v)`` takes k, v ``(B, H_kv, T, d)`` and
    returns the layer's keys and values ``(B, H_kv, S, d)``. ``seq_len`` is the number of tokens
    held (read from layer 0), ``nbytes`` the bytes of all K and V tensors.

    Worked example: tiny model (L = 4, H_kv = 4, d = 32, float32) holding 100 tokens of one
    sequence: 2 · 4 · 4 · 32 · 4 B · 100 = 409,600 B.
    """

    def __init__(self, n_layers: int):
        self.n_layers = positive_int("n_layers", n_layers)
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self._seq: dict[int, list[list[torch.Tensor | None]]] = {}   # ragged: id -> [K, V] by layer
        self._lens: dict[int, int] = {}
        self._step, self._undo = 0, None

    # ---------------------------------------------------------------- ragged steps
    def prepare_step(self, seq_ids: list[int], query_lens: list[int],
                     is_prefill: list[bool] | None = None) -> StepMetadata:
        """Start a ragged step: sequence ``seq_ids[i]`` (any int; new ids start empty) brings
        ``query_lens[i]`` tokens. Returns metadata with the ``"padded"`` layout."""
        if len(seq_ids) != len(query_lens):
            raise ValueError(f"{len(seq_ids)} seq_ids but {len(query_lens)} query_lens")
        self._step += 1
        self._undo = {s: self._lens.get(s, 0) for s in seq_ids}
        ctx = [self._undo[s] + int(t) for s, t in zip(seq_ids, query_lens)]
        meta = StepMetadata.build(seq_ids, query_lens, ctx, is_prefill=is_prefill,
                                  kv_layout="padded", step_id=self._step)
        for s, c in zip(seq_ids, ctx):
            self._lens[s] = c
            self._seq.setdefault(s, [[None] * self.n_layers, [None] * self.n_layers])
        return meta

    def rollback_step(self, meta: StepMetadata) -> None:
        """Forget what the step ``meta`` (the latest) wrote: lengths and K/V as before it."""
        if meta.step_id != self._step or self._undo is None:
            return
        for s, n in self._undo.items():
            self._lens[s] = n
            for kv in self._seq[s]:
                kv[:] = [None if t is None or n == 0 else t[:, :n] for t in kv]
        self._undo, self._step = None, self._step + 1

    def free(self, seq: int) -> None:
        """Forget ragged sequence ``seq``."""
        self._seq.pop(seq, None)
        self._lens.pop(seq, None)

    def _update_step(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor,
                     meta: StepMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if meta.kv_layout != "padded" or meta.step_id != self._step or self._undo is None:
            raise ValueError(f"stale step metadata (step {meta.step_id}, cache at step "
                             f"{self._step}): call prepare_step for this forward pass")
        starts = meta.query_start_loc.tolist()
        out = []
        for i, s in enumerate(meta.seq_ids):
            layers = self._seq[s]
            for kv, new in ((layers[0], k), (layers[1], v)):
                piece = new[starts[i]:starts[i + 1]].transpose(0, 1)      # (H_kv, T_i, d)
                kv[layer_idx] = piece if kv[layer_idx] is None else torch.cat(
                    [kv[layer_idx], piece], dim=1)                          # (H_kv, S_i, d)
            out.append((layers[0][layer_idx], layers[1][layer_idx]))
        return pad_sequences([a for a, _ in out]), pad_sequences([b for _, b in out])

    # ------------------------------------------------------------------ protocol
    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor,
               meta: StepMetadata | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v ``(B, H_kv, T, d)`` to layer ``layer_idx``; return all
        ``(B, H_kv, S, d)``. With a step's ``meta``: append each sequence's slice of the flat
        ``(N, H_kv, d)`` k, v and return ``(n, H_kv, S_max, d)`` padded."""
        check_update(layer_idx, self.n_layers, k, v, meta)
        if meta is not None:
            return self._update_step(layer_idx, k, v, meta)
        old_k = self.k[layer_idx]
        if old_k is None:
            self.k[layer_idx], self.v[layer_idx] = k, v
        else:
            if old_k.shape[:2] != k.shape[:2] or old_k.shape[3] != k.shape[3]:
                raise ValueError(f"new k {tuple(k.shape)} does not match the cached "
                                 f"{tuple(old_k.shape)} in batch, heads or head_dim")
            self.k[layer_idx] = torch.cat([old_k, k], dim=2)  # (B, H_kv, S, d)
            self.v[layer_idx] = torch.cat([self.v[layer_idx], v], dim=2)
        return self.k[layer_idx], self.v[layer_idx]

    @property
    def seq_len(self) -> int:
        """Tokens held (layer 0's count; every layer agrees after a full forward pass)."""
        return 0 if self.k[0] is None else self.k[0].shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held by all cached K and V tensors."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)

    def reset(self) -> None:
        """Forget everything (start a new sequence)."""
        self.k = [None] * self.n_layers
        self.v = [None] * self.n_layers
