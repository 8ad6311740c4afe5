"""What the engine hands back after a step: :class:`RequestOutput` with its completions.

Each object is a snapshot: ``text`` and ``token_ids`` are cumulative (everything generated so
far), so a streaming server sends the difference from the previous snapshot. The field names
follow vLLM's ``RequestOutput`` / ``CompletionOutput``; ``finish_reason`` uses the OpenAI API's
words. Taught in chapter 05.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llminfra.engine.metrics import RequestMetrics
from llminfra.engine.sampling_params import held_back

if TYPE_CHECKING:
    from llminfra.engine.sequence import Request, Sequence


@dataclass
class CompletionOutput:
    """Completion ``index`` of a request: text and token ids so far, and why it ended
    (``None`` while running, ``"stop"``, ``"length"``, ``"abort"`` or ``"error"``). While it
    runs, ``text`` leaves out an end that may still become a stop string
    (:func:`~llminfra.engine.sampling_params.held_back`), so each snapshot's text extends the
    previous one and the last one is the finished text. ``logprobs`` (when the request asked):
    one ``(token, logprob, [(id, logprob), …])`` per token of ``token_ids``."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[tuple] | None = None

    @property
    def finished(self) -> bool:
        """True once it has a finish reason."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One request's state after a step: prompt, completions, whether all are finished, its
    timestamps (:class:`~llminfra.engine.metrics.RequestMetrics`), and ``error``: why it failed
    (its completions then end with ``"error"``), else None."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    error: str | None = None


def output_text(seq: Sequence, tokenizer, stop_token_ids: frozenset[int]) -> str:
    """The text of a sequence's output, without the stop token that ended it (its id stays in
    ``token_ids``, as vLLM reports it)."""
    if seq.detok is not None:            # decoded a few tokens at a time as they came
        return seq.detok.text
    ids = seq.output_token_ids
    if ids and ids[-1] in stop_token_ids and not seq.params.ignore_eos:
        ids = ids[:-1]
    return tokenizer.decode(ids)


def visible_text(seq: Sequence, tokenizer, stop_token_ids: frozenset[int]) -> str:
    """What a snapshot shows: the text up to the stop string once stopped, else the text less
    an end that may still become a stop string while the sequence runs — the one rule
    (:func:`~llminfra.engine.sampling_params.held_back`) for streamed and final outputs."""
    if seq.stop_text is not None:
        return seq.stop_text
    text = output_text(seq, tokenizer, stop_token_ids)
    stops = seq.params.stop_strings
    if stops and not seq.status.is_finished:
        text = text[:len(text) - held_back(text, stops)]
    return text


def request_output(req: Request, tokenizer, stop_token_ids: frozenset[int]) -> RequestOutput:
    """The snapshot of ``req`` after a step: one :class:`CompletionOutput` per sequence."""
    comps = [CompletionOutput(s.index, visible_text(s, tokenizer, stop_token_ids),
                              list(s.output_token_ids), s.status.finish_reason,
                              list(s.output_logprobs) if s.params.logprobs is not None else None)
             for s in req.seqs]
    return RequestOutput(req.request_id, req.prompt, list(req.prompt_token_ids), comps,
                         req.finished, req.metrics, req.error)
