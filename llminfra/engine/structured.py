"""Structured output: JSON that always parses and matches its schema, by masking the logits.

A request with ``SamplingParams.json_schema`` (the OpenAI API's ``response_format`` — an object
``{"type": "object"}`` for ``json_object``, or the given schema for ``json_schema``) gets a
*matcher*: a grammar state that, before every sampled token, says which tokens of the vocabulary
may come next (a boolean mask over the logits; the others become -inf), and advances by the token
drawn. Tokens are pieces of bytes — a BPE token can hold ``", "`` or half of a UTF-8 character —
so the grammar must be compiled against the tokenizer's own vocabulary; that is the work of
`llguidance <https://github.com/guidance-ai/llguidance>`_ (Microsoft, MIT licence), chosen
over xgrammar and outlines-core on SmolLM2's 49,152-token vocabulary (a prototype comparison of
library calls, 2026-12-03): all three gave valid, schema-true JSON on the byte-level BPE;
llguidance has no dependencies and reads our ``tokenizers`` JSON as it is, xgrammar imports
``transformers`` at run time and its JSON grammar also admits arrays, and outlines-core compiled
a generic JSON object slowly. What a masked token costs in the engine, beside a decode step, is
the recorded ``python -m llminfra bench structured`` run
(``llminfra/data/bench_structured_cpu.json``).

The JSON is written compactly, as ``json.dumps`` does (``", "`` and ``": "``, no other
whitespace): a small model left free to choose whitespace can spend its whole budget on it.
Once the object is complete only a stop token may follow; a tokenizer without one (the tiny
model's bytes) ends the sequence there. ``max_tokens`` can still cut an answer short (finish
reason ``"length"``, as with OpenAI). Taught in chapter 05.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

import llguidance
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from llminfra.engine.sampling_params import InvalidParameter

#: how the JSON is laid out (compact, as json.dumps with its default separators)
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

#: the longest schema accepted, as compact JSON text (characters); OpenAI's structured outputs
#: cap a schema too (nesting, property count, total string length)
MAX_SCHEMA_CHARS = 32_768
#: the deepest nesting of JSON objects and arrays in a schema (``{"properties": {"a": …}}`` is
#: two levels per nested object)
MAX_SCHEMA_DEPTH = 32
#: the largest number of repeats a ``pattern``'s counted repetitions may multiply to:
#: ``a{1000}`` is 1,000, ``(a{1000}){1000}`` is 1,000,000 (refused: a lexer state per repeat)
MAX_PATTERN_REPEATS = 10_000
#: the largest a ``pattern`` may expand to, its counted repetitions written out
#: (:func:`pattern_size`): ``a{9999}`` a hundred times in a row is 999,900 (refused: llguidance
#: then fails the request mid-answer with "too many expressions constructed"; 5 × ``a{9999}``
#: still compiles, 10 × does not, with llguidance 1.9.1)
MAX_PATTERN_SIZE = 20_000
#: llguidance's resource limits (``LLParserLimits``; its defaults in brackets, measured on
#: SmolLM2's vocabulary): lexer states cost about 1-2 kB each (250,000 → 20,000, so at most
#: ~40 MB), fuel is time (about 50 units a µs to build a lexer, 1,000,000 → 200,000; 14 a µs for
#: one mask, 200,000 → 100,000), the grammar's symbols 500,000 → 100,000. A grammar past one of
#: them puts its matcher in an error state: refused when the request comes, or that request
#: failed with the library's reason should it happen later in the answer.
PARSER_LIMITS = (("max_lexer_states", 20_000), ("initial_lexer_fuel", 200_000),
                 ("step_lexer_fuel", 100_000), ("max_grammar_size", 100_000))


_COUNT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def _count(digits: str) -> int:
    return int(digits) if len(digits) <= 12 else 10 ** 12


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


@lru_cache(maxsize=1)
def _byte_tokenizer_json() -> str:
    return byte_tokenizer_json()


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


def _limits():
    return llguidance.LLParserLimits(**dict(PARSER_LIMITS))


def check_schema_shape(schema) -> str:
    """The schema as compact JSON text, after the checks that need no compiler: a JSON object,
    nested at most :data:`MAX_SCHEMA_DEPTH` deep, at most :data:`MAX_SCHEMA_CHARS` long, each
    ``pattern`` repeating at most :data:`MAX_PATTERN_REPEATS` times (:func:`pattern_repeats`)
    and expanding to at most :data:`MAX_PATTERN_SIZE` items (:func:`pattern_size`).
    ``ValueError`` with the
    reason otherwise. The walk is iterative: a schema nested thousands deep (or a Python dict
    that contains itself) is refused, never a ``RecursionError``."""
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
    stack, patterns = [(schema, 1)], []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"the JSON schema is nested more than {MAX_SCHEMA_DEPTH} levels "
                             f"deep (objects and arrays)")
        children = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in children:
            if isinstance(node, dict) and not isinstance(key, str):
                raise ValueError(f"JSON object keys must be strings, got {key!r}")
            if key == "pattern" and isinstance(value, str):
                patterns.append(value)
            if isinstance(value, dict) and key == "patternProperties":
                patterns.extend(k for k in value if isinstance(k, str))
            if isinstance(value, (dict, list)):
                stack.append((value, depth + 1))
            elif not (value is None or isinstance(value, (str, int, float, bool))):
                raise ValueError(f"a JSON schema holds JSON values only, got "
                                 f"{type(value).__name__} at {key!r}")
    try:
        text = json.dumps(schema, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"the JSON schema is not JSON: {e}") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError(f"the JSON schema is {len(text):,} characters long; at most "
                         f"{MAX_SCHEMA_CHARS:,} are accepted")
    for pattern in patterns:
        repeats = pattern_repeats(pattern)
        if repeats > MAX_PATTERN_REPEATS:
            raise ValueError(f"the pattern {pattern[:60]!r} repeats {repeats:,} times "
                             f"(counted repetitions multiplied); at most "
                             f"{MAX_PATTERN_REPEATS:,} are accepted")
        size = pattern_size(pattern)
        if size > MAX_PATTERN_SIZE:
            raise ValueError(f"the pattern {pattern[:60]!r} ({len(pattern):,} characters) "
                             f"expands to {size:,} items (counted repetitions written out: "
                             f"added in sequence and over alternatives, multiplied when "
                             f"nested); at most {MAX_PATTERN_SIZE:,} are accepted")
    return text


#: the largest size :func:`pattern_size` reports (a count past it is refused all the same)
_SIZE_CAP = 10 ** 18


def _atom_end(pattern: str, i: int) -> int:
    """The index after the escape (``\\x``) or character class (``[…]``, ``[^…]``, ``[]…]``)
    that starts at ``pattern[i]``: one item to the lexer, whatever it holds."""
    if pattern[i] == "\\":
        return i + 2
    j = i + 1 + (pattern[i + 1:i + 2] == "^")
    j += pattern[j:j + 1] == "]"
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def pattern_size(pattern: str) -> int:
    """How large a regular expression is with its counted repetitions written out — what the
    grammar library's lexer builds: a character, class or escape is 1, an anchor (``^``,
    ``$``) 0; a sequence adds its items, an alternation adds its branches, ``X{n}`` /
    ``X{n,m}`` / ``X{n,}`` is ``size(X)`` times the larger count, and ``*`` / ``+`` / ``?``
    leave ``X`` as it is (the lexer loops). ``a{3}b`` → 4, ``(ab|c){10}`` → 30,
    ``"a{9999}" * 100`` → 999,900 (the nested product alone, :func:`pattern_repeats`, is
    9,999). Capped at 10¹⁸."""
    # one frame per open group: [size of closed branches, current branch, its last item]
    stack, i = [[0, 0, 0]], 0
    while i < len(pattern):
        c, frame = pattern[i], stack[-1]
        if c in "\\[":
            item, i = 1, _atom_end(pattern, i)
        elif c == "(":
            stack.append([0, 0, 0])
            i += 3 if pattern.startswith("?:", i + 1) else 1       # (?:…) flags count 0
            continue
        elif c == ")" and len(stack) > 1:
            closed = stack.pop()
            item, frame, i = closed[0] + closed[1], stack[-1], i + 1
        elif c == "|":
            frame[0], frame[1], frame[2] = frame[0] + frame[1], 0, 0
            i += 1
            continue
        elif c == "{" and (m := _COUNT.match(pattern, i)):
            n = max(_count(m.group(1)), _count(m.group(2) or "0"), 1)
            grown = min(frame[2] * n, _SIZE_CAP)
            frame[1], frame[2], i = min(frame[1] - frame[2] + grown, _SIZE_CAP), grown, m.end()
            continue
        elif c in "*+?":
            i += 1
            continue
        else:
            item, i = (0 if c in "^$" else 1), i + 1
        frame[1], frame[2] = min(frame[1] + item, _SIZE_CAP), item
    while len(stack) > 1:                          # an unclosed group: counted as if closed
        closed = stack.pop()
        stack[-1][1] += closed[0] + closed[1]
    return min(stack[0][0] + stack[0][1], _SIZE_CAP)


def pattern_repeats(pattern: str) -> int:
    """The largest product of nested counted repetitions (``{n}``, ``{n,}``, ``{n,m}``) in a
    regular expression: ``a{3}`` → 3, ``(a{2}b){5}`` → 10, ``(x{4}){5}y{30}`` → 30. Escapes
    and character classes are skipped; an unbounded ``*`` / ``+`` counts 1 (the lexer loops)."""
    stack, last, best, i = [1], 1, 1, 0     # stack: max weight inside each open group
    while i < len(pattern):
        c = pattern[i]
        if c in "\\[":
            last, i = 1, _atom_end(pattern, i)
        elif c == "(":
            stack.append(1)
            i += 1
        elif c == ")":
            last = stack.pop() if len(stack) > 1 else 1
            i += 1
        elif c == "{" and (m := _COUNT.match(pattern, i)):
            n = max(_count(m.group(1)), _count(m.group(2) or "0"))
            last *= max(n, 1)
            i = m.end()
        else:
            last, i = 1, i + 1
        stack[-1] = max(stack[-1], last)
        best = max(best, last)
    return max(best, *stack)


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
        """Take the token drawn; ``ValueError`` if the grammar forbids it, or with the
        library's reason if the grammar failed (a limit of :data:`PARSER_LIMITS` reached)."""
        if self._m.is_error():
            raise ValueError(f"the JSON grammar failed: {_first_line(self._m.get_error())}")
        if not self._m.consume_token(int(token)) or self._m.is_error():
            raise ValueError(f"token {token} breaks the JSON grammar: {self._m.get_error()}")

    def finished(self) -> bool:
        """True once the JSON is complete (only a stop token could follow)."""
        return self._m.is_stopped() or self._m.is_accepting() and not self._has_stop


