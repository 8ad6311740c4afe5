"""When a sequence stops: the stop rules, in the order they are checked after each new token.

1. **structured output** — the request's JSON grammar (:mod:`.structured`) advances by the
   token; a complete JSON value ends the sequence (``"stop"``);
2. **stop strings** — the first stop string in the decoded text ends it (``"stop"``); the text
   up to it is what the request returns (:func:`~llminfra.engine.sampling_params.stop_at`);
3. **stop tokens** — the tokenizer's end of sequence or the chat's end of turn, unless the
   request ignores EOS (``"stop"``);
4. **length** — ``max_tokens`` generated, or the model's context full (``"length"``).

vLLM checks the same rules in its ``StopChecker``; the scheduler calls :func:`check_stop` for
every token it appends (:meth:`~llminfra.engine.scheduler.Scheduler.update_from_output`).
Taught in chapter 05.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from llminfra.engine.sampling_params import stop_at
from llminfra.engine.sequence import Sequence, SequenceStatus


def check_stop(seq: Sequence, token: int, stop_token_ids: Collection[int],
               decode: Callable | None, max_seq_len: int) -> SequenceStatus | None:
    """The status ``seq`` finishes with now that ``token`` is its newest output token, or
    None while it goes on. ``decode`` (token ids -> text) is needed by stop strings only;
    ``ValueError`` when a request has stop strings and there is none."""
    if seq.grammar is not None:                # structured output: the JSON goes on
        seq.grammar.advance(token)
    if seq.grammar is not None and seq.grammar.finished():
        return SequenceStatus.FINISHED_STOPPED
    stops = seq.params.stop_strings
    if stops:
        if decode is None:
            raise ValueError("stop strings need the scheduler's decode (token ids -> text)")
        text = seq.detok.text if seq.detok is not None else ""
        end = stop_at(text, stops)
        if end is not None:
            seq.stop_text = text[:end]
            return SequenceStatus.FINISHED_STOPPED
    if not seq.params.ignore_eos and token in stop_token_ids:
        return SequenceStatus.FINISHED_STOPPED
    if len(seq.output_token_ids) >= seq.max_tokens or seq.num_tokens > max_seq_len:
        return SequenceStatus.FINISHED_LENGTH
    return None
