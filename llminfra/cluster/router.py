"""Routing requests over N data-parallel replicas: round robin, least loaded, prefix-cache aware.

Data parallelism for serving: N copies of the whole engine (each with its own weights and KV
cache), and a router in front that picks one replica per request. Which one matters because
each replica's prefix cache (:mod:`llminfra.kvcache.prefix_cache`) only helps requests that
land where their prefix was computed::

        requests ──▶ router.choose(request) ──▶ replica 0  (engine, own KV cache)
                                           ├──▶ replica 1
                                           └──▶ replica N-1

Three policies, all with one API — ``choose(request) -> replica index``, then
``on_dispatch(request, i)`` when it is sent and ``on_finish(request, i)`` when it ends (the
router's own count of outstanding requests and tokens per replica, no query to the replicas):

* :class:`RoundRobin` — replica ``k mod N`` for the k-th request: even counts, blind to load
  and to caches (every replica ends up computing every shared prefix once).
* :class:`LeastLoaded` — the replica with the fewest outstanding requests, then the fewest
  outstanding tokens (prompt + max_tokens), then the fewest dispatched so far, then the lowest
  index (so idle replicas take turns instead of replica 0 taking every request).
* :class:`PrefixAware` — hash the prompt's leading *full* blocks exactly as the engine's prefix
  cache does (:func:`~llminfra.kvcache.prefix_cache.prefix_block_hashes`, same block size), look
  them up in a bounded LRU index of the hashes sent to each replica, and route to the longest
  match. This is the "approximate" prefix-cache routing of llm-d (prompt split into fixed-size
  blocks, rolling hash chain, an in-memory LRU index of which hashes went to which pod; llm-d
  docs, "Prefix-Cache Aware Routing", https://llm-d.ai/docs/architecture/advanced/kv-management/
  prefix-cache-aware-routing, read 2026-12-03) with the decision rule of SGLang's
  ``cache_aware`` router (sglang-router, https://pypi.org/project/sglang-router/; its
  successor's docs, SGLang Model Gateway, github.com/lightseekorg/smg
  docs/getting-started/load-balancing.md, which give the defaults; read 2026-12-03): if the load is *imbalanced* — busiest − idlest outstanding
  requests > ``balance_abs_threshold`` **and** busiest > ``balance_rel_threshold`` × idlest —
  route to the least loaded; else if the best match covers ≥ ``cache_threshold`` of the prompt,
  route to the longest match (ties: least loaded); else to the least loaded replica, ties to
  the one whose index holds the fewest blocks (SGLang: "the smallest tree"), so distinct new
  prefixes spread out. SGLang's defaults are 0.3, 64 requests and 1.5; 64 fits a large GPU
  fleet, so this module's default absolute threshold is 8 (a few CPU replicas).

The index is the router's *guess* of each cache: it never hears of evictions inside a replica,
so a long-idle prefix may be routed to a replica that no longer holds it (llm-d's "precise"
variant and NVIDIA Dynamo listen to the engines' KV events instead). vLLM's production stack
weighs the two with one score instead of thresholds, ``matched / prompt − β · relative load``
(docs.vllm.ai/projects/production-stack, "Load Aware Routing", read 2026-12-03).
Taught in chapter 11.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from llminfra.kvcache.prefix_cache import prefix_block_hashes


@dataclass(frozen=True)
class RouteRequest:
    """What a policy sees of a request: its id, prompt token ids and ``max_tokens``."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int = 16

    @property
    def num_tokens(self) -> int:
        """Worst-case tokens it adds to a replica: prompt + max_tokens."""
        return len(self.prompt_token_ids) + self.max_tokens


