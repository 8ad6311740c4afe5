"""How to pick each next token, and when to stop: :class:`SamplingParams`.

The knobs of the OpenAI completions API and of vLLM's ``SamplingParams``, validated once, when
the object is made:

* ``temperature`` T: p_i = softmax(z / T)_i; T = 0 means greedy (argmax), no randomness;
* ``top_k``: keep only the k largest logits (Fan et al. 2018, arXiv:1805.04833, §5.4);
* ``top_p``: keep the smallest set of tokens whose probabilities sum to at least p, the nucleus
  (Holtzman et al. 2020, arXiv:1904.09751, §3.1);
* ``n`` completions per prompt, ``seed`` for reproducible sampling (completion j draws from a
  ``torch.Generator`` seeded ``(seed + j) mod 2**64``: :meth:`SamplingParams.seed_of`), ``stop``
  strings that end a completion (the stop string itself is not returned), ``max_tokens`` new
  tokens at most (None: all the room the context and the KV pool leave, the length rule
  below, which the engine applies when the request arrives);
  ``ignore_eos`` keeps generating past the model's end-of-sequence tokens
  (vLLM's extension, for load tests that want outputs of a set length);
* logits processors, applied before temperature (:func:`llminfra.engine.sampler.process_logits`,
  greedy requests too): ``logit_bias`` {token id: bias} added to the logits (OpenAI: bias in
  [-100, 100]); ``presence_penalty`` and ``frequency_penalty`` (OpenAI, in [-2, 2]) lower a
  generated token's logit by presence + count · frequency; ``repetition_penalty`` r > 0 (Keskar
  et al. 2019, arXiv:1909.05858, §4.1; vLLM's and transformers' rule) divides a positive logit of
  any token already in the prompt or the output by r and multiplies a negative one by r;
  ``min_p`` (Nguyen et al. 2024, arXiv:2407.01082) drops tokens whose probability is below
  min_p times the most likely one's;
* ``logprobs`` N: with each generated token, its log-probability and the N most likely tokens'
  (under the model's raw distribution, as vLLM reports them by default);
* ``json_schema``: the output must be JSON matching this schema (``{"type": "object"}``: any
  object), enforced token by token (:mod:`llminfra.engine.structured`);
* ``num_speculative_tokens``: this request's γ for speculative decoding (None: the engine's;
  a request with logits processors, logprobs or a JSON schema is not speculated: its drafts
  would need them at every position).

Every value the validator accepts must be safe to sample with: a temperature below
:data:`MIN_TEMPERATURE` acts as greedy (z / T with T = 1e-39 is ±inf in float32, and softmax of
it NaN; vLLM treats T < 1e-5 as greedy for the same reason), and the nucleus always keeps the
most likely token (:func:`llminfra.model.sampling.filter_logits`), however small ``top_p``.

Stop strings follow one rule (:func:`stop_at`, :func:`held_back`), which the engine applies
to every output, streamed or not: a completion ends before the first occurrence of any stop
string; while it runs, the end of its text that could still become a stop string is held back,
so a stream never sends text that a later token turns into part of a stop string.

Bad values raise :class:`InvalidParameter`, a ``ValueError`` naming the field (a server turns
it into a 400 with that ``param``).

How long a request may be is one rule, checked by the engine and the server alike: a request
of ``n_prompt`` prompt tokens asking for ``max_tokens`` new ones fits when::

    1 <= n_prompt,    n_prompt + max_tokens <= C,    n_prompt + max_tokens <= B * b

* C is the context: the model's ``max_seq_len`` in :meth:`LLMEngine.add_request
  <llminfra.engine.engine.LLMEngine.add_request>`, the server's ``max_model_len`` (which may be
  set below the model's) in :mod:`llminfra.serving.server`. Prompt and completion count
  together, OpenAI's rule ("this model's maximum context length is C tokens") and vLLM's
  OpenAI server's; so a prompt of C tokens leaves no room and is refused.
* B * b is what the paged KV pool holds: ``num_blocks`` B of ``block_size`` b tokens. A sequence
  may grow to ``n_prompt + max_tokens`` tokens, which need ``ceil((n_prompt + max_tokens) / b)``
  blocks; a request whose worst case needs more than the whole pool could never finish. (The
  last sampled token's K/V is never written, so the bound is one token cautious; it is the
  same count as the context's, so one sum is checked against both.) vLLM instead refuses to
  start with a pool smaller than one full context; this engine takes small pools, which
  chapter 05 uses to show preemption, and refuses the requests that cannot fit instead.
* ``max_tokens = None`` asks for all the room there is: ``min(C, B * b) - n_prompt``.

:func:`max_tokens_for` returns the effective ``max_tokens`` or raises an
:class:`InvalidParameter` naming the field at fault (``prompt`` or ``max_tokens``), the value
and what is allowed; a refusal for the context or the pool is a :class:`RequestTooLong`, whose
``code`` a server answers with.

Taught in chapter 05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llminfra.kvcache.blocks import blocks_needed

#: temperatures below this act as greedy (argmax): see the module docstring
MIN_TEMPERATURE = 1e-5
#: seeds are what ``torch.Generator.manual_seed`` takes: 0 .. 2**64 - 1
SEED_MODULUS = 2**64
#: most entries of ``logit_bias`` (OpenAI allows 300) and most ``logprobs`` per token (20)
MAX_LOGIT_BIAS = 300
MAX_LOGPROBS = 20
#: at most this many characters of a bad value are echoed in an error message
MAX_ECHO_CHARS = 200


def clip(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the last one "…": an error message quotes a bad
    value without echoing a 5 MB one back. ``clip("ab" * 200, 6) == "ababa…"``."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def clip_repr(value, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)``, clipped (:func:`clip`). ``clip_repr("ab" * 200, 6) == "'abab…"``."""
    return clip(repr(value), limit)


