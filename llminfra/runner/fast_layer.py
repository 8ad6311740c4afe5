"""The fast decoder layer, written once: every fast path's block on the fused weights.

The readable model's block (:class:`llminfra.model.transformer.TransformerBlock`) and this
function are two versions of one idea. The readable one keeps each step a module of its own —
``attention_norm``, ``wq`` / ``wk`` / ``wv``, ``apply_rotary``, the cache's ``update``,
attention, ``wo``, ``ffn_norm``, ``w1`` / ``w3``, SwiGLU, ``w2`` — so that a learner can read it;
this one makes the same arithmetic in few torch calls on
:class:`~llminfra.runner.fused.FusedWeights` (q/k/v in one product, gate/up in one, each
residual added inside its product)::

    h = RMSNorm(x)·g₁;  [q | k | v] = h·wqkvᵀ     place: RoPE on q and k; K, V to the cache
    x = x + attend(q)·woᵀ                         (the cache's layout is the caller's)
    h = RMSNorm(x)·g₂;  [gate | up] = h·w13ᵀ;  x = x + (silu(gate)·up)·w2ᵀ

Where every matmul forms RMSNorm and SwiGLU inside its own call (``w.fused_kernels``: the C
kernels, :mod:`llminfra.runner.matmul`), they do, and where the down product adds the
residual in that call too (``adds_in_fused``), it does.

Its clients bring what differs — the cache and the attention — as two callables, the way the C
one-call step (``llminfra/kernels/csrc/decode_stack.c``) takes pointers:

* ``place(qkv, cache) -> q``: RoPE on the step's q and k heads and its K and V written to the
  layer's ``cache``; the q heads ``(N, H, d)`` back;
* ``attend(q, cache) -> (N, H·d)``: each query over its sequence's keys.

The engine's fast step (:mod:`llminfra.runner.fast_step`: a paged pool, gather + SDPA, the C
or Triton paged kernels) and :class:`~llminfra.runner.fast_decode.FastDecoder` (one sequence,
a dense cache, SDPA) are its two clients. Chapter 12 (and chapter 05's readable runner beside
it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from llminfra.runner.fused import FusedWeights
from llminfra.runner.matmul import BaseMatmul

#: ``place(qkv, cache) -> q``: RoPE and the K/V write of a layer (see the module)
Place = Callable[[torch.Tensor, object], torch.Tensor]
#: ``attend(q, cache) -> (N, H·d)``: a layer's attention over its cache (see the module)
Attend = Callable[[torch.Tensor, object], torch.Tensor]


def normed(f: BaseMatmul, x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """``f(RMSNorm(x)·gain)`` in the matmul's own call (``f.fuses``), plus its bias."""
    y = f.fused(x, norm=gain, eps=eps)
    return y if f.bias is None else y + f.bias


def layer(w: FusedWeights, i: int, x: torch.Tensor, cache, place: Place,
          attend: Attend) -> torch.Tensor:
    """Block ``i`` of ``w`` on the step's ``x`` ``(N, dim)`` -> ``(N, dim)``; ``cache`` is the
    caller's for this layer, handed to ``place`` and ``attend`` (see the module)."""
    c, L = w.config, w.layers[i]
    if w.fused_kernels:
        qkv = normed(L.wqkv, x, L.attn_norm, c.norm_eps)
    else:
        qkv = L.wqkv(F.rms_norm(x, (c.dim,), L.attn_norm, c.norm_eps))
    q = place(qkv, cache)                                  # (N, H, d); K, V in the cache
    x = L.wo.add(attend(q, cache), x)                      # x + attention · woᵀ
    if w.fused_kernels:
        gate_up = normed(L.w13, x, L.ffn_norm, c.norm_eps)
        if L.w2.adds_in_fused:                             # the residual inside the call too
            return L.w2.fused(gate_up, gated=True, residual=x)
        return x + L.w2.fused(gate_up, gated=True)
    h = F.rms_norm(x, (c.dim,), L.ffn_norm, c.norm_eps)
    gate, up = L.w13(h).chunk(2, dim=-1)
    return L.w2.add(F.silu(gate) * up, x)


def logits(w: FusedWeights, x: torch.Tensor) -> torch.Tensor:
    """The output layer on ``x`` ``(N, dim)``: ``RMSNorm(x)·g · outputᵀ`` -> ``(N, V)``."""
    c = w.config
    if w.fused_kernels:
        return normed(w.output, x, w.norm, c.norm_eps)
    return w.output(F.rms_norm(x, (c.dim,), w.norm, c.norm_eps))
