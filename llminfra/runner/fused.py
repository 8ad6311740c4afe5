"""The readable model's weights, fused for fast steps: one matrix for q/k/v, one for gate/up.

The readable :class:`~llminfra.model.Transformer` multiplies a token by wq, wk and wv one after
the other, and by w1 and w3: five small calls per layer where two do the same arithmetic. A
decode step is short enough that each call's fixed host time matters (on a GPU, issuing its
kernels; on a CPU, Python, dispatch and the BLAS's own set-up), so the fast paths stack the
matrices once, from outside the model (gpt-fast's habit, and what vLLM's
``QKVParallelLinear`` / ``MergedColumnParallelLinear`` hold):

    wqkv = [wq; wk; wv]   (H·d + 2·H_kv·d, dim)        w13 = [w1; w3]   (2·I, dim)

Each matrix is applied through a *matmul* (:mod:`llminfra.runner.matmul`): ``f(x) = x · Wᵀ``
and ``f.add(x, r) = r + x · Wᵀ``, what else it can do said by its class (re-exported here).

Rotary positions are one complex multiplication per step for q *and* k (and v, by 1 + 0i, which
leaves it unchanged bit for bit), read from a table of e^{i·m·θ_j} built once
(:meth:`FusedWeights.head_rotation`).

Two clients, both through the one fast layer (:mod:`llminfra.runner.fast_layer`):
:class:`~llminfra.runner.fast_decode.FastDecoder` (one sequence, its own dense cache) and the
engine's fast runner (:mod:`llminfra.runner.fast_step`, any batch on the paged cache).
Chapter 12 (making it fast) and chapter 08 (where a decode step's time goes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llminfra.model.rope import rope_inv_freq
from llminfra.model.transformer import Transformer
from llminfra.runner.matmul import (BaseMatmul, FunctionMatmul, FusingLinear, Matmul,
                                    PrepackedMatmul, SizedLinear, SkinnyMatmul)
from llminfra.runner.prepacked import PrepackedLinear

__all__ = ["BaseMatmul", "FunctionMatmul", "FusedLayer", "FusedWeights", "FusingLinear",
           "MATMULS", "Matmul", "PrepackedMatmul", "SizedLinear", "SkinnyMatmul",
           "matmul_kind", "unsupported"]


#: matmul kinds :class:`FusedWeights` builds: F.linear, or oneDNN's prepacked weights
MATMULS = ("plain", "onednn")


def matmul_kind(model: Transformer) -> str:
    """``"onednn"`` when the model's linear layers are prepacked
    (:func:`llminfra.runner.prepacked.prepacked`), ``"plain"`` for ``nn.Linear``;
    ``ValueError`` naming the layer type otherwise (a quantized model keeps its own kernels:
    run it on the readable path)."""
    linears = [model.output]
    for block in model.layers:
        a, f = block.attention, block.feed_forward
        linears += [a.wq, a.wk, a.wv, a.wo, f.w1, f.w2, f.w3]
    kinds = {type(m) for m in linears}
    if kinds == {PrepackedLinear}:
        return "onednn"
    if kinds <= {nn.Linear, PrepackedLinear}:
        return "plain"
    odd = sorted(k.__name__ for k in kinds - {nn.Linear, PrepackedLinear})
    raise ValueError(f"the fused weights take nn.Linear or PrepackedLinear layers, not "
                     f"{', '.join(odd)}: run this model on the readable path")


def unsupported(model: Transformer) -> str | None:
    """Why the fused weights cannot take ``model`` (a mixture of experts; layers that are
    neither ``nn.Linear`` nor prepacked, e.g. quantized), or None when they can."""
    c = model.config
    if c.num_experts > 1:
        return (f"the fused weights support dense models only; this one has "
                f"num_experts={c.num_experts} (run it on the readable path)")
    try:
        matmul_kind(model)
    except ValueError as err:
        return str(err)
    return None


@dataclass
class FusedLayer:
    """One block's weights as the fast paths use them."""

    attn_norm: torch.Tensor                 # (dim,)
    wqkv: BaseMatmul                        # x -> [q | k | v]  (H·d + 2·H_kv·d)
    wo: BaseMatmul
    ffn_norm: torch.Tensor                  # (dim,)
    w13: BaseMatmul                         # x -> [gate | up]  (2·I)
    w2: BaseMatmul


