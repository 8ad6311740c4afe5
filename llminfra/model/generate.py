"""Autoregressive generation (greedy, temperature, top-k) and held-out perplexity.

Decoding one token at a time: the prompt is run once (prefill), then each new token is fed back
(decode). Without a cache every step recomputes all positions, O(n²) work for n tokens; with a
KV cache each step computes only the new position (chapter 04 measures both, and they give the
same tokens — a test checks it). Sampling draws from an explicit ``torch.Generator``.

Perplexity = exp(mean negative log-likelihood), here per byte; the loss is in nats per byte.

Taught in chapters 01 (generation) and 03 (perplexity as the quality measure of quantization).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from llminfra.model.sampling import filter_logits
from llminfra.validate import non_negative_int


def sample_next_token(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
                      generator: torch.Generator | None = None) -> int:
    """One token id from ``logits`` ``(vocab,)``.

    temperature == 0: argmax (greedy). Otherwise p = softmax(logits / temperature) restricted to
    the ``top_k`` largest logits (:func:`llminfra.model.sampling.filter_logits`, the serving
    engine's filter too; Fan et al. 2018, arXiv:1805.04833, section 5.4), drawn with
    ``torch.multinomial`` from ``generator`` (which must be on the logits' device). Sampling
    without a generator is refused: torch's global generator would be hidden state.
    """
    if logits.dim() != 1:
        raise ValueError(f"logits must be 1-D (vocab,), got shape {tuple(logits.shape)}")
    if temperature == 0.0:
        return int(torch.argmax(logits))
    if generator is None:
        raise ValueError(f"temperature {temperature} samples: pass generator=torch.Generator()"
                         ".manual_seed(...) (or temperature=0 for greedy decoding)")
    probs = torch.softmax(filter_logits(logits.float() / temperature, top_k), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _check_generate_args(model, prompt_ids, max_new_tokens, temperature, top_k,
                         generator) -> list[int]:
    try:
        ids = [int(t) for t in prompt_ids]
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"prompt_ids must be a flat sequence of token ids, got "
                         f"{type(prompt_ids).__name__}") from err
    vocab, max_len = model.config.vocab_size, model.config.max_seq_len
    if not ids:
        raise ValueError("prompt_ids is empty; give at least one token")
    non_negative_int("max_new_tokens", max_new_tokens)
    if len(ids) + max_new_tokens - 1 > max_len:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) "
                         f"exceeds the model's max_seq_len {max_len} (+1)")
    if not (isinstance(temperature, (int, float)) and temperature >= 0 and
            math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or not 1 <= top_k <= vocab):
        raise ValueError(f"top_k must be None or an int in [1, {vocab}], got {top_k!r}")
    if temperature > 0 and generator is None:
        raise ValueError(f"temperature {temperature} samples: pass generator=torch.Generator()"
                         ".manual_seed(...) (or temperature=0 for greedy decoding)")
    return ids


@torch.no_grad()
def generate(model, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             cache=None) -> list[int]:
    """The ``max_new_tokens`` new token ids that follow ``prompt_ids`` (prompt not included).

    ``temperature == 0`` is greedy decoding; otherwise tokens are sampled as in
    :func:`sample_next_token` from ``generator``. ``cache=None`` recomputes the whole sequence
    at every step; an EMPTY cache (``DenseKVCache(model.config.n_layers)`` or one of
    :mod:`llminfra.kvcache`) is filled by the prefill (positions 0 .. P-1) and then one token
    per step, at ``start_pos`` = tokens so far; a paged cache (``needs_step_metadata``) gets a
    new sequence and one ``prepare_step`` per model call, as a serving engine's steps do. One sequence (batch 1); the device is the
    model's. Needs P + max_new_tokens - 1 <= ``model.config.max_seq_len``.
    """
    ids = _check_generate_args(model, prompt_ids, max_new_tokens, temperature, top_k, generator)
    device = next(model.parameters()).device
    new: list[int] = []
    if max_new_tokens == 0:
        return new
    if getattr(cache, "needs_step_metadata", False):   # a paged cache: the step protocol
        seq = cache.add_sequence()

        def run(tokens: list[int], start_pos: int) -> torch.Tensor:
            meta = cache.prepare_step([seq], [len(tokens)])
            return model(torch.tensor(tokens, device=device), cache, meta=meta)[None]
    else:
        def run(tokens: list[int], start_pos: int) -> torch.Tensor:
            return model(torch.tensor([tokens], device=device), cache=cache,
                         start_pos=start_pos)
    logits = run(ids, 0)  # (1, P, V)
    for step in range(max_new_tokens):
        token = sample_next_token(logits[0, -1], temperature, top_k, generator)
        new.append(token)
        if step == max_new_tokens - 1:
            break
        if cache is None:  # recompute every position
            logits = model(torch.tensor([ids + new], device=device))
        else:  # feed only the new token
            logits = run([token], len(ids) + step)
    return new


def _windows(tokens: torch.Tensor, seq_len: int) -> list[torch.Tensor]:
    """Split a 1-D token tensor into windows of seq_len + 1 tokens overlapping by one, so that
    every token but the first is predicted exactly once."""
    return [tokens[s:s + seq_len + 1] for s in range(0, tokens.numel() - 1, seq_len)]


@torch.no_grad()
def mean_nll(model, token_ids: Sequence[int] | torch.Tensor, seq_len: int | None = None,
             batch_size: int = 8) -> float:
    """Mean negative log-likelihood in nats per token of ``token_ids`` under ``model``.

    NLL = -(1/N) Σ_t log p(x_t | x_<t), over non-overlapping windows of ``seq_len`` predicted
    tokens (default ``model.config.max_seq_len``); each window starts with fresh context.
    """
    tokens = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    seq_len = model.config.max_seq_len if seq_len is None else seq_len
    if tokens.numel() < 2:
        raise ValueError(f"need at least 2 tokens to measure a loss, got {tokens.numel()}")
    if not 1 <= seq_len <= model.config.max_seq_len:
        raise ValueError(f"seq_len must be in [1, {model.config.max_seq_len}], got {seq_len}")
    device = next(model.parameters()).device
    windows = _windows(tokens, seq_len)
    total, count = 0.0, 0
    for length in sorted({w.numel() for w in windows}, reverse=True):
        group = [w for w in windows if w.numel() == length]
        for b in range(0, len(group), batch_size):
            x = torch.stack(group[b:b + batch_size]).to(device)  # (b, length)
            logits = model(x[:, :-1])  # (b, length-1, V)
            nll = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten(),
                                  reduction="sum")
            total, count = total + float(nll), count + x[:, 1:].numel()
    return total / count


def perplexity(model, token_ids: Sequence[int] | torch.Tensor, seq_len: int | None = None,
               batch_size: int = 8) -> float:
    """exp(:func:`mean_nll`): the perplexity per token (per byte for the byte tokenizer).

    A uniform guess over 256 bytes has perplexity 256 (loss ln 256 = 5.545 nats/byte).
    """
    return math.exp(mean_nll(model, token_ids, seq_len, batch_size))
