"""Turn each sequence's logits into its next token: logits processors (bias, penalties), then
greedy, or temperature, top-k, top-p and min-p. The rules themselves are
:mod:`llminfra.model.sampling`, which :func:`llminfra.model.generate` draws through too; here
they are applied per request, with its :class:`SamplingParams` and generator, for the engine and
for speculative verification (:func:`probabilities`).

For logits z ``(V,)`` and temperature T > 0: z' = z / T; top-k keeps the k largest z' (Fan et al.
2018, arXiv:1805.04833, §5.4); top-p keeps the smallest set of most likely tokens whose
probability sums to at least p (Holtzman et al. 2020, arXiv:1904.09751, §3.1); the token is
drawn from softmax of what is kept, with the sequence's own ``torch.Generator`` — so a seeded
request gives the same tokens whatever else shares its batch. T = 0 is argmax, and so is any
T below :data:`~llminfra.engine.sampling_params.MIN_TEMPERATURE` (z / 1e-39 overflows float32).

Taught in chapter 05.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llminfra.engine.sampling_params import SamplingParams
from llminfra.model.sampling import apply_penalties, filter_logits


def process_logits(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                   output_ids: Sequence[int]) -> torch.Tensor:
    """The request's logits processors on one row ``(V,)``
    (:func:`llminfra.model.sampling.apply_penalties`); ``logits`` as it is when ``params`` has
    none."""
    if not params.has_processors:
        return logits
    return apply_penalties(logits, prompt_ids, output_ids, logit_bias=params.logit_bias,
                           repetition_penalty=params.repetition_penalty,
                           presence_penalty=params.presence_penalty,
                           frequency_penalty=params.frequency_penalty)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampling ``params`` draws from: softmax of the filtered
    ``logits / temperature``; ``(..., V)`` -> ``(..., V)`` (speculative verification compares
    drafts against it, row by row). Without top-k, top-p or min-p nothing is filtered (a
    request's defaults): the rows go to the softmax as they are."""
    z = logits.float() / params.temperature
    if params.top_k is not None or params.top_p < 1.0 or params.min_p > 0.0:
        z = (filter_logits(z, params.top_k, params.top_p, params.min_p) if z.dim() == 1 else
             torch.stack([filter_logits(r, params.top_k, params.top_p, params.min_p)
                          for r in z]))
    return torch.softmax(z, dim=-1)


def sample_token(logits: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator) -> int:
    """One token drawn from ``logits`` ``(V,)`` at ``params``' temperature, top-k and top-p
    (a sampling, not a greedy, ``params``)."""
    probs = probabilities(logits, params)
    return int(torch.multinomial(probs.to(generator.device), 1, generator=generator))


def sample_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                  generators: Sequence[torch.Generator | None], *,
                  errors: str = "raise", histories: Sequence | None = None) -> list:
    """One token per row of ``logits`` ``(n, V)``; row i uses ``params[i]`` and
    ``generators[i]`` (needed when it samples: temperature >= ``MIN_TEMPERATURE``), and, where
    ``params[i]`` has logits processors, ``histories[i]`` = (prompt ids, output ids).

    ``errors="return"``: a row whose sampling raises gets the exception in its place and the
    other rows are still drawn, each from its own generator as if nothing had failed (the
    engine fails that one request and serves the rest)."""
    if logits.dim() != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(f"need logits (n, V) with n = len(params) = len(generators); got "
                         f"{tuple(logits.shape)}, {len(params)}, {len(generators)}")
    if errors not in ("raise", "return"):
        raise ValueError(f"errors must be 'raise' or 'return', got {errors!r}")
    # max's indices are argmax's (the first maximum of a row), and max takes less time than
    # argmax on a CPU
    greedy = logits.max(dim=-1).indices.tolist()
    out = []
    for i, (p, g) in enumerate(zip(params, generators)):
        try:
            if p.greedy and not p.has_processors:      # the batch's argmax: no call per row
                out.append(int(greedy[i]))
                continue
            row = logits[i]
            if p.has_processors:
                if histories is None:
                    raise ValueError(f"row {i} has logits processors but no history")
                row = process_logits(row, p, *histories[i])
            if p.greedy:
                out.append(int(row.argmax()))
                continue
            if g is None:
                raise ValueError(f"row {i} samples (temperature {p.temperature}) but has no "
                                 "torch.Generator")
            out.append(sample_token(row, p, g))
        except Exception as err:  # noqa: BLE001 - handed back when errors="return"
            if errors == "raise":
                raise
            out.append(err)
    return out


def token_logprobs(logits: torch.Tensor, token: int, top: int) -> tuple:
    """``(token, logprob, [(id, logprob) of the top most likely])`` under the model's raw
    distribution log_softmax(``logits``) ``(V,)`` — what vLLM reports by default, before any
    processor or temperature."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(lp, top) if top else None
    pairs = [] if best is None else [(int(i), float(v)) for v, i in zip(*best)]
    return int(token), float(lp[token]), pairs


def sample_step(caught: list[tuple], logits: torch.Tensor, speculator) -> tuple[dict, dict]:
    """A step's tokens: for each caught-up ``(sequence, drafts)`` of ``caught``, from its rows
    of ``logits`` (one row, or its drafts + 1), one sampled token (shared logits for the
    siblings that fork from it now, a JSON grammar's mask applied), or its drafts verified by
    ``speculator`` (:mod:`llminfra.engine.spec_decode`) and one more; an exception in its place
    if that fails (that request fails, the others go on). Returns ``(tokens, logprobs)``:
    ``logprobs[seq]`` the log-probabilities of a sampled token whose request asked for them —
    the scheduler writes both (:meth:`~llminfra.engine.scheduler.Scheduler.update_from_output`).
    Every runner's logits go through here (:mod:`llminfra.engine.model_runner`)."""
    plain, rows, out, row = [], [], {}, 0
    logprobs = {}
    for seq, drafts in caught:
        if drafts:
            try:
                out[seq] = speculator.verify(seq, logits[row:row + drafts + 1],
                                             seq.spec_token_ids[:drafts])
            except Exception as err:  # noqa: BLE001 - fails this request only
                out[seq] = err
        else:
            req = seq.request
            forks = req.forks_pending if seq.index == 0 and not seq.output_token_ids else []
            plain += [seq] + forks
            rows += [row] * (1 + len(forks))
        row += drafts + 1
    chosen = logits[rows]
    for i, seq in enumerate(plain):                 # structured output: only what the JSON allows
        if seq.grammar is not None:
            chosen[i] = chosen[i].masked_fill(~seq.grammar.allowed(chosen.shape[-1]),
                                              float("-inf"))
    tokens = sample_tokens(chosen, [s.params for s in plain], [s.generator for s in plain],
                           errors="return",
                           histories=[(s.prompt_token_ids, s.output_token_ids) for s in plain])
    for seq, token, row in zip(plain, tokens, rows):
        out[seq] = token if isinstance(token, Exception) else [token]
        if seq.params.logprobs is not None and not isinstance(token, Exception):
            logprobs[seq] = token_logprobs(logits[row], token, seq.params.logprobs)
    return out, logprobs
