"""The simplest KV cache: one growing tensor per layer, extended by concatenation.

Protocol (what :class:`llminfra.model.Transformer` needs from any cache): each attention layer
calls ``k_all, v_all = cache.update(layer_idx, k, v)`` with the new, already rotated keys and
values ``(B, H_kv, T, d)`` and gets every key and value so far, ``(B, H_kv, S, d)``, S = tokens
before + T. :mod:`llminfra.kvcache` provides the contiguous pre-reserved and the paged designs
(Kwon et al. 2023, arXiv:2309.06180) behind the same call.

Cost: concatenation copies the whole cache at every step, O(S) bytes per token per layer —
the reason real engines reserve or page memory instead (chapter 04).

Taught in chapter 04 (``notebooks/04_kv_cache_and_paged_attention.ipynb``).
"""

from __future__ import annotations

import torch



def check_update(layer_idx: int, n_layers: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Validate the arguments of the cache protocol's ``update(layer_idx, k, v)``: a layer in
    ``[0, n_layers)`` and k, v of one shape ``(B, H_kv, T, d)``. Every cache calls this."""
    if not 0 <= layer_idx < n_layers:
        raise ValueError(f"layer_idx {layer_idx} out of range [0, {n_layers})")
    if k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"k and v must both be (B, H_kv, T, d), got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")

class DenseKVCache:
    """A KV cache that grows by ``torch.cat`` along the token axis.

    ``DenseKVCache(n_layers)``; ``update(layer_idx, k, v)`` takes k, v ``(B, H_kv, T, d)`` and
    returns the layer's keys and values ``(B, H_kv, S, d)``. ``seq_len`` is the number of tokens
    held (read from layer 0), ``nbytes`` the bytes of all K and V tensors.

    Worked example: tiny model (L = 4, H_kv = 4, d = 32, float32) holding 100 tokens of one
    sequence: 2 · 4 · 4 · 32 · 4 B · 100 = 409,600 B.
    """

    def __init__(self, n_layers: int):
        if not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"n_layers must be a positive int, got {n_layers!r}")
        self.n_layers = n_layers
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers

    def update(self, layer_idx: int, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v ``(B, H_kv, T, d)`` to layer ``layer_idx``; return all
        ``(B, H_kv, S, d)``."""
        check_update(layer_idx, self.n_layers, k, v)
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
