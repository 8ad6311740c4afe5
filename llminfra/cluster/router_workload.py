"""A shared-system-prompt workload: a few system prompts, each shared by many users' short turns.

The case prefix-cache-aware routing is for: a chat service whose requests each begin with one of
a handful of long system prompts (or few-shot templates) and end with a short user turn::

    prompt = [salt] + system_prompt[s] + user_turn        s ~ uniform over the system prompts

Token ids are drawn uniformly from ``token_range`` (default 32 … 126: printable bytes in the
tiny byte model, ordinary tokens — no special ones — in SmolLM2's vocabulary), so the prompts
mean nothing and the same workload drives either model. Arrivals are a Poisson process
(:func:`llminfra.sim.workload.poisson_arrivals`). The optional ``cache_salt`` token goes in
front of every prompt: two runs with different salts share no cached block (each block's hash
covers the whole prefix before it), so one set of warm replicas can serve several runs of the
same workload without one run's cache helping the next — vLLM's per-request ``cache_salt``
does the same for tenants (vLLM docs, "Automatic Prefix Caching",
https://docs.vllm.ai/en/latest/design/prefix_caching/, read 2026-12-03). Taught in chapter 11.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llminfra.cluster.router import RouteRequest
from llminfra.kvcache.prefix_cache import prefix_block_hashes
from llminfra.sim.workload import poisson_arrivals
from llminfra.validate import positive_int


@dataclass(frozen=True)
class SharedPromptRequest:
    """One request: id, arrival (s from the start), prompt token ids, ``max_tokens`` and the
    index of the system prompt it starts with."""

    request_id: str
    arrival_time_s: float
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    system_prompt: int

    def route_request(self) -> RouteRequest:
        """What a routing policy sees of it."""
        return RouteRequest(self.request_id, self.prompt_token_ids, self.max_tokens)


def _random_tokens(n: int, token_range: tuple[int, int], g: torch.Generator) -> list[int]:
    return torch.randint(token_range[0], token_range[1], (n,), generator=g).tolist()


def shared_prompt_workload(num_requests: int, generator: torch.Generator, *,
                           num_system_prompts: int = 4, system_prompt_tokens: int = 96,
                           user_tokens: tuple[int, int] = (8, 24), max_tokens: int = 16,
                           rate_per_s: float = math.inf, token_range: tuple[int, int] = (32, 127),
                           cache_salt: int | None = None) -> list[SharedPromptRequest]:
    """``num_requests`` requests: system prompt ``s`` uniform over ``num_system_prompts`` (each
    ``system_prompt_tokens`` long), then a user turn of uniform length in ``user_tokens``
    (inclusive), arriving as a Poisson process of ``rate_per_s`` (``math.inf``: all at t = 0).
    ``cache_salt``: a token id put first in every prompt (None: none). Seeded by ``generator``.
    """
    for name, value in (("num_requests", num_requests), ("num_system_prompts", num_system_prompts),
                        ("system_prompt_tokens", system_prompt_tokens), ("max_tokens", max_tokens)):
        positive_int(name, value)
    lo, hi = user_tokens
    if not 1 <= lo <= hi:
        raise ValueError(f"user_tokens must be (lo, hi) with 1 <= lo <= hi, got {user_tokens!r}")
    if not 0 <= token_range[0] < token_range[1]:
        raise ValueError(f"token_range must be (low, high) with 0 <= low < high, "
                         f"got {token_range!r}")
    salt = [] if cache_salt is None else [int(cache_salt)]
    systems = [_random_tokens(system_prompt_tokens, token_range, generator)
               for _ in range(num_system_prompts)]
    which = torch.randint(0, num_system_prompts, (num_requests,), generator=generator).tolist()
    lengths = torch.randint(lo, hi + 1, (num_requests,), generator=generator).tolist()
    times = poisson_arrivals(num_requests, rate_per_s, generator)
    return [SharedPromptRequest(f"r{k}", float(t), tuple(salt + systems[s] + _random_tokens(
                n, token_range, generator)), max_tokens, s)
            for k, (t, s, n) in enumerate(zip(times, which, lengths))]


def with_cache_salt(workload: list[SharedPromptRequest], salt: int) -> list[SharedPromptRequest]:
    """The same requests with token ``salt`` put first in every prompt (ids get a suffix), so
    no block is shared with an unsalted or differently salted run."""
    return [SharedPromptRequest(f"{r.request_id}-s{salt}", r.arrival_time_s,
                                (int(salt),) + r.prompt_token_ids, r.max_tokens, r.system_prompt)
            for r in workload]


def prefix_hit_rate_ceiling(workload: list[SharedPromptRequest], block_size: int) -> float:
    """The prefix-cache hit rate no router can beat on ``workload``: in arrival order, each
    request is served from cache for the whole blocks of its prompt that an earlier request's
    prompt began with (as if every block stayed cached on every replica; at least one prompt
    token is always computed); cached tokens over all prompt tokens. On the shared-system-prompt
    workload this is each prompt's first request missing and every later one hitting its system
    prompt's whole blocks.

    >>> w = [SharedPromptRequest(f"r{i}", i, (1,) * 32 + (i,) * 4, 1, 0) for i in range(3)]
    >>> round(prefix_hit_rate_ceiling(w, 16), 4)    # 0, 32 and 32 of 36 tokens each
    0.5926
    """
    positive_int("block_size", block_size)
    seen: set[str] = set()                  # the prefix cache's block hashes, every replica's
    cached = total = 0
    for r in sorted(workload, key=lambda r: r.arrival_time_s):
        hashes = prefix_block_hashes(list(r.prompt_token_ids), block_size)
        usable = (len(r.prompt_token_ids) - 1) // block_size   # one token is always computed
        k = 0
        while k < usable and hashes[k] in seen:
            k += 1
        cached += k * block_size
        total += len(r.prompt_token_ids)
        seen.update(hashes)
    return cached / total if total else 0.0


__all__ = ["SharedPromptRequest", "prefix_hit_rate_ceiling", "shared_prompt_workload",
           "with_cache_salt"]
