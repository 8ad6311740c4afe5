"""The KV cache quantized: keys and values stored in int8 or fp8, one scale per token and head.

Quantizing the *weights* leaves the KV cache as it was: it still holds
``2 · layers · kv_heads · head_dim · bytes`` per token in the activation dtype. Storing K and V
in 8 bits halves it (vs 16-bit). Each new vector ``k_t (d,)`` of a head gets its own absmax
scale (fp16): int8 ``k̂ = round(k / s) · s`` with ``s = max|k| / 127``; fp8 e4m3 stores
``k / s`` with ``s = max|k| / 448`` in ``torch.float8_e4m3fn``. ``update`` follows the cache
protocol of :mod:`llminfra.model` (``k_all, v_all = cache.update(layer, k, v)``) and returns
the dequantized keys and values, so attention reads exactly what was stored. (vLLM's fp8 KV
cache uses per-tensor scales; per-token scales cost ``2 / d`` bytes more per value.) Chapter 03.
"""

from __future__ import annotations

import math

import torch

from llminfra.model.cache import check_update
from llminfra.validate import positive_int
from llminfra.model import DenseKVCache

KV_FORMATS = ("int8", "fp8-e4m3")


def quantize_vectors(x: torch.Tensor, kv_format: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (..., d)`` -> ``(codes (..., d), scale (..., 1) fp16)`` along the last axis."""
    if kv_format not in KV_FORMATS:
        raise KeyError(f"unknown KV format {kv_format!r}; allowed: {KV_FORMATS}")
    top = 127.0 if kv_format == "int8" else 448.0
    scale = (x.detach().abs().amax(-1, keepdim=True).float() / top).to(torch.float16)
    s = scale.float()
    s = torch.where(s == 0, torch.ones_like(s), s)
    y = (x.float() / s).clamp(-top, top)
    codes = torch.round(y).to(torch.int8) if kv_format == "int8" else y.to(torch.float8_e4m3fn)
    return codes, scale


def dequantize_vectors(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize_vectors`."""
    return (codes.float() * scale.float()).to(dtype)


class QuantizedKVCache:
    """KV cache holding int8 / fp8 codes and fp16 scales; same protocol as ``DenseKVCache``.

    ``QuantizedKVCache(n_layers, kv_format="int8")``; ``update(layer_idx, k, v)`` with k, v
    ``(B, H_kv, T, d)`` returns all keys / values ``(B, H_kv, S, d)`` dequantized.
    """

    def __init__(self, n_layers: int, kv_format: str = "int8"):
        positive_int("n_layers", n_layers)
        if kv_format not in KV_FORMATS:
            raise KeyError(f"unknown KV format {kv_format!r}; allowed: {KV_FORMATS}")
        self.n_layers, self.kv_format = n_layers, kv_format
        self.reset()

    def reset(self) -> None:
        """Forget everything."""
        self.store: list[list[tuple[torch.Tensor, torch.Tensor]] | None] = [None] * self.n_layers

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor):
        """Quantize and append ``k, v (B, H_kv, T, d)``; return all of them dequantized."""
        check_update(layer_idx, self.n_layers, k, v)
        old = self.store[layer_idx]
        if old is not None:
            B, H_kv, _, d = old[0][0].shape  # cached K codes (B, H_kv, S, d)
            if (k.shape[0], k.shape[1], k.shape[3]) != (B, H_kv, d):
                raise ValueError(f"new k {tuple(k.shape)} does not continue the cache of "
                                 f"(B, H_kv, d) = {(B, H_kv, d)}")
        new = [quantize_vectors(t, self.kv_format) for t in (k, v)]
        if old is not None:
            new = [(torch.cat([oc, c], 2), torch.cat([os_, s], 2)) for (oc, os_), (c, s) in zip(old, new)]
        self.store[layer_idx] = new
        return tuple(dequantize_vectors(c, s, k.dtype) for c, s in new)

    @property
    def seq_len(self) -> int:
        """Tokens held (layer 0)."""
        return 0 if self.store[0] is None else self.store[0][0][0].shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of all codes and scales."""
        return sum(t.numel() * t.element_size() for layer in self.store if layer
                   for pair in layer for t in pair)


@torch.no_grad()
def kv_perplexity(model, token_ids: torch.Tensor, kv_format: str | None,
                  seq_len: int | None = None, batch_size: int = 8) -> float:
    """Perplexity of ``model`` on 1-D ``token_ids`` with its KV cache stored in ``kv_format``
    (``None``: the plain ``DenseKVCache``), windows of ``seq_len`` as
    :func:`llminfra.model.perplexity` does. Every query attends to the *stored* keys/values."""
    tokens = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    seq_len = seq_len or model.config.max_seq_len
    n = (tokens.numel() - 1) // seq_len
    if n < 1:
        raise ValueError(f"need more than {seq_len} tokens, got {tokens.numel()}")
    windows = torch.stack([tokens[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])
    total = 0.0
    for b in range(0, n, batch_size):
        x = windows[b:b + batch_size]
        n_layers = model.config.n_layers
        cache = DenseKVCache(n_layers) if kv_format is None else QuantizedKVCache(n_layers, kv_format)
        logits = model(x[:, :-1], cache=cache, start_pos=0)
        total += float(torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), x[:, 1:].flatten(), reduction="sum"))
    return math.exp(total / (n * seq_len))