class RoutePolicy:
    """Base class: N replicas and the router's count of each one's outstanding work.

    ``outstanding_requests[i]`` / ``outstanding_tokens[i]`` rise in :meth:`on_dispatch` and fall
    in :meth:`on_finish`; ``dispatched[i]`` counts every request ever sent to ``i``. A replica
    whose engine died or stalled is taken out of rotation (:meth:`mark_down`): a dead replica
    fails its requests at once, so by load alone it would look idle and draw more.
    Subclasses implement :meth:`choose`. Taught in chapter 11.
    """

    name = "base"

    def __init__(self, num_replicas: int):
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) \
                or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        self.num_replicas = num_replicas
        self.outstanding_requests = [0] * num_replicas
        self.outstanding_tokens = [0] * num_replicas
        self.dispatched = [0] * num_replicas
        #: replica -> why it is out of rotation (a dead or stalled engine); never chosen
        self.down: dict[int, str] = {}

    def choose(self, request: RouteRequest) -> int:
        """The replica index (0 … N-1) to send ``request`` to."""
        raise NotImplementedError

    def on_dispatch(self, request: RouteRequest, replica: int) -> None:
        """``request`` was sent to ``replica``: count it as outstanding there."""
        self._check_replica(replica)
        self.outstanding_requests[replica] += 1
        self.outstanding_tokens[replica] += request.num_tokens
        self.dispatched[replica] += 1

    def on_finish(self, request: RouteRequest, replica: int) -> None:
        """``request`` ended on ``replica`` (finished, failed or aborted)."""
        self._check_replica(replica)
        if self.outstanding_requests[replica] <= 0:
            raise ValueError(f"replica {replica} has no outstanding request to finish")
        self.outstanding_requests[replica] -= 1
        self.outstanding_tokens[replica] -= request.num_tokens

    def mark_down(self, replica: int, reason: str) -> None:
        """Take ``replica`` out of rotation (its engine died or stopped answering): no policy
        chooses it again until :meth:`mark_up`. The first reason is kept."""
        self._check_replica(replica)
        self.down.setdefault(replica, str(reason))

    def mark_up(self, replica: int) -> None:
        """Put ``replica`` back in rotation."""
        self._check_replica(replica)
        self.down.pop(replica, None)

    def up_replicas(self) -> list[int]:
        """The replicas in rotation, in index order."""
        return [i for i in range(self.num_replicas) if i not in self.down]

    def route(self, request: RouteRequest) -> int:
        """``choose`` then ``on_dispatch``: the index the request is sent to.
        :class:`NoReplicaAvailable` when every replica is out of rotation."""
        if not self.up_replicas():
            raise NoReplicaAvailable("no replica is in rotation: " + "; ".join(
                f"replica {i}: {why}" for i, why in sorted(self.down.items())))
        replica = self.choose(request)
        if replica in self.down:          # a policy that ignores health is a bug, said so
            raise RuntimeError(f"{type(self).__name__} chose replica {replica}, which is out "
                               f"of rotation ({self.down[replica]})")
        self.on_dispatch(request, replica)
        return replica

    def least_loaded(self, candidates: Sequence[int] | None = None) -> int:
        """Among ``candidates`` (default: every replica in rotation): fewest outstanding
        requests, then tokens, then fewest dispatched so far (idle replicas take turns), then
        the lowest index."""
        pool = self.up_replicas() if candidates is None else candidates
        return min(pool, key=lambda i: (self.outstanding_requests[i],
                                        self.outstanding_tokens[i], self.dispatched[i], i))

    def _check_replica(self, replica: int) -> None:
        if isinstance(replica, bool) or not isinstance(replica, int) \
                or not 0 <= replica < self.num_replicas:
            raise ValueError(f"replica must be an int in [0, {self.num_replicas}), "
                             f"got {replica!r}")


class RoundRobin(RoutePolicy):
    """Replica ``k mod N`` for the k-th call of :meth:`choose`. Taught in chapter 11."""

    name = "round_robin"

    def __init__(self, num_replicas: int):
        super().__init__(num_replicas)
        self._next = 0

    def choose(self, request: RouteRequest) -> int:
        """The next replica in turn (skipping those out of rotation)."""
        for _ in range(self.num_replicas):
            replica = self._next
            self._next = (self._next + 1) % self.num_replicas
            if replica not in self.down:
                return replica
        raise NoReplicaAvailable("no replica is in rotation")


class LeastLoaded(RoutePolicy):
    """The replica with the fewest outstanding requests (then tokens, then fewest dispatched,
    then lowest index). Taught in chapter 11."""

    name = "least_loaded"

    def choose(self, request: RouteRequest) -> int:
        """:meth:`RoutePolicy.least_loaded` over all replicas."""
        return self.least_loaded()


