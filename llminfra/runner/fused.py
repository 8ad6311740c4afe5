"""The readable model's weights, fused for fast steps: one matrix for q/k/v, one for gate/up.

The readable :class:`~llminfra.model.Transformer` multiplies a token by wq, wk and wv one after
the other, and by w1 and w3: five small calls per layer where two do the same arithmetic. A
decode step is short enough that each call's fixed cost matters (on a GPU a few microseconds
to launch a kernel, on a CPU some of Python and of the BLAS's own set-up), so the fast paths
stack the matrices once, from outside the model (gpt-fast's habit, and what vLLM's
``QKVParallelLinear`` / ``MergedColumnParallelLinear`` hold):

    wqkv = [wq; wk; wv]   (H·d + 2·H_kv·d, dim)        w13 = [w1; w3]   (2·I, dim)

Each matrix is applied through a *matmul* (:class:`Matmul`): ``f(x) = x · Wᵀ`` and
``f.add(x, r) = r + x · Wᵀ`` — the residual added inside the product where the kernel can
(``torch.addmm`` for ``F.linear``, oneDNN's ``add`` post-op for prepacked weights), so a
block's two residual adds cost no call of their own.

Rotary positions are one complex multiplication per step for q *and* k (and v, by 1 + 0i, which
leaves it unchanged bit for bit), read from a table of e^{i·m·θ_j} built once
(:meth:`FusedWeights.head_rotation`).

Two clients: :class:`~llminfra.runner.fast_decode.FastDecoder` (one sequence, its own dense cache)
and the engine's fast model runner (:mod:`llminfra.runner.fast_step`, any batch on the paged
cache). Chapter 08 (where a decode step's time goes) and chapter 05 (the model runner).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llminfra.model.rope import rope_inv_freq
from llminfra.model.transformer import Transformer
from llminfra.runner.prepacked import PrepackedLinear, pack_weight


class Matmul:
    """``x · Wᵀ (+ b)`` on a weight ``W`` ``(out, in)`` as it is stored (``F.linear``)."""

    #: whether ``fused`` (where a matmul has it) takes ``residual=`` and adds it in its call
    adds_in_fused = False

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self._wt = self.weight.t()                    # a view: addmm reads Wᵀ in place

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + x · Wᵀ`` in one call (x and residual 2-D)."""
        if self.bias is not None:
            return residual + self(x)
        return torch.addmm(residual, x, self._wt)

    @property
    def nbytes(self) -> int:
        """Bytes of the weight this matmul reads."""
        return self.weight.numel() * self.weight.element_size()


