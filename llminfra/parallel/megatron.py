"""Megatron-LM tensor parallelism of a Llama block, applied to the plain model from outside.

Shoeybi et al., 2019 (arXiv:1909.08053), §3, Fig. 3. Per transformer block and rank ``r`` of
``n``:

* MLP (SwiGLU): ``w1`` and ``w3`` column parallel (each rank keeps ``I/n`` inner features), the
  elementwise ``silu(w1 x) ⊙ (w3 x)`` needs no communication, ``w2`` row parallel: ONE
  all-reduce (``g``) in the forward pass;
* attention: ``wq``, ``wk``, ``wv`` column parallel so each rank owns ``H/n`` query heads and
  ``H_kv/n`` key/value heads (whole heads: attention of one head needs no other head), ``wo``
  row parallel: ONE all-reduce in the forward pass. Grouped-query attention stays right because
  query head ``h`` reads K/V head ``h // (H/H_kv)`` and both ranges are split in the same
  contiguous blocks. Each rank's KV cache holds only its own K/V heads.

So a block costs two all-reduces of ``(tokens, dim)`` activations in the forward pass (and two
in the backward pass through ``f``). Embedding, final norm and output projection stay
replicated (every rank computes the same logits). Taught in chapter 07.
"""

from __future__ import annotations

import torch
from torch import nn

from llminfra.parallel.tensor_parallel import (ColumnParallelLinear, RowParallelLinear,
                                               shard_size)
from llminfra.parallel.world import World
from llminfra.model.config import ModelConfig
from llminfra.model.transformer import FeedForward


def parallel_mlp(mlp: nn.Module, world: World) -> nn.Module:
    """Shard a SwiGLU MLP (``w1``, ``w3``: ``dim -> I``; ``w2``: ``I -> dim``) in place.

    ``ValueError`` if ``world.size`` does not divide ``I``. Returns ``mlp``.
    """
    shard_size(mlp.w1.out_features, world.size, "MLP inner size (ffn_dim)")
    mlp.w1 = ColumnParallelLinear.from_linear(mlp.w1, world)
    mlp.w3 = ColumnParallelLinear.from_linear(mlp.w3, world)
    mlp.w2 = RowParallelLinear.from_linear(mlp.w2, world)
    return mlp


def parallel_attention(attention: nn.Module, world: World) -> nn.Module:
    """Shard an attention module (``wq, wk, wv, wo``, ``n_heads``, ``n_kv_heads``) in place by
    heads: rank ``r`` keeps query heads ``r·H/n … (r+1)·H/n - 1`` and the matching K/V heads.

    ``ValueError`` if ``world.size`` does not divide both ``H`` and ``H_kv``. Returns it.
    """
    shard_size(attention.n_heads, world.size, "number of query heads")
    shard_size(attention.n_kv_heads, world.size, "number of key/value heads")
    attention.wq = ColumnParallelLinear.from_linear(attention.wq, world)
    attention.wk = ColumnParallelLinear.from_linear(attention.wk, world)
    attention.wv = ColumnParallelLinear.from_linear(attention.wv, world)
    attention.wo = RowParallelLinear.from_linear(attention.wo, world)
    attention.n_heads //= world.size
    attention.n_kv_heads //= world.size
    return attention


def apply_tensor_parallel(model: nn.Module, world: World) -> nn.Module:
    """Turn the plain :class:`llminfra.model.transformer.Transformer` into this rank's shard,
    in place: every block's attention and MLP as above. Returns ``model``.

    Every rank must start from the same full weights (load the same checkpoint, or build with
    the same generator seed). All sizes are checked before anything is changed, so a
    ``ValueError`` leaves the model untouched.
    """
    cfg = model.config
    if getattr(cfg, "num_experts", 1) > 1:
        raise ValueError(f"apply_tensor_parallel shards dense MLPs; this model has "
                         f"num_experts={cfg.num_experts}: shard its experts with "
                         f"llminfra.parallel.expert_parallel")
    for total, what in ((cfg.n_heads, "number of query heads"),
                        (cfg.n_kv_heads, "number of key/value heads"),
                        (cfg.ffn_dim, "MLP inner size (ffn_dim)")):
        shard_size(total, world.size, what)
    for layer in model.layers:
        parallel_attention(layer.attention, world)
        parallel_mlp(layer.feed_forward, world)
    model.tensor_parallel_world = world
    return model


def make_mlp(dim: int, ffn_dim: int, generator: torch.Generator | None = None) -> nn.Module:
    """A plain SwiGLU MLP of the tiny model's kind
    (:class:`~llminfra.model.transformer.FeedForward`) with weights ``N(0, 0.02²)`` drawn from
    ``generator`` (seed 0 when None), for benchmarks and tests on shapes of one's own.
    Input ``(..., dim)`` -> output ``(..., dim)``."""
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    cfg = ModelConfig(vocab_size=1, dim=dim, n_layers=1, n_heads=1, n_kv_heads=1,
                      ffn_dim=ffn_dim, max_seq_len=1)
    mlp = FeedForward(cfg)
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return mlp
