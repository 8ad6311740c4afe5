"""A fast batch-1 decode path beside the readable model: the same weights, fewer torch calls.

On a CPU a 135 M-parameter model's decode step should cost what reading its weights costs (the
floor of chapter 08's roofline: weight bytes / memory bandwidth). The readable
:class:`llminfra.model.Transformer` spends about as long again in Python and in small torch
calls: three q/k/v projections, two gate/up projections, a rotary of a dozen element-wise
operations, a growing ``torch.cat`` cache, per layer. :class:`FastDecoder` keeps the arithmetic
and removes the calls:

* q, k and v come from one matrix (their weights stacked, ``(H·d + 2·H_kv·d, dim)``), gate and
  up from another (``(2·I, dim)``): one matrix-vector product each instead of three and two;
* the K/V cache is one preallocated tensor per layer, written in place at the step's position;
* rotary positions are a complex multiplication by precomputed ``cos + i·sin`` (the pairs
  (x_2i, x_2i+1) of :func:`llminfra.model.apply_rotary` read as complex numbers);
* RMSNorm and attention are PyTorch's fused ``rms_norm`` and ``scaled_dot_product_attention``;
* only the last position's logits are computed.

Greedy tokens equal the readable model's (``tests/test_pretrained.py`` checks both against
Hugging Face ``transformers``); ``python -m llminfra bench real`` measures both against the
floor. Chapter 08.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F

from llminfra.runner.fused import FusedWeights
from llminfra.runner.kernel_set import KernelSet
from llminfra.model.transformer import Transformer
from llminfra.validate import non_negative_int


def _plain_linear(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> x · weightᵀ`` (``F.linear``), the weight as it is (a ``linear`` for tests and
    references: a dequantized copy applied in float)."""
    return partial(F.linear, weight=weight)