class FusedWeights:
    """The fused weights of a dense :class:`~llminfra.model.Transformer` (no copy of the
    embedding; the stacked matrices are copies: the projections' memory again).

    ``kernels``: a :class:`~llminfra.runner.kernel_set.KernelSet` (its ``matmul`` applied to
    each stacked matrix and to the output matrix; its ``attention`` and ``step`` kept for the
    fast step), or None — :class:`Matmul` (``F.linear``) or :class:`PrepackedMatmul` as the
    model's layers are (:func:`matmul_kind`). ``ValueError`` for a mixture-of-experts model.
    """

    def __init__(self, model: Transformer, kernels=None):
        c = model.config
        reason = unsupported(model)
        matmul = None if kernels is None else kernels.matmul
        if reason is not None and (matmul is None or c.num_experts > 1):
            raise ValueError(reason)
        self.config = c
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        make = matmul if matmul is not None else (
            PrepackedMatmul if matmul_kind(model) == "onednn" else Matmul)
        #: the C paged decode kernel of the kernel set (:mod:`llminfra.kernels.paged_decode`),
        #: or None: the decode step's attention on the CPU
        #: (:func:`~llminfra.runner.fast_step.decode_step`)
        self.paged_decode = None if kernels is None else kernels.attention
        #: ``build(weights, pools)`` of the whole decode step in one C call where the linear
        #: brings one (:mod:`llminfra.runner.decode_stack`: w4a8), else None
        self.decode_stack = None if kernels is None else kernels.step
        with torch.no_grad():
            self.layers = []
            for block in model.layers:
                a, f = block.attention, block.feed_forward
                bias = (torch.cat([a.wq.bias, a.wk.bias, a.wv.bias])
                        if a.wq.bias is not None else None)
                self.layers.append(FusedLayer(
                    block.attention_norm.weight.detach(),
                    make(torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]).contiguous(), bias),
                    make(a.wo.weight.detach()), block.ffn_norm.weight.detach(),
                    make(torch.cat([f.w1.weight, f.w3.weight]).contiguous()),
                    make(f.w2.weight.detach())))
            self.embedding = model.tok_embeddings.weight.detach()
            self.norm = model.norm.weight.detach()
            self.output = make(model.output.weight.detach())
        layer = self.layers[0]
        #: True where every matmul also forms RMSNorm and SwiGLU itself (``f.fused``: the C
        #: kernels, w4a8 and skinny): the fast paths then let them
        self.fused_kernels = all(m.fuses for m in (layer.wqkv, layer.w13, layer.w2,
                                                   self.output))
        d, H, H_kv = c.head_dim, c.n_heads, c.n_kv_heads
        self.split = (H * d, H_kv * d, H_kv * d)
        inv_freq = rope_inv_freq(d, c.rope_theta, c.rope_scaling, self.device)
        angles = torch.outer(torch.arange(c.max_seq_len, device=self.device,
                                          dtype=torch.float32), inv_freq)   # (max_len, d/2)
        #: e^{i·m·θ_j} for every position m: (max_seq_len, d/2) complex64
        self.rotation = torch.polar(torch.ones_like(angles), angles)
        #: the same table as (cos, sin) pairs (max_seq_len, d/2, 2) float32, for C kernels
        self.rotation_pairs = torch.view_as_real(self.rotation)
        #: (1, H + 2·H_kv, 1): True for the v heads of a [q | k | v] row (rotated by 1)
        self.v_heads = (torch.arange(H + 2 * H_kv, device=self.device) >= H + H_kv)[None, :, None]

    def head_rotation(self, positions: torch.Tensor) -> torch.Tensor:
        """``(N, H + 2·H_kv, d/2)`` complex: e^{i·m·θ_j} for the q and k heads of a token at
        position m, 1 for its v heads (3 torch calls)."""
        rot = self.rotation[positions]                                   # (N, d/2)
        return torch.where(self.v_heads, 1.0, rot[:, None])

    def rotate(self, qkv: torch.Tensor, rot: torch.Tensor, N: int) -> torch.Tensor:
        """``qkv`` ``(N, H·d + 2·H_kv·d)`` -> ``(N, H + 2·H_kv, d)`` with each pair
        (x_2j, x_2j+1) of the q and k heads turned by m·θ_j (RoPE, Su et al. 2021,
        arXiv:2104.09864, eq. 34, as :func:`llminfra.model.apply_rotary`), v as it was; ``N``
        the rows (passed in: a ``.shape`` read is a torch call too)."""
        d = self.config.head_dim
        x = qkv.view(N, -1, d // 2, 2)                      # N rows, given: no .shape call
        if self.dtype != torch.float32:
            x = x.float()
        out = torch.view_as_real(torch.view_as_complex(x) * rot).view(N, -1, d)
        return out if self.dtype == torch.float32 else out.to(self.dtype)

    def weight_bytes_read(self) -> int:
        """Bytes of weights one decode step reads: every matrix once, the norms; the
        embedding's one row is left out."""
        total = self.output.nbytes + self.norm.numel() * self.norm.element_size()
        for layer in self.layers:
            total += sum(m.nbytes for m in (layer.wqkv, layer.wo, layer.w13, layer.w2))
            total += sum(t.numel() * t.element_size() for t in (layer.attn_norm, layer.ffn_norm))
            if layer.wqkv.bias is not None:
                total += layer.wqkv.bias.numel() * layer.wqkv.bias.element_size()
        return total
