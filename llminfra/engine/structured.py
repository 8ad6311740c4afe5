"""Structured output: JSON that always parses and matches its schema, by masking the logits.

A request with ``SamplingParams.json_schema`` (the OpenAI API's ``response_format`` — an object
``{"type": "object"}`` for ``json_object``, or the given schema for ``json_schema``) gets a
*matcher*: a grammar state that, before every sampled token, says which tokens of the vocabulary
may come next (a boolean mask over the logits; the others become -inf), and advances by the token
drawn. Tokens are pieces of bytes — a BPE token can hold ``", "`` or half of a UTF-8 character —
so the grammar must be compiled against the tokenizer's own vocabulary; that is the work of
`llguidance <https://github.com/guidance-ai/llguidance>`_ (Microsoft, MIT licence), chosen by
measurement against xgrammar and outlines-core on SmolLM2's 49,152-token vocabulary, one CPU
thread (a prototype comparison of 2026-12-03, library calls only): all three gave valid,
schema-true JSON on the byte-level BPE; llguidance compiled a schema in about 1 ms and masked a
token in about 15 µs, has no dependencies and reads our ``tokenizers`` JSON as it is; xgrammar
was faster per token (about 9 µs) but imports ``transformers`` at run time and its JSON grammar
also admits arrays; outlines-core took seconds to compile a generic JSON object and 60–70 µs a
token. In the engine, with the mask turned into a tensor and applied to the logits, a token costs
0.2–0.4 ms (``python -m llminfra bench structured``, llminfra/data/bench_structured_cpu.json)
beside a 60 ms decode step.

The JSON is written compactly, as ``json.dumps`` does (``", "`` and ``": "``, no other
whitespace): a small model left free to choose whitespace can spend its whole budget on it.
Once the object is complete only a stop token may follow; a tokenizer without one (the tiny
model's bytes) ends the sequence there. ``max_tokens`` can still cut an answer short (finish
reason ``"length"``, as with OpenAI). Taught in chapter 05.
"""

from __future__ import annotations

import json
from functools import lru_cache

import llguidance
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from llminfra.engine.sampling_params import InvalidParameter

#: how the JSON is laid out (compact, as json.dumps with its default separators)
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the byte-level BPE alphabet)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_tokenizer_json() -> str:
    """A Hugging Face ``tokenizer.json`` for the byte tokenizer (token id = byte value): a
    byte-level BPE with 256 tokens and no merges, so the grammar library reads it like any."""
    stand_in = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={stand_in[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


@lru_cache(maxsize=8)
def _ll_tokenizer(tokenizer_json: str, vocab_size: int, stops: tuple[int, ...]):
    if not stops:                  # the byte tokenizer: the library's default end token, unused
        return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size)
    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(stops))


@lru_cache(maxsize=64)
def _grammar(schema_json: str):
    return llguidance.LLMatcher.grammar_from_json_schema(json.loads(schema_json),
                                                         defaults=LAYOUT)


class JsonMatcher:
    """The grammar state of one sequence: :meth:`allowed` before a token, :meth:`advance`
    after it, :meth:`finished` once the JSON is complete."""

    def __init__(self, matcher, vocab_size: int, has_stop: bool):
        self._m, self.vocab_size, self._has_stop = matcher, vocab_size, has_stop
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def allowed(self, width: int) -> torch.Tensor:
        """Bool ``(width,)``: True where a token may come next (False past the vocabulary,
        should the logits be wider)."""
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.vocab_size]
        mask = torch.from_numpy(bits.view(np.bool_).copy())
        if width > self.vocab_size:
            mask = torch.cat([mask, torch.zeros(width - self.vocab_size, dtype=torch.bool)])
        return mask[:width]

    def advance(self, token: int) -> None:
        """Take the token drawn; ``ValueError`` if the grammar forbids it."""
        if not self._m.consume_token(int(token)) or self._m.is_error():
            raise ValueError(f"token {token} breaks the JSON grammar: {self._m.get_error()}")

    def finished(self) -> bool:
        """True once the JSON is complete (only a stop token could follow)."""
        return self._m.is_stopped() or self._m.is_accepting() and not self._has_stop


def json_matcher(tokenizer, vocab_size: int, stop_token_ids, schema: dict) -> JsonMatcher:
    """A fresh matcher for ``schema`` (a JSON schema; ``{"type": "object"}`` for any object)
    over ``tokenizer`` (a :class:`~llminfra.model.BPETokenizer`, or the byte tokenizer).
    ``ValueError`` for a schema the library cannot compile."""
    backend = getattr(tokenizer, "backend", None)
    text = backend.to_str() if backend is not None else byte_tokenizer_json()
    stops = tuple(sorted(int(t) for t in stop_token_ids))
    try:
        grammar = _grammar(json.dumps(schema))             # property order kept
    except (TypeError, ValueError) as e:
        raise ValueError(f"cannot compile the JSON schema: {e}") from None
    m = llguidance.LLMatcher(_ll_tokenizer(text, vocab_size, stops), grammar, log_level=0)
    if m.is_error():
        raise ValueError(f"cannot compile the JSON schema: {m.get_error()}")
    return JsonMatcher(m, vocab_size, has_stop=bool(stops))


def request_grammar(params, tokenizer, vocab_size: int, stop_token_ids) -> JsonMatcher | None:
    """The matcher of a request whose ``SamplingParams.json_schema`` is set, else None; a schema
    that does not compile is an :class:`~llminfra.engine.sampling_params.InvalidParameter`
    naming ``response_format`` (the API field it came from)."""
    if params.json_schema is None:
        return None
    try:
        return json_matcher(tokenizer, vocab_size, stop_token_ids, params.json_schema)
    except ValueError as e:
        raise InvalidParameter("response_format", str(e)) from None