def json_matcher(tokenizer, vocab_size: int, stop_token_ids, schema: dict) -> JsonMatcher:
    """A fresh matcher for ``schema`` (a JSON schema; ``{"type": "object"}`` for any object)
    over ``tokenizer`` (a :class:`~llminfra.model.BPETokenizer`, or the byte tokenizer), its
    first mask computed. ``ValueError`` with the reason for a schema past the limits of
    :func:`check_schema_shape`, one the library cannot compile or compiles past
    :data:`PARSER_LIMITS`, and one that admits no JSON value."""
    schema_json = check_schema_shape(schema)                # property order kept
    stops = tuple(sorted(int(t) for t in stop_token_ids))
    text = getattr(tokenizer, "backend_json", None)
    if text is None:
        backend = getattr(tokenizer, "backend", None)
        text = backend.to_str() if backend is not None else _byte_tokenizer_json()
    try:
        grammar = _grammar(schema_json)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"cannot compile the JSON schema: {_first_line(e)}") from None
    m = llguidance.LLMatcher(_ll_tokenizer(text, vocab_size, stops), grammar, log_level=0,
                             limits=_limits())
    if m.is_error():
        raise ValueError(f"cannot compile the JSON schema: {_first_line(m.get_error())}")
    matcher = JsonMatcher(m, vocab_size, has_stop=bool(stops))
    first = matcher.allowed(vocab_size)          # the first mask: the lexer is built here
    if m.is_error() or not bool(first.any()):
        reason = _first_line(m.get_error()) if m.is_error() else "no token may start it"
        if "NoExtensionBias" in reason or reason == "no token may start it":
            reason = "it admits no JSON value (a $ref that only leads back to itself?)"
        raise ValueError(f"cannot use the JSON schema: {reason}")
    return matcher


def _first_line(err) -> str:
    """The reason of a library error, without the parser state it dumps after it."""
    return str(err).strip().split("\n", 1)[0][:300]


def check_json_schema(schema: dict, tokenizer, vocab_size: int | None = None,
                      stop_token_ids=None) -> None:
    """Refuse, before a request is accepted, a schema the engine could not serve (what
    :func:`json_matcher` refuses: the shape limits of :func:`check_schema_shape`, a compile
    error, a grammar past :data:`PARSER_LIMITS`, a grammar that admits no JSON value). An
    :class:`~llminfra.engine.sampling_params.InvalidParameter` naming ``response_format``.
    ``vocab_size`` and ``stop_token_ids`` default to the tokenizer's, as the engine takes
    them. A server calls it in a worker thread: the library releases the GIL."""
    if vocab_size is None:
        vocab_size = tokenizer.vocab_size
    if stop_token_ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        stop_token_ids = set(getattr(tokenizer, "stop_token_ids", ()) or ()) | (
            {eos} if eos is not None else set())
    try:
        json_matcher(tokenizer, vocab_size, stop_token_ids, schema)
    except ValueError as e:
        raise InvalidParameter("response_format", str(e)) from None


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