class InvalidParameter(ValueError):
    """A ``ValueError`` that names the request field at fault in ``param`` (``"seed"``,
    ``"n"`` …), so that a server can answer 400 with OpenAI's ``param`` set."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def stop_at(text: str, stops) -> int | None:
    """Where the completion ends: the index of the first occurrence of any of ``stops`` in
    ``text``, or None. ``stop_at("the set", ["e ", "t"]) == 0``."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def held_back(text: str, stops) -> int:
    """How many characters at the end of a running completion's ``text`` are not shown yet:
    the longest end of ``text`` that is the start of a stop string (the next tokens may complete
    it). ``held_back("the", ["e "]) == 1``; ``held_back("th", ["e "]) == 0``."""
    longest = 0
    for s in stops:                    # O(len(s)) compares, a slice only where the ends agree
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if s[k - 1] == text[-1] and text.endswith(s[:k]):
                longest = k
                break
    return longest


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request; bad values raise ``ValueError`` naming what is allowed.

    >>> SamplingParams(max_tokens=8).greedy
    True
    >>> SamplingParams(temperature=0.8, top_p=0.9, seed=1).greedy
    False
    """

    max_tokens: int | None = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | tuple[str, ...] | None = None
    ignore_eos: bool = False
    num_speculative_tokens: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    json_schema: dict | None = None

    def __post_init__(self):
        def positive_int(name, value):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameter(name, f"{name} must be an int >= 1, got {clip_repr(value)}")
        if self.max_tokens is not None:
            positive_int("max_tokens", self.max_tokens)
        positive_int("n", self.n)
        if self.top_k is not None:
            positive_int("top_k", self.top_k)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise InvalidParameter("temperature", f"temperature must be a finite number >= 0 "
                                                  f"(0 = greedy), got {clip_repr(t)}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise InvalidParameter("top_p", f"top_p must be a number in (0, 1], got "
                                            f"{clip_repr(p)}")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not 0 <= seed < SEED_MODULUS):
            raise InvalidParameter("seed", f"seed must be None or an int in [0, 2**64 - 1], got "
                                           f"{clip_repr(seed)}")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is not None:
            stop = tuple(stop)
            if not all(isinstance(s, str) and s for s in stop):
                raise InvalidParameter("stop", f"stop must be a non-empty string or a list of "
                                               f"them, got {clip_repr(self.stop)}")
        object.__setattr__(self, "stop", stop)
        g = self.num_speculative_tokens
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 0):
            raise InvalidParameter("num_speculative_tokens", f"num_speculative_tokens must be "
                                   f"None (the engine's setting) or an int >= 0 (0 = never "
                                   f"speculate), got {clip_repr(g)}")
        self._check_processors()
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise InvalidParameter("response_format", f"json_schema must be a dict (a JSON "
                                   f"schema), got {clip_repr(self.json_schema)}")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidParameter("ignore_eos", f"ignore_eos must be a bool, got "
                                                 f"{clip_repr(self.ignore_eos)}")

    def _check_processors(self) -> None:
        def number(name, lo, hi, lo_open=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < lo or v > hi or (lo_open and v == lo):
                side = "(" if lo_open else "["
                raise InvalidParameter(name, f"{name} must be a number in {side}{lo}, {hi}], got "
                                             f"{clip_repr(v)}")
        number("presence_penalty", -2.0, 2.0)
        number("frequency_penalty", -2.0, 2.0)
        number("repetition_penalty", 0.0, 100.0, lo_open=True)
        number("min_p", 0.0, 1.0)
        bias = self.logit_bias
        if bias is not None:
            if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
                raise InvalidParameter("logit_bias", f"logit_bias must be a dict of at most "
                                       f"{MAX_LOGIT_BIAS} token id -> bias, got {clip_repr(bias)}")
            for k, v in bias.items():
                if isinstance(k, bool) or not isinstance(k, int) or k < 0 or isinstance(v, bool) \
                        or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                    raise InvalidParameter("logit_bias", f"logit_bias maps token ids (ints >= 0) "
                                           f"to biases in [-100, 100], got {clip_repr(k)}: "
                                           f"{clip_repr(v)}")
        lp = self.logprobs
        if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int)
                               or not 0 <= lp <= MAX_LOGPROBS):
            raise InvalidParameter("logprobs", f"logprobs must be None or an int in [0, "
                                               f"{MAX_LOGPROBS}], got {clip_repr(lp)}")

    @property
    def has_processors(self) -> bool:
        """True when a logits processor (penalty, bias, min-p) changes the distribution."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0 or self.min_p)

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax: temperature 0, or below
        :data:`MIN_TEMPERATURE`."""
        return self.temperature < MIN_TEMPERATURE

    def seed_of(self, j: int) -> int | None:
        """The seed of completion ``j``: ``(seed + j) mod 2**64`` (None without a seed), so
        that ``seed = 2**64 - 1`` with ``n = 2`` still gives every completion a valid seed."""
        return None if self.seed is None else (self.seed + j) % SEED_MODULUS

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings as a tuple (empty when none)."""
        return self.stop or ()