class PrepackedMatmul(Matmul):
    """The same product on oneDNN's prepacked weight (:mod:`llminfra.runner.prepacked`), the
    residual added by its ``add`` post-op."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(weight, bias)
        self._packed = pack_weight(self.weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self._packed, self.bias,
                                                         "add")


class SkinnyMatmul(Matmul):
    """A product on the package's C kernels, ``kernel``
    (:class:`llminfra.kernels.f32_skinny.SkinnyKernel`, on its thread pool): at most
    ``kernel.max_rows`` rows on ``llminfra/kernels/csrc/f32_skinny.c`` (each thread streams its run of
    ``W``'s rows once, front to back: a decode step at batch 1 or 2 is a stream of the
    weights), more, up to ``kernel.panel_max_rows`` (a decode step of many sequences, a prompt
    chunk), on ``llminfra/kernels/csrc/f32_panels.c`` (``W`` packed once in panels of 16 columns, an
    outer product in registers), past that on ``F.linear`` (:class:`Matmul`). With a bias every
    row goes to oneDNN's prepacked weight (:class:`PrepackedMatmul`). Without one it also has
    ``fused`` (as the w4a8 kernel's): ``fused(x, norm=g, eps=ε)`` is ``f(RMSNorm(x)·g)`` and
    ``fused(x, gated=True)`` ``f(silu(gate)·up)`` of ``x = [gate | up]``, formed inside the
    kernels' call where they take the rows (SiLU's exp the w4a8 kernel's own)."""

    adds_in_fused = True

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, kernel):
        arena = getattr(kernel, "arena", None)        # huge pages (quant.huge_pages), if it has
        if bias is None and weight.dtype == torch.float32 and arena is not None:
            weight = arena.copy(weight.detach())           # a copy there: W streams
        super().__init__(weight.contiguous(), bias)
        self._kernel = kernel
        self._n, self._k = self.weight.shape
        self._blas = PrepackedMatmul(self.weight, self.bias) if bias is not None else None
        #: W packed in panels of 16 columns (``f32_panels.c``), or None
        self.panels = None
        if bias is None and kernel.panel is not None and kernel.panel_max_rows > kernel.max_rows:
            numel = -(-self._n // 16) * 16 * self._k
            self.panels = torch.empty(numel) if arena is None else arena.empty(numel)
            if kernel.panel_pack(self.weight.data_ptr(), self.panels.data_ptr(), self._n,
                                 self._k):
                raise ValueError(f"f32_panel_pack refused W {tuple(self.weight.shape)}")
        #: the most rows a product sends to ``f32_skinny.c``; to the C kernels (0: none: a bias)
        self.skinny_rows = kernel.max_rows
        self.c_rows = (0 if bias is not None else
                       kernel.panel_max_rows if self.panels is not None else kernel.max_rows)
        if bias is None:
            self.fused = self._fused

    def _product(self, x: torch.Tensor, residual: torch.Tensor | None, M: int,
                 norm: torch.Tensor | None = None, eps: float = 0.0,
                 gated: bool = False) -> torch.Tensor:
        k = self._kernel
        fn, w = (k.fn, self.weight) if M <= k.max_rows else (k.panel, self.panels)
        y = torch.empty(*x.shape[:-1], self._n)
        status = fn(x.data_ptr(), w.data_ptr(), None if residual is None else residual.data_ptr(),
                    y.data_ptr(), M, self._n, self._k, x.shape[-1], gated,
                    None if norm is None else norm.data_ptr(), eps, k.threads, k.pool)
        if status:
            raise ValueError(f"{fn.__name__} refused x {tuple(x.shape)} for W "
                             f"{tuple(self.weight.shape)} on {k.threads} threads")
        return y

    def _rows_of(self, x: torch.Tensor, width: int) -> int:
        """x's rows where the C kernels take it (a decode step's, contiguous float32, ``width``
        wide), else 0."""
        M = x.numel() // width
        return (M if 0 < M <= self.c_rows and x.shape[-1] == width and x.is_contiguous()
                and x.dtype == torch.float32 else 0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        M = self._rows_of(x, self._k)
        if M:
            return self._product(x, None, M)
        return self._blas(x) if self._blas is not None else super().__call__(x)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        M = self._rows_of(x, self._k)
        if M and residual.is_contiguous() and residual.dtype == torch.float32:
            return self._product(x, residual, M)
        return self._blas.add(x, residual) if self._blas is not None else super().add(x, residual)

    def _fused(self, x: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 1e-5,
               gated: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``fused`` (see the class); ``residual``: ``residual + f(…)`` in the same call."""
        M = self._rows_of(x, 2 * self._k if gated else self._k)
        if M and (norm is None or (norm.is_contiguous() and norm.dtype == torch.float32)) and \
                (residual is None or residual.is_contiguous()):
            return self._product(x, residual, M, norm, float(eps), bool(gated))
        if gated:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        if norm is not None:
            x = F.rms_norm(x, (self._k,), norm, eps)
        return self(x) if residual is None else self.add(x, residual)


class FunctionMatmul:
    """A ``linear(W) -> f`` of the package (int4, w4a8: :mod:`llminfra.quant`) as a matmul;
    ``add`` is ``residual + f(x)``, and ``fused`` is passed on where ``f`` has it."""

    adds_in_fused = False

    def __init__(self, f: Callable[[torch.Tensor], torch.Tensor], weight: torch.Tensor,
                 bias: torch.Tensor | None = None):
        self.f, self.bias = f, None if bias is None else bias.detach()
        self._nbytes = getattr(f, "nbytes", weight.numel() * weight.element_size())
        if hasattr(f, "fused"):
            self.fused = f.fused

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.f(x)
        return y if self.bias is None else y + self.bias

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + self(x)

    @property
    def nbytes(self) -> int:
        return int(self._nbytes)


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
    if getattr(c, "num_experts", 1) > 1:
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
    wqkv: Matmul                            # x -> [q | k | v]  (H·d + 2·H_kv·d)
    wo: Matmul
    ffn_norm: torch.Tensor                  # (dim,)
    w13: Matmul                             # x -> [gate | up]  (2·I)
    w2: Matmul


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
        #: the C paged decode kernel of the kernel set (:mod:`llminfra.kernels.paged_decode`), or
        #: None: the decode step's attention on the CPU (:func:`~llminfra.runner.fast_step.decode_step`)
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
        self.fused_kernels = all(hasattr(m, "fused") for m in (layer.wqkv, layer.w13,
                                                                layer.w2, self.output))
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
            if getattr(layer.wqkv, "bias", None) is not None:
                total += layer.wqkv.bias.numel() * layer.wqkv.bias.element_size()
        return total
