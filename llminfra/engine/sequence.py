"""Requests and sequences, the states a sequence moves through, and what a request gives back.

A *request* is one prompt with its :class:`SamplingParams`; it owns ``n`` *sequences* (its
completions), which the scheduler handles one by one. A sequence's life::

    WAITING ──admit──▶ RUNNING ──stop string / EOS──▶ FINISHED_STOPPED
       ▲                │  │└──────max_tokens / context full──▶ FINISHED_LENGTH
       │   preempt      │  │
       └──(recompute)───┘  └──preempt (swap)──▶ PREEMPTED ──swap in──▶ RUNNING
    any unfinished state ──abort──▶ FINISHED_ABORTED
    any unfinished state ──its step failed (an exception)──▶ FINISHED_ERROR

A sequence preempted by *recompute* loses its K/V and waits again (state ``PREEMPTED``, at the
head of the waiting queue); its prompt and the tokens it has generated are run again as one
prefill. One preempted by *swap* keeps its K/V in CPU memory (Kwon et al. 2023,
arXiv:2309.06180, §4.5). ``num_computed_tokens`` counts the tokens whose K/V are in the cache;
the step schedules the rest (a prefill chunk, or the one new token of a decode, with any
``spec_token_ids`` — drafts a proposer guessed — after it, for the model to verify).

A sequence's text is decoded incrementally (:class:`IncrementalDetokenizer`): each step decodes
a few tokens, not the whole completion again. A streamed completion of ``n`` tokens decoded
from scratch after every token costs ``1 + 2 + … + n = O(n²)`` token look-ups; the engine only
needs what the newest tokens add. Two things make "decode just the new tokens" wrong, and the rule below handles both:

* a token can be part of a character: a byte-level BPE token may end inside a Korean syllable
  or an emoji (three or four UTF-8 bytes), so the new token's bytes alone decode to U+FFFD;
* a tokenizer may render a token differently depending on what precedes it.

So the decoder keeps two offsets into the token ids (the scheme of Hugging Face's
text-generation-inference and of vLLM's ``detokenize_incrementally``, in our words):
``prefix_offset`` — where a short window of already-emitted tokens starts, decoded again only
as context — and ``read_offset`` — the first token whose text has not been emitted. After new
tokens arrive::

    before = decode(ids[prefix_offset:read_offset])     # context, already emitted
    after  = decode(ids[prefix_offset:])                 # context + new tokens
    if after is longer and does not end in U+FFFD:       # every new character is complete
        emit after[len(before):]; prefix_offset, read_offset = read_offset, len(ids)

otherwise the new tokens wait — but not for ever: bytes that never form a character (a lone
UTF-8 byte token, repeated) end in U+FFFD after every token, and a window that only grew would
decode ``1 + … + n`` tokens again. So a wait emits ``settled = decode(ids[prefix_offset:-1])``
(all but the newest token) when ``after`` starts with it and it does not end in U+FFFD or
``after`` is longer: a U+FFFD some character follows can no longer change (UTF-8 is decoded
left to right), one at the very end may be an unfinished character. Each token is then decoded
a bounded number of times, linear in the tokens (a test counts them).
:attr:`IncrementalDetokenizer.text` is the
emitted text plus the pending tail as it decodes now (U+FFFD where a character is unfinished),
so it always equals ``decode(ids)`` — a test checks it on random ids with Korean and emoji.

After each step the engine hands back a :class:`RequestOutput` per request touched, with a
:class:`CompletionOutput` per sequence (:func:`request_output`). Each is a snapshot: ``text``
and ``token_ids`` are cumulative (everything generated so far), so a streaming server sends the
difference from the previous snapshot. The field names follow vLLM's ``RequestOutput`` /
``CompletionOutput``; ``finish_reason`` uses the OpenAI API's words.

Taught in chapter 05.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from llminfra.engine.metrics import RequestMetrics
from llminfra.engine.sampling_params import SamplingParams, held_back


#: what a token ends in while its character is unfinished (U+FFFD)
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """The text of a growing list of token ids, decoded a few tokens at a time.

    ``decode`` maps token ids to text (the tokenizer's ``decode``). Feed new ids with
    :meth:`add`; read :attr:`text` (everything so far) at any time.
    ``d = IncrementalDetokenizer(tok.decode); d.add([72, 105]); d.text == tok.decode([72, 105])``.
    """

    def __init__(self, decode: Callable[[Seq[int]], str]):
        self._decode = decode
        self.ids: list[int] = []
        self.emitted = ""                 # text of ids[:read_offset], final
        self.prefix_offset = 0
        self.read_offset = 0
        self._tail = ""                   # what ids[read_offset:] add, as they decode now

    def add(self, new_ids: Seq[int]) -> str:
        """Take ``new_ids``; return the text they completed (may be ``""`` while a character
        is unfinished)."""
        if not new_ids:
            return ""
        self.ids.extend(int(t) for t in new_ids)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT) \
                and after.startswith(before):
            return self._emit(after[len(before):], len(self.ids), "")
        if after.startswith(before) and len(self.ids) - 1 > self.read_offset:
            settled = self._decode(self.ids[self.prefix_offset:-1])    # all but the newest
            if len(settled) > len(before) and settled.startswith(before) and after.startswith(
                    settled) and (len(after) > len(settled) or not settled.endswith(REPLACEMENT)):
                return self._emit(settled[len(before):], len(self.ids) - 1, after[len(settled):])
        self._tail = after[len(before):] if after.startswith(before) else \
            self._decode(self.ids)[len(self.emitted):]
        return ""

    def _emit(self, delta: str, read_offset: int, tail: str) -> str:
        """Make ``delta`` final: the window moves on to ``ids[read_offset:]``."""
        self.emitted += delta
        self.prefix_offset, self.read_offset = self.read_offset, read_offset
        self._tail = tail
        return delta

    @property
    def text(self) -> str:
        """All the text so far: emitted text plus the pending tail (``decode(ids)``)."""
        return self.emitted + self._tail


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life (module docstring)."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        """True for the four finished states."""
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> str | None:
        """``"stop"``, ``"length"`` (the OpenAI API's words), ``"abort"``, ``"error"`` (vLLM's),
        or None."""
        return {"FINISHED_STOPPED": "stop", "FINISHED_LENGTH": "length",
                "FINISHED_ABORTED": "abort", "FINISHED_ERROR": "error"}.get(self.name)


#: allowed moves of the state machine
TRANSITIONS = MappingProxyType({
    SequenceStatus.WAITING: frozenset({SequenceStatus.RUNNING, SequenceStatus.FINISHED_ABORTED,
                                       SequenceStatus.FINISHED_ERROR}),
    SequenceStatus.RUNNING: frozenset({SequenceStatus.PREEMPTED, SequenceStatus.FINISHED_STOPPED,
                                       SequenceStatus.FINISHED_LENGTH,
                                       SequenceStatus.FINISHED_ABORTED,
                                       SequenceStatus.FINISHED_ERROR}),
    SequenceStatus.PREEMPTED: frozenset({SequenceStatus.RUNNING,
                                         SequenceStatus.FINISHED_ABORTED,
                                         SequenceStatus.FINISHED_ERROR}),
})


@dataclass(eq=False)
class Sequence:
    """One completion being generated. ``cache_seq`` is its id in the paged KV cache while it
    holds blocks; ``swapped`` its K/V in CPU memory while preempted by swap."""

    seq_id: int
    request: "Request"
    index: int
    prompt_token_ids: list[int]
    max_tokens: int
    generator: torch.Generator | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    cache_seq: int | None = None
    swapped: object | None = None
    stop_text: str | None = None
    spec_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[tuple] = field(default_factory=list)
    grammar: object | None = None
    detok: IncrementalDetokenizer | None = None

    def append_output(self, token: int, decode, is_stop: bool) -> None:
        """Append one generated token (the scheduler's write, once per token) and, unless it
        is the stop token that ends the sequence (its id is kept, its text is not) or there is
        no ``decode``, give it to the incremental detokenizer behind :attr:`detok`."""
        self.output_token_ids.append(token)
        if decode is not None and not is_stop:
            if self.detok is None:
                self.detok = IncrementalDetokenizer(decode)
            self.detok.add([token])

    def set_status(self, new: SequenceStatus) -> None:
        """Move to ``new``; ``ValueError`` if the state machine does not allow it."""
        if new not in TRANSITIONS.get(self.status, frozenset()):
            raise ValueError(f"sequence {self.seq_id}: no transition {self.status.name} -> "
                             f"{new.name}")
        self.status = new

    @property
    def arrival_time(self) -> float:
        """Arrival of its request (the scheduler's priority: earlier first)."""
        return self.request.metrics.arrival_time

    @property
    def params(self) -> SamplingParams:
        """Its request's sampling parameters."""
        return self.request.params

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next one can be sampled."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while reading the prompt (or re-reading it after a recompute preemption)."""
        return self.num_uncomputed_tokens > 1 or not self.output_token_ids

    @property
    def group_size(self) -> int:
        """Sequences it becomes once it runs: itself, plus (sequence 0 of a request with
        n > 1, before it has read the prompt) the siblings that will fork from it. What the
        scheduler counts against ``max_num_seqs``."""
        return 1 + (len(self.request.forks_pending) if self.index == 0 else 0)

    def step_tokens(self, n: int) -> list[int]:
        """The ``n`` tokens it brings to this step (its next known tokens, then drafts): tokens
        ``num_computed_tokens`` .. + n of prompt + output + drafts, sliced without joining them
        (a decode step takes one token; the lists hold the whole context)."""
        out, i = [], self.num_computed_tokens
        for part in (self.prompt_token_ids, self.output_token_ids, self.spec_token_ids):
            if i < len(part):
                out += part[i:i + n - len(out)]
            i = max(0, i - len(part))
            if len(out) == n:
                break
        return out

    def token_ids(self) -> list[int]:
        """Prompt followed by the generated tokens."""
        return self.prompt_token_ids + self.output_token_ids

    def reserve_tokens(self, max_seq_len: int) -> int:
        """Most tokens it can ever hold: prompt + max_tokens, capped by the model's context."""
        return min(len(self.prompt_token_ids) + self.max_tokens, max_seq_len)


@dataclass(eq=False)
class Request:
    """One prompt, its parameters, its ``n`` sequences and its timestamps. ``forks_pending``:
    sequences 1 .. n-1 until sequence 0 has read the prompt; they are then forked from it
    (sharing its blocks, copy-on-write) instead of reading the prompt again. ``error``: why the
    request failed (finish reason ``"error"``), else None."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    seqs: list[Sequence] = field(default_factory=list)
    forks_pending: list[Sequence] = field(default_factory=list)
    error: str | None = None

    @property
    def finished(self) -> bool:
        """All its sequences are finished."""
        return all(s.status.is_finished for s in self.seqs)


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