def pair_with_params(prompts, sampling_params=None) -> list[tuple]:
    """``[(prompt, params), ...]`` for a batch call: ``prompts`` is one prompt (a str or a list
    of token ids) or a list of them; ``sampling_params`` one for all (or None) or one each
    (``ValueError`` when the counts differ). What ``LLMEngine.generate`` takes."""
    if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                    and all(isinstance(t, int) for t in prompts)):
        prompts = [prompts]
    prompts = list(prompts)
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        sampling_params = [sampling_params] * len(prompts)
    if len(sampling_params) != len(prompts):
        raise ValueError(f"{len(sampling_params)} sampling_params for {len(prompts)} prompts")
    return list(zip(prompts, sampling_params))


#: OpenAI's error code for a request longer than the context
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
#: the error code for a request whose worst case needs more KV blocks than the pool has
KV_CACHE_EXCEEDED = "kv_cache_exceeded"


class RequestTooLong(InvalidParameter):
    """An :class:`InvalidParameter` for a request that does not fit the context or the KV
    pool; ``code`` is :data:`CONTEXT_LENGTH_EXCEEDED` or :data:`KV_CACHE_EXCEEDED`."""

    def __init__(self, param: str, message: str, code: str):
        super().__init__(param, message)
        self.code = code


def max_tokens_for(n_prompt: int, max_tokens: int | None, context_len: int,
                   kv_pool: tuple[int, int] | None = None, prompt_param: str = "prompt") -> int:
    """The effective ``max_tokens`` of a request of ``n_prompt`` tokens under the rule of this
    module: ``max_tokens`` itself, or all the room left when it is None.

    ``context_len`` is C; ``kv_pool`` is ``(num_blocks, block_size)``, or None to leave the
    pool to whoever knows it (a server whose engine runs in another process). ``prompt_param``
    names the prompt's field in the error (a chat server's is ``"messages"``). The prompt is
    checked first: a prompt that leaves no room is refused naming it, whatever ``max_tokens``.

    >>> max_tokens_for(250, 6, 256), max_tokens_for(250, None, 256, kv_pool=(63, 4))
    (6, 2)
    """
    if n_prompt < 1:
        raise InvalidParameter(prompt_param, f"the {prompt_param} is empty; give at least "
                                             f"one token")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
            max_tokens, int) or max_tokens < 1):
        raise InvalidParameter("max_tokens", f"max_tokens must be None or an int >= 1, got "
                                             f"{clip_repr(max_tokens)}")
    context_room = _context_room(n_prompt, context_len, prompt_param)
    pool_room = context_room if kv_pool is None else _pool_room(n_prompt, *kv_pool, prompt_param)
    if max_tokens is None:
        return min(context_room, pool_room)
    if max_tokens > context_room:
        raise RequestTooLong(
            "max_tokens", f"this model's maximum context length is {context_len} tokens; "
                          f"{n_prompt} prompt tokens + max_tokens {max_tokens} = "
                          f"{n_prompt + max_tokens} exceed it: max_tokens may be at most "
                          f"{context_room}", CONTEXT_LENGTH_EXCEEDED)
    if max_tokens > pool_room:
        num_blocks, block_size = kv_pool
        worst = blocks_needed(n_prompt + max_tokens, block_size)
        raise RequestTooLong(
            "max_tokens", f"the request may need {worst} KV blocks (prompt {n_prompt} + "
                          f"max_tokens {max_tokens} tokens, {block_size} a block) but the pool "
                          f"has only {num_blocks}: max_tokens may be at most {pool_room}; lower "
                          f"max_tokens or add blocks", KV_CACHE_EXCEEDED)
    return max_tokens