class FastDecoder:
    """``FastDecoder(model, max_len=None).generate(prompt_ids, max_new_tokens) -> list[int]``:
    greedy decoding of one sequence with fused projections and a preallocated cache.

    ``max_len`` (default ``model.config.max_seq_len``) bounds prompt + new tokens; the cache
    holds ``2 · L · H_kv · max_len · d`` values. The fused matrices are copies: the decoder costs
    the projections' memory again (the embedding / output matrix is shared).

    ``kernels``: a :class:`~llminfra.runner.kernel_set.KernelSet`, or ``linear``: how a weight
    is applied, ``linear(W) -> f`` with ``f(x) = x · Wᵀ`` (``KernelSet.of(linear)``) — by default
    ``F.linear`` on ``W`` as it is; :func:`llminfra.quant.int4_linear` quantizes each fused matrix
    (and the output matrix) to int4 and multiplies from the packed codes. Biases stay fp32.
    Where every ``f`` also has ``f.fused(x, norm=g, eps=ε)`` (``f(RMSNorm(x)·g)``) and
    ``f.fused(x, gated=True)`` (``f(silu(gate)·up)`` of ``x = [gate | up]``), as
    :func:`llminfra.kernels.w4a8.w4a8_linear`'s do, the decoder hands them the norms and the
    SwiGLU product instead of computing them with torch calls.
    """

    def __init__(self, model: Transformer, max_len: int | None = None,
                 linear: Callable[[torch.Tensor], Callable] | None = None, *, kernels=None):
        if linear is not None:
            if kernels is not None:
                raise ValueError("give linear or kernels, not both")
            kernels = KernelSet.of(linear)
        c = model.config
        if getattr(c, "num_experts", 1) > 1:
            raise ValueError(f"FastDecoder supports dense models only; this one has "
                             f"num_experts={c.num_experts} (run it with the plain model)")
        self.config = c
        self.max_len = c.max_seq_len if max_len is None else int(max_len)
        if not 1 <= self.max_len <= c.max_seq_len:
            raise ValueError(f"max_len must be in [1, {c.max_seq_len}], got {max_len!r}")
        #: the fused weights (shared with the engine's fast runner: :mod:`llminfra.runner.fused`)
        self.weights = w = FusedWeights(model, kernels)
        self.embedding, self.output, self.norm = w.embedding, w.output, w.norm
        # a kernel that forms RMSNorm(x)·g and silu(gate)·up itself (llminfra.kernels.w4a8)
        self.fused = w.fused_kernels
        self.split = w.split
        self.dtype, self._cache = w.dtype, None              # its own cache: made on first use
        self.rotation = w.rotation[:self.max_len]            # cos + i·sin, (max_len, d/2)

    def _rotate(self, x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        """x ``(1, T, heads, d)`` -> rotated, each pair (x_2i, x_2i+1) times e^{i·m·θ_i}."""
        xc = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))  # (1, T, heads, d/2)
        return torch.view_as_real(xc * rot[:, None]).flatten(-2).to(x.dtype)

    def new_cache(self, max_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """An empty K/V cache of ``max_len`` positions (default the decoder's) for
        :meth:`forward`'s ``cache``: one per sequence when a decoder serves several (a
        speculative draft model does)."""
        c = self.config
        n = self.max_len if max_len is None else int(max_len)
        if not 1 <= n <= self.max_len:
            raise ValueError(f"max_len must be in [1, {self.max_len}], got {max_len!r}")
        shape = (c.n_layers, 1, c.n_kv_heads, n, c.head_dim)
        device = self.embedding.device
        return (torch.zeros(shape, dtype=self.dtype, device=device),
                torch.zeros(shape, dtype=self.dtype, device=device))

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, pos: int,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits ``(V,)`` of the last of ``tokens`` ``(T,)`` at positions pos .. pos+T-1; their
        K/V are written to ``cache`` (default the decoder's own), whose positions before
        ``pos`` must hold this sequence's earlier tokens."""
        c, (nq, nkv, _) = self.config, self.split
        if cache is None:
            if self._cache is None:
                self._cache = self.new_cache()
            cache = self._cache
        kc, vc = cache
        T, d, dim = tokens.shape[0], c.head_dim, c.dim
        end = pos + T
        if pos < 0 or end > kc.shape[3]:
            raise ValueError(f"positions {pos} .. {end - 1} do not fit the cache's "
                             f"{kc.shape[3]} positions")
        rot = self.rotation[pos:end]
        # a query at position pos + i sees the keys 0 .. pos + i (causal, after the cached ones)
        mask = (torch.ones(T, end, dtype=torch.bool, device=kc.device).tril(diagonal=pos)
                if T > 1 else None)
        fused = self.fused

        def normed(f, x, gain):                       # f(RMSNorm(x) · gain)
            if fused:
                y = f.fused(x, norm=gain, eps=c.norm_eps)
                return y if f.bias is None else y + f.bias
            return f(F.rms_norm(x, (dim,), gain, c.norm_eps))

        x = F.embedding(tokens, self.embedding)[None]  # (1, T, dim)
        for i, layer in enumerate(self.weights.layers):
            q, k, v = normed(layer.wqkv, x, layer.attn_norm).split(self.split, dim=-1)
            q = self._rotate(q.view(1, T, c.n_heads, d), rot).transpose(1, 2)  # (1, H, T, d)
            k = self._rotate(k.view(1, T, c.n_kv_heads, d), rot).transpose(1, 2)
            kc[i, :, :, pos:end] = k
            vc[i, :, :, pos:end] = v.view(1, T, c.n_kv_heads, d).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, kc[i, :, :, :end], vc[i, :, :, :end],
                                                 attn_mask=mask, enable_gqa=True)
            x = x + layer.wo(out.transpose(1, 2).reshape(1, T, nq))
            gate_up = normed(layer.w13, x, layer.ffn_norm)
            if fused:
                x = x + layer.w2.fused(gate_up, gated=True)
            else:
                gate, up = gate_up.chunk(2, -1)
                x = x + layer.w2(F.silu(gate) * up)
        return normed(self.output, x[0, -1:], self.norm)[0]

    def weight_bytes_read(self) -> int:
        """Bytes of weights one decode step reads: every matrix once, as the decoder holds it
        (``f.nbytes`` where a ``linear`` says), and the norms; the embedding's one row is left
        out (:meth:`FusedWeights.weight_bytes_read`)."""
        return self.weights.weight_bytes_read()

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The ``max_new_tokens`` greedy tokens after ``prompt_ids`` (prompt not included)."""
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("prompt_ids is empty: give at least one token")
        non_negative_int("max_new_tokens", max_new_tokens)
        if len(ids) + max_new_tokens - 1 > self.max_len:
            raise ValueError(f"{len(ids)} prompt + {max_new_tokens} new tokens exceed max_len "
                             f"{self.max_len}")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:3]} outside [0, {self.config.vocab_size})")
        new: list[int] = []
        if max_new_tokens == 0:
            return new
        device = self.embedding.device
        logits = self.forward(torch.tensor(ids, device=device), 0)
        for step in range(max_new_tokens):
            new.append(int(logits.argmax()))
            if step < max_new_tokens - 1:
                logits = self.forward(torch.tensor(new[-1:], device=device), len(ids) + step)
        return new
