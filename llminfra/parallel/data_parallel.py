"""Data parallelism for serving: whole-model replicas, each answering its share of the requests.

No communication between replicas at all: replica ``r`` of ``n`` serves requests
``r, r + n, r + 2n, …`` (round robin) with its own full copy of the weights. Throughput grows
with ``n`` as long as each replica is as fast as one alone; memory grows with ``n`` too, since
every replica holds all the weights — the opposite trade of tensor parallelism, which splits the
weights and pays with an all-reduce per layer. (Replicas of a model that fits on one GPU are the
usual first step of scaling a service; tensor and pipeline parallelism are for models that do not
fit.) Taught in chapter 07.
"""

from __future__ import annotations

import logging
import time

from llminfra.parallel.world import World, check_rank
from llminfra.model.config import ModelConfig
from llminfra.model.transformer import Transformer
from llminfra.model.cache import DenseKVCache
from llminfra.model.checkpoint import load_tiny
from llminfra.model.generate import generate

log = logging.getLogger(__name__)


def split_requests(n_requests: int, n_replicas: int) -> list[list[int]]:
    """Round-robin assignment: replica ``r`` gets request ids ``r, r + n, …``.

    ``split_requests(5, 2) -> [[0, 2, 4], [1, 3]]``.
    """
    check_rank(0, n_replicas)
    if n_requests < 0:
        raise ValueError(f"n_requests must be >= 0, got {n_requests!r}")
    return [list(range(r, n_requests, n_replicas)) for r in range(n_replicas)]


def merge_results(per_replica: list[dict[int, object]], n_requests: int) -> list:
    """Put the replicas' ``{request id: answer}`` dicts back in request order."""
    merged = {}
    for part in per_replica:
        merged.update(part)
    missing = sorted(set(range(n_requests)) - set(merged))
    if missing:
        raise ValueError(f"no answer for requests {missing}")
    return [merged[i] for i in range(n_requests)]


def tiny_model(trained: bool = True):
    """The trained tiny model (:func:`llminfra.model.load_tiny`) when ``trained`` and shipped,
    else ``Transformer(ModelConfig.from_name("tiny"))`` with its seed-0 random weights."""
    if trained:
        try:
            return load_tiny()[0].eval()
        except (ImportError, FileNotFoundError) as e:
            log.warning("no trained tiny model (%s): using seed-0 random weights", e)
    return Transformer(ModelConfig.from_name("tiny")).eval()


def replica_serve(world: World, prompts: list[list[int]], max_new_tokens: int,
                  trained: bool = True) -> dict:
    """This replica's share: greedy generation (KV cache) for its requests with its own full
    tiny model. Returns ``{"answers": {request id: tokens}, "busy_s": wall time, "tokens": n}``."""
    model = tiny_model(trained)
    mine = split_requests(len(prompts), world.size)[world.rank]
    t0 = time.perf_counter()
    answers = {i: generate(model, prompts[i], max_new_tokens,
                           cache=DenseKVCache(model.config.n_layers)) for i in mine}
    return {"answers": answers, "busy_s": time.perf_counter() - t0,
            "tokens": sum(len(a) for a in answers.values())}


def serving_throughput(results: list[dict]) -> dict:
    """Tokens per second of the replicas together: all new tokens / the slowest replica's time
    (they run at the same time). Also per-replica rates."""
    tokens = sum(r["tokens"] for r in results)
    wall = max(r["busy_s"] for r in results)
    return {"replicas": len(results), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else float("inf"),
            "per_replica_tokens_per_s": [r["tokens"] / r["busy_s"] if r["busy_s"] > 0
                                         else float("inf") for r in results]}