def _context_room(n_prompt: int, context_len: int, prompt_param: str) -> int:
    """``C - n_prompt``, the tokens the context has left after the prompt; the prompt is
    refused if that is < 1."""
    if n_prompt >= context_len:
        raise RequestTooLong(
            prompt_param, f"{prompt_param}: {n_prompt} tokens, longer than the model's "
                          f"context allows: this model's maximum context length is "
                          f"{context_len} tokens, prompt and output together, so a prompt may "
                          f"have at most {context_len - 1}", CONTEXT_LENGTH_EXCEEDED)
    return context_len - n_prompt


def _pool_room(n_prompt: int, num_blocks: int, block_size: int, prompt_param: str) -> int:
    """``B * b - n_prompt``, the tokens the KV pool has left after the prompt; the prompt is
    refused if that is < 1."""
    pool_tokens = num_blocks * block_size
    if n_prompt >= pool_tokens:
        raise RequestTooLong(
            prompt_param, f"{prompt_param}: {n_prompt} tokens; with one output token it "
                          f"may need {blocks_needed(n_prompt + 1, block_size)} KV blocks of "
                          f"{block_size} tokens but the pool has only {num_blocks}: at most "
                          f"{pool_tokens - 1} prompt tokens fit; add blocks", KV_CACHE_EXCEEDED)
    return pool_tokens - n_prompt
