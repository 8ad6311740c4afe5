"""A fast batch-1 decoder beside the readable model: the same weights, fewer torch calls.

On a CPU a small model's decode step should cost what reading its weights costs (the floor of
chapter 08's roofline: weight bytes / memory bandwidth). The readable
:class:`llminfra.model.Transformer` spends more than that in Python and in small torch calls:
three q/k/v projections, two gate/up projections, a rotary of a dozen element-wise operations,
a growing ``torch.cat`` cache, per layer. :class:`FastDecoder` keeps the arithmetic and removes
the calls, by running the one fast layer (:func:`llminfra.runner.fast_layer.layer`, the
engine's fast step's too) on the fused weights (:mod:`llminfra.runner.fused`):

* q, k and v come from one matrix (their weights stacked, ``(H·d + 2·H_kv·d, dim)``), gate and
  up from another (``(2·I, dim)``): one matrix-vector product each instead of three and two;
* the K/V cache is one preallocated tensor per layer, written in place at the step's position
  (this decoder's ``place``);
* rotary positions are a complex multiplication by precomputed ``cos + i·sin`` (the pairs
  (x_2i, x_2i+1) of :func:`llminfra.model.apply_rotary` read as complex numbers);
* RMSNorm and attention are PyTorch's fused ``rms_norm`` and ``scaled_dot_product_attention``
  (this decoder's ``attend``, over its dense cache);
* only the last position's logits are computed.

Greedy tokens equal the readable model's (``tests/test_pretrained.py`` checks both against
Hugging Face ``transformers``); ``python -m llminfra bench real`` measures both against the
floor (the recorded run: ``llminfra/data/bench_real_cpu.json``). Chapters 08 and 12.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F

from llminfra.model.transformer import Transformer
from llminfra.runner import fast_layer
from llminfra.runner.fused import FusedWeights
from llminfra.runner.kernel_set import KernelSet
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
    Where every ``f`` forms the norms and SwiGLU in its own call
    (:class:`~llminfra.runner.matmul.FusingLinear`, as
    :func:`llminfra.kernels.w4a8.w4a8_linear`'s do), the decoder hands them those instead of
    computing them with torch calls (``fused``).
    """

    def __init__(self, model: Transformer, max_len: int | None = None,
                 linear: Callable[[torch.Tensor], Callable] | None = None, *, kernels=None):
        if linear is not None:
            if kernels is not None:
                raise ValueError("give linear or kernels, not both")
            kernels = KernelSet.of(linear)
        c = model.config
        if c.num_experts > 1:
            raise ValueError(f"FastDecoder supports dense models only; this one has "
                             f"num_experts={c.num_experts} (run it with the plain model)")
        self.config = c
        self.max_len = c.max_seq_len if max_len is None else int(max_len)
        if not 1 <= self.max_len <= c.max_seq_len:
            raise ValueError(f"max_len must be in [1, {c.max_seq_len}], got {max_len!r}")
        #: the fused weights (shared with the engine's fast runner: :mod:`llminfra.runner.fused`)
        self.weights = w = FusedWeights(model, kernels)
        self.embedding = w.embedding
        #: whether every matmul forms RMSNorm(x)·g and silu(gate)·up itself (the C kernels)
        self.fused = w.fused_kernels
        self.dtype, self._cache = w.dtype, None              # its own cache: made on first use

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
        if cache is None:
            if self._cache is None:
                self._cache = self.new_cache()
            cache = self._cache
        kc, vc = cache
        T, end = tokens.shape[0], pos + tokens.shape[0]
        if pos < 0 or end > kc.shape[3]:
            raise ValueError(f"positions {pos} .. {end - 1} do not fit the cache's "
                             f"{kc.shape[3]} positions")
        w = self.weights
        place, attend = self._place(pos, T), self._attend(pos, T)
        x = F.embedding(tokens, w.embedding)                 # (T, dim)
        for i in range(len(w.layers)):
            x = fast_layer.layer(w, i, x, (kc[i], vc[i]), place, attend)
        return fast_layer.logits(w, x[-1:])[0]

    def _place(self, pos: int, T: int):
        """``place(qkv, (k, v)) -> q`` of a layer: the ``T`` rows at positions pos .. pos+T-1
        turned by RoPE, their K and V written to the layer's dense cache ``(1, H_kv, n, d)``."""
        w, c = self.weights, self.config
        H, H_kv = c.n_heads, c.n_kv_heads
        positions = torch.arange(pos, pos + T, device=self.embedding.device)
        rot = w.head_rotation(positions)                     # (T, H + 2·H_kv, d/2)

        def place(qkv, cache):
            k, v = cache
            r = w.rotate(qkv, rot, T)                        # (T, H + 2·H_kv, d)
            k[0, :, pos:pos + T] = r[:, H:H + H_kv].transpose(0, 1)
            v[0, :, pos:pos + T] = r[:, H + H_kv:].transpose(0, 1)
            return r[:, :H]
        return place

    def _attend(self, pos: int, T: int):
        """``attend(q, (k, v)) -> (T, H·d)`` of a layer: SDPA of the ``T`` queries over the
        cache's keys 0 .. pos+T-1, a query at position pos + i seeing keys 0 .. pos + i."""
        c, end = self.config, pos + T
        # causal after the cached keys; one query sees every key: no mask
        mask = (torch.ones(T, end, dtype=torch.bool, device=self.embedding.device)
                .tril(diagonal=pos) if T > 1 else None)

        def attend(q, cache):
            k, v = cache
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[:, :, :end],
                                                 v[:, :, :end], attn_mask=mask,
                                                 enable_gqa=True)     # (1, H, T, d)
            return out[0].transpose(0, 1).reshape(T, c.n_heads * c.head_dim)
        return attend

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