class PrefixAware(RoutePolicy):
    """Route to the replica whose (guessed) prefix cache holds the longest leading run of the
    prompt's full-block hashes, guarded by load (SGLang ``cache_aware`` rule, module docstring).

    ``block_size``: the engines' KV block size in tokens (the hashes must be the engine's);
    ``max_blocks_per_replica``: LRU capacity of each replica's index, in blocks (set it near the
    engine's ``num_blocks`` so the guess forgets about as fast as the cache does).
    ``last_match_blocks`` / ``last_reason`` tell why the last :meth:`choose` chose.
    Taught in chapter 11.
    """

    name = "prefix_aware"

    def __init__(self, num_replicas: int, *, block_size: int = 16,
                 max_blocks_per_replica: int = 4096, cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 8, balance_rel_threshold: float = 1.5):
        super().__init__(num_replicas)
        for label, value in (("block_size", block_size),
                             ("max_blocks_per_replica", max_blocks_per_replica)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be an int >= 1, got {value!r}")
        if not 0 <= cache_threshold <= 1:
            raise ValueError(f"cache_threshold must lie in [0, 1], got {cache_threshold!r}")
        if not balance_abs_threshold >= 0 or not balance_rel_threshold >= 1:
            raise ValueError(f"balance_abs_threshold must be >= 0 and balance_rel_threshold "
                             f">= 1, got {balance_abs_threshold!r}, {balance_rel_threshold!r}")
        self.block_size, self.max_blocks_per_replica = block_size, max_blocks_per_replica
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self._index: list[OrderedDict[str, None]] = [OrderedDict() for _ in range(num_replicas)]
        self.last_match_blocks: list[int] = [0] * num_replicas
        self.last_reason = ""

    def match_blocks(self, hashes: Sequence[str], replica: int) -> int:
        """Leading blocks of ``hashes`` that ``replica``'s index holds (the run stops at the
        first miss, as the engine's ``match_prefix`` does)."""
        index, n = self._index[replica], 0
        for h in hashes:
            if h not in index:
                break
            n += 1
        return n

    def is_imbalanced(self) -> bool:
        """SGLang's rule: max − min > abs threshold and max > rel threshold × min
        (outstanding requests)."""
        load = [self.outstanding_requests[i] for i in self.up_replicas()] or [0]
        hi, lo = max(load), min(load)
        return hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo

    def choose(self, request: RouteRequest) -> int:
        """Least loaded if imbalanced; else the longest match if it covers ≥ cache_threshold
        of the prompt (ties: least loaded); else least loaded, ties to the replica whose index
        holds the fewest blocks."""
        hashes = prefix_block_hashes(list(request.prompt_token_ids), self.block_size)
        self.last_match_blocks = [self.match_blocks(hashes, i) for i in range(self.num_replicas)]
        up = self.up_replicas()
        if self.is_imbalanced():
            self.last_reason = "imbalanced"
            return self.least_loaded()
        best = max(self.last_match_blocks[i] for i in up)
        prompt_len = max(1, len(request.prompt_token_ids))
        if best > 0 and best * self.block_size / prompt_len >= self.cache_threshold:
            self.last_reason = "prefix"
            return self.least_loaded([i for i in up if self.last_match_blocks[i] == best])
        self.last_reason = "no_match"
        return min(up, key=lambda i: (
            self.outstanding_requests[i], len(self._index[i]), self.outstanding_tokens[i], i))

    def on_dispatch(self, request: RouteRequest, replica: int) -> None:
        """Count the load, and record the prompt's block hashes as now cached at ``replica``
        (most recent last; the oldest beyond ``max_blocks_per_replica`` are forgotten)."""
        super().on_dispatch(request, replica)
        index = self._index[replica]
        for h in prefix_block_hashes(list(request.prompt_token_ids), self.block_size):
            index[h] = None
            index.move_to_end(h)
        while len(index) > self.max_blocks_per_replica:
            index.popitem(last=False)

    def indexed_blocks(self) -> list[int]:
        """Blocks each replica's index holds."""
        return [len(ix) for ix in self._index]


class NoReplicaAvailable(RuntimeError):
    """Every replica is out of rotation (:meth:`RoutePolicy.mark_down`)."""


#: policy name -> class
POLICIES: dict[str, type[RoutePolicy]] = {
    RoundRobin.name: RoundRobin, LeastLoaded.name: LeastLoaded, PrefixAware.name: PrefixAware}


def make_policy(name: str, num_replicas: int, **options) -> RoutePolicy:
    """A fresh policy by name (``"round_robin"``, ``"least_loaded"``, ``"prefix_aware"``);
    ``options`` go to its constructor (``block_size=…`` etc. for prefix_aware). ValueError
    names the allowed policies. Taught in chapter 11."""
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; allowed: {sorted(POLICIES)}")
    return POLICIES[name](num_replicas, **options)


__all__ = ["POLICIES", "LeastLoaded", "NoReplicaAvailable", "PrefixAware", "RoundRobin",
           "RoutePolicy", "RouteRequest", "make_policy"]
