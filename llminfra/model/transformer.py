"""A small Llama-style decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

The architecture of Llama (Touvron et al. 2023, arXiv:2302.13971, section 2.2), kept plain,
single-device and float (gpt-fast's habit): quantization, tensor parallelism and other
attention kernels are applied from outside, by replacing the ``nn.Linear`` layers
(``layers[i].attention.{wq,wk,wv,wo}``, ``layers[i].feed_forward.{w1,w2,w3}``) or by
:meth:`Transformer.set_attention`. One block (pre-norm)::

    h   = x + wo · attn_fn(rope(wq · rms(x)), rope(wk · rms(x)), wv · rms(x))
    out = h + w2 · (silu(w1 · rms(h)) ⊙ (w3 · rms(h)))

With ``config.num_experts > 1`` the MLP is a mixture of experts
(:class:`llminfra.model.moe.MoEFeedForward`; :func:`tiny_moe_model` builds a small one, chapter 11).

Taught in chapter 01; every later chapter runs on it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from llminfra.attention.ragged import ragged_attention
from llminfra.attention.reference import reference_attention, sdpa_attention
from llminfra.attention.step_metadata import StepMetadata
from llminfra.model.config import ModelConfig
from llminfra.model.moe import MoEFeedForward, tiny_moe_config
from llminfra.model.rope import apply_rotary, rotary_angles, rotary_angles_at
from llminfra.validate import non_negative_int

#: attn_fn(q (B, H, T, d), k (B, H_kv, S, d), v (B, H_kv, S, d), causal) -> (B, H, T, d)
AttentionFn = Callable[..., torch.Tensor]


class RMSNorm(nn.Module):
    """Root-mean-square layer norm: y = x / sqrt(mean(x²) + ε) · g (a learned gain, no bias,
    no mean subtraction). Zhang & Sennrich 2019, arXiv:1910.07467, eq. 4.

    Shape: ``(..., dim)`` -> same; computed in float32, returned in the input's dtype.
    Worked example: x = (3, 4), g = 1, ε = 0 -> rms = sqrt(12.5) = 3.536, y = (0.849, 1.131).
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    """Multi-head self-attention with grouped-query K/V heads (Ainslie et al. 2023,
    arXiv:2305.13245) and rotary positions, calling a pluggable ``attn_fn``.

    x ``(B, T, dim)`` -> ``(B, T, dim)``. q is ``(B, H, T, d)``; k/v ``(B, H_kv, T, d)`` are
    rotated, handed to ``cache.update(layer_idx, k, v)`` when a cache is given (which returns all
    S keys/values so far), then ``attn_fn(q, k, v, causal=True)`` runs.
    """

    def __init__(self, config: ModelConfig, layer_idx: int, attn_fn: AttentionFn):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = (config.n_heads, config.n_kv_heads,
                                                        config.head_dim)
        kv_dim = config.n_kv_heads * config.head_dim
        bias = config.qkv_bias  # Qwen2 has biases on q, k, v (and nowhere else)
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=bias)
        self.wk = nn.Linear(config.dim, kv_dim, bias=bias)
        self.wv = nn.Linear(config.dim, kv_dim, bias=bias)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)
        self.attn_fn = attn_fn

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache=None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, d)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, T, d)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, T, d)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, H_kv, S, d)
        out = self.attn_fn(q, k, v, causal=True)  # (B, H, T, d)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def forward_step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache,
                     meta: StepMetadata) -> torch.Tensor:
        """The ragged version: x ``(N, dim)`` flat tokens of a step, cos/sin ``(N, d/2)`` at
        their positions -> ``(N, dim)``. K/V go through ``cache.update(layer, k, v, meta)``
        (k, v ``(N, H_kv, d)``), attention through
        :func:`llminfra.attention.ragged.ragged_attention`."""
        N = x.shape[0]
        q = self.wq(x).view(N, self.n_heads, self.head_dim)  # (N, H, d)
        k = self.wk(x).view(N, self.n_kv_heads, self.head_dim)  # (N, H_kv, d)
        v = self.wv(x).view(N, self.n_kv_heads, self.head_dim)  # (N, H_kv, d)
        q = apply_rotary(q.transpose(0, 1), cos, sin).transpose(0, 1)  # rotate as (H, N, d)
        k = apply_rotary(k.transpose(0, 1), cos, sin).transpose(0, 1)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v, meta)  # in meta.kv_layout
        builtin = self.attn_fn is reference_attention or self.attn_fn is sdpa_attention
        custom = None if builtin else self.attn_fn  # else: the ragged paths compute the same
        out = ragged_attention(q, k, v, meta, attn_fn=custom)  # (N, H, d)
        return self.wo(out.reshape(N, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU MLP: w2 · (silu(w1 · x) ⊙ w3 · x) (Shazeer 2020, arXiv:2002.05202, eq. 6 with
    Swish_1 = SiLU). x ``(B, T, dim)`` -> ``(B, T, dim)``, inner size ``ffn_dim``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)  # gate
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)  # down
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """One pre-norm decoder block: attention then SwiGLU, each behind an RMSNorm and a
    residual (Touvron et al. 2023, arXiv:2302.13971, section 2.2); the MLP is a
    :class:`~llminfra.model.moe.MoEFeedForward` when ``config.num_experts > 1``."""

    def __init__(self, config: ModelConfig, layer_idx: int, attn_fn: AttentionFn):
        super().__init__()
        self.attention = Attention(config, layer_idx, attn_fn)
        self.feed_forward = (FeedForward(config) if config.num_experts == 1
                             else MoEFeedForward.from_config(config))
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, cos, sin, cache=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, cache)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward_step(self, x, cos, sin, cache, meta):
        """The same block on a ragged step's flat ``(N, dim)`` tokens."""
        h = x + self.attention.forward_step(self.attention_norm(x), cos, sin, cache, meta)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The decoder: token embedding -> L blocks -> RMSNorm -> output projection (its own matrix,
    or the embedding's when ``config.tie_embeddings``).

    Two ways to call it:

    * dense: ``model(tokens (B, T) long, cache=None, start_pos=0) -> logits (B, T, vocab_size)``.
      ``start_pos`` is the position of ``tokens[:, 0]`` (the number of tokens already in the
      cache); positions must stay below ``config.max_seq_len``. A cache that works on ragged
      steps only (:class:`llminfra.kvcache.PagedKVCache`) needs the ragged call below.
    * ragged (one serving step): ``model(tokens (N,) long, cache, meta=meta) -> logits (N, V)``
      (or ``(len(meta.logits_indices), V)``), with ``meta`` the
      :class:`llminfra.attention.StepMetadata` that ``cache.prepare_step(seq_ids, query_lens)``
      built (or ``StepMetadata.build(...)`` without a cache). If a layer fails, the cache's
      ``rollback_step(meta)`` undoes the step's reservation.

    Weights are drawn from
    ``generator`` (seed 0 when omitted, so ``Transformer(config)`` is reproducible): normal with
    std 0.02, the residual projections wo and w2 with 0.02/√(2L) (GPT-2's scaling).
    """

    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.config = config
        # built on the meta device (shapes only, e.g. before loading a checkpoint), the
        # embedding gets an empty weight: its own normal_ init there costs ~1.5 s of imports
        on_meta = torch.empty(0).is_meta
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim, _weight=torch.empty(
            config.vocab_size, config.dim) if on_meta else None)
        self.layers = nn.ModuleList(TransformerBlock(config, i, reference_attention)
                                    for i in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:  # one (V, dim) matrix reads tokens in and logits out
            self.output.weight = self.tok_embeddings.weight
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Redraw every weight from ``generator`` (a fresh one seeded 0 when None); parameters on
        the meta device are left alone."""
        g = generator if generator is not None else torch.Generator().manual_seed(0)
        std_residual = 0.02 / (2 * self.config.n_layers) ** 0.5
        for name, p in self.named_parameters():
            if p.is_meta:  # built on the meta device (shapes only): nothing to draw
                continue
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            if name.endswith(".bias"):
                p.zero_()
                continue
            std = std_residual if name.endswith(("wo.weight", "w2.weight")) else 0.02
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * std)

    def set_attention(self, fn: AttentionFn | None) -> None:
        """Use ``fn(q, k, v, causal=True)`` in every layer (None restores
        :func:`llminfra.attention.reference.reference_attention`). Chapter 06 plugs
        ``flash_attention`` in this way."""
        if fn is None:
            fn = reference_attention
        if not callable(fn):
            raise ValueError(f"set_attention wants a callable attn_fn(q, k, v, causal=True), "
                             f"got {type(fn).__name__}")
        for layer in self.layers:
            layer.attention.attn_fn = fn

    def forward(self, tokens: torch.Tensor, cache=None, start_pos: int = 0,
                meta: StepMetadata | None = None) -> torch.Tensor:
        if meta is not None:
            return self.forward_step(tokens, cache, meta)
        self._check_inputs(tokens, start_pos)
        if cache is not None and getattr(cache, "needs_step_metadata", False):
            raise ValueError(f"{type(cache).__name__} works in steps: meta = "
                             f"cache.prepare_step(seq_ids, query_lens), then "
                             f"model(tokens (N,), cache, meta=meta)")
        T = tokens.shape[1]
        cos, sin = rotary_angles(self.config.head_dim, start_pos, T, self.config.rope_theta,
                                 device=tokens.device,
                                 scaling=self.config.rope_scaling)  # (T, d/2) each
        h = self.tok_embeddings(tokens)  # (B, T, dim)
        for layer in self.layers:
            h = layer(h, cos, sin, cache)
        return self.output(self.norm(h))  # (B, T, vocab)

    def forward_step(self, tokens: torch.Tensor, cache, meta: StepMetadata) -> torch.Tensor:
        """One ragged step: tokens ``(N,)`` -> logits ``(N, V)`` (or of
        ``meta.logits_indices`` only). See the class docstring."""
        try:
            self._check_step(tokens, meta)
            cos, sin = rotary_angles_at(self.config.head_dim, meta.positions,
                                        self.config.rope_theta,
                                        self.config.rope_scaling)  # (N, d/2) each
            h = self.tok_embeddings(tokens)  # (N, dim)
            for layer in self.layers:
                h = layer.forward_step(h, cos, sin, cache, meta)
        except BaseException:
            if cache is not None and hasattr(cache, "rollback_step"):
                cache.rollback_step(meta)  # a failed step leaves the cache as it was
            raise
        if meta.logits_indices is not None:
            h = h[meta.logits_indices]  # (n_out, dim)
        return self.output(self.norm(h))  # (N or n_out, vocab)

    def _check_step(self, tokens: torch.Tensor, meta: StepMetadata) -> None:
        if not isinstance(meta, StepMetadata):
            raise ValueError(f"meta must be a StepMetadata, got {type(meta).__name__}")
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 \
                or tokens.shape[0] != meta.num_tokens:
            raise ValueError(f"a ragged step wants flat tokens (N={meta.num_tokens},), got "
                             f"{getattr(tokens, 'shape', type(tokens).__name__)}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be integer ids (int64), got dtype {tokens.dtype}")
        if max(meta.context_lens) > self.config.max_seq_len:
            raise ValueError(f"context of {max(meta.context_lens)} tokens exceeds max_seq_len "
                             f"{self.config.max_seq_len} of this model")
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}), got range "
                             f"[{lo}, {hi}]")

    def _check_inputs(self, tokens: torch.Tensor, start_pos: int) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            raise ValueError(f"tokens must be a (batch, tokens) LongTensor, got "
                             f"{getattr(tokens, 'shape', type(tokens).__name__)}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be integer ids (int64), got dtype {tokens.dtype}")
        if tokens.shape[1] == 0:
            raise ValueError("tokens has no positions (shape (B, 0)); give at least one token")
        non_negative_int("start_pos", start_pos)
        end = start_pos + tokens.shape[1]
        if end > self.config.max_seq_len:
            raise ValueError(f"positions {start_pos}..{end - 1} exceed max_seq_len "
                             f"{self.config.max_seq_len} of this model")
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}), got range "
                             f"[{lo}, {hi}]")


def tiny_moe_model(seed: int = 0, num_experts: int = 4, experts_per_token: int = 2,
                   gating: str = "softmax") -> Transformer:
    """A small mixture-of-experts decoder with random weights drawn from ``seed``
    (:func:`llminfra.model.moe.tiny_moe_config`: byte vocabulary, so the tiny model's
    :class:`~llminfra.model.ByteTokenizer` serves it), in eval mode. Runs through
    ``llminfra.engine.LLMEngine`` like the dense model. Taught in chapter 11."""
    config = tiny_moe_config(num_experts, experts_per_token, gating)
    return Transformer(config, generator=torch.Generator().manual_seed(seed)).eval()
