"""How long a request may be: one rule, checked by the engine and by the server alike.

A request of ``n_prompt`` prompt tokens asking for ``max_tokens`` new ones fits when::

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
:class:`~llminfra.engine.sampling_params.InvalidParameter` naming the field at fault
(``prompt`` or ``max_tokens``), the value and what is allowed; a refusal for the context or
the pool is a :class:`RequestTooLong`, whose ``code`` a server answers with. Taught in
chapter 05.
"""

from __future__ import annotations

from llminfra.engine.sampling_params import InvalidParameter, clip_repr
from llminfra.kvcache.block_table import blocks_needed

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
