"""Data-parallel replicas as real processes, and a router in this process that feeds them.

Each replica is an :class:`~llminfra.serving.engine_process.EngineProcess`: a whole engine
(model, scheduler, paged KV cache with prefix caching) in a process of its own, started with
``spawn``. The router runs an ``asyncio`` loop here: at each request's arrival time it asks the
policy (:mod:`llminfra.serving.router`) for a replica, sends the request there, and reads the
replica's outputs as they stream back::

    router (this process)                      replica processes
    ─────────────────────                      ─────────────────
    t = arrival ─▶ policy.route(request) = i ─▶ engine i: add_request … step … step
    first output back  → TTFT (router clock)   ◀─ RequestOutput per step (pipe)
    last output back   → policy.on_finish      ◀─ finished, with cached prompt tokens

TTFT here is what a client sees: from the scheduled arrival to the first token's output in the
router (queueing, the pipe both ways and prefill included). Every replica reports, per request,
how many prompt tokens it served from its prefix cache (``num_cached_prompt_tokens`` of the
engine's :class:`~llminfra.engine.metrics.RequestMetrics`), so the hit
rate is *measured* on the engines, not guessed by the router. Taught in chapter 11.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from llminfra.engine.metrics import percentile
from llminfra.engine.sampling_params import SamplingParams
from llminfra.serving.engine_process import EngineProcess
from llminfra.serving.router import POLICIES, RoutePolicy, make_policy
from llminfra.serving.router_workload import SharedPromptRequest, with_cache_salt
from llminfra.serving.serve import build_engine


def replica_engine(model: str = "tiny", *, num_threads: int = 1, **engine_options):
    """One replica's engine (runs in the replica process): ``build_engine(model, …)`` with
    prefix caching on and ``num_threads`` torch threads (each request's
    ``metrics.num_cached_prompt_tokens`` says what its cache served).
    ``engine_options``: ``num_blocks``, ``block_size``, ``max_num_seqs``, … Chapter 11."""
    return build_engine(model, num_threads=num_threads, enable_prefix_caching=True,
                        **engine_options)


class Replicas:
    """``num_replicas`` engine processes built by ``factory`` (picklable; default
    ``replica_engine`` on the tiny model). ``start()`` spawns them all at once and waits until
    every engine is built; ``stop()`` ends them; also a context manager. Chapter 11."""

    def __init__(self, num_replicas: int, factory: Callable | None = None, *,
                 start_timeout_s: float = 180.0):
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) \
                or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        factory = partial(replica_engine, "tiny") if factory is None else factory
        self.loops = [EngineProcess(factory, idle_wait_s=0.01, start_timeout_s=start_timeout_s)
                      for _ in range(num_replicas)]

    def start(self) -> "Replicas":
        """Spawn every replica in parallel; returns once all are ready (stops all on error)."""
        with concurrent.futures.ThreadPoolExecutor(len(self.loops)) as pool:
            futures = [pool.submit(loop.start) for loop in self.loops]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            self.stop()
            raise errors[0]
        return self

    def stop(self) -> None:
        """Stop every replica process."""
        for loop in self.loops:
            loop.stop()

    def __enter__(self) -> "Replicas":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __len__(self) -> int:
        return len(self.loops)


@dataclass(frozen=True)
class RoutedResult:
    """One request's outcome: replica, prompt and cached prompt tokens, output token ids,
    finish reason, and times in seconds from the run's start (TTFT and end-to-end on the
    router's clock, ``engine_ttft_s`` on the replica's). Chapter 11."""

    request_id: str
    replica: int
    system_prompt: int
    prompt_tokens: int
    cached_prompt_tokens: int
    output_token_ids: tuple[int, ...]
    finish_reason: str | None
    arrival_s: float
    ttft_s: float
    e2e_s: float
    engine_ttft_s: float | None


async def _serve_one(loop: EngineProcess, replica: int, policy: RoutePolicy,
                     req: SharedPromptRequest, params: SamplingParams, t0: float) -> RoutedResult:
    route = req.route_request()
    arrival = t0 + req.arrival_time_s
    first = last = None
    try:
        stream = await loop.generate(list(req.prompt_token_ids), params, req.request_id)
        async for out in stream:
            if first is None and out.outputs and out.outputs[0].token_ids:
                first = time.perf_counter()
            last = out
    finally:
        policy.on_finish(route, replica)
    done = time.perf_counter()
    m = last.metrics
    return RoutedResult(req.request_id, replica, req.system_prompt, len(req.prompt_token_ids),
                        int(m.num_cached_prompt_tokens),
                        tuple(last.outputs[0].token_ids), last.outputs[0].finish_reason,
                        req.arrival_time_s, (first or done) - arrival, done - arrival, m.ttft_s)


async def _dispatch(loops: Sequence[EngineProcess], policy: RoutePolicy,
                    workload: Sequence[SharedPromptRequest], temperature: float) -> list:
    t0 = time.perf_counter()
    tasks = []
    for req in sorted(workload, key=lambda r: r.arrival_time_s):
        delay = t0 + req.arrival_time_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        replica = policy.route(req.route_request())
        params = SamplingParams(max_tokens=req.max_tokens, temperature=temperature,
                                ignore_eos=True, seed=0)
        tasks.append(asyncio.create_task(
            _serve_one(loops[replica], replica, policy, req, params, t0)))
    return list(await asyncio.gather(*tasks))


def run_policy(replicas: Replicas, policy: RoutePolicy, workload: Sequence[SharedPromptRequest],
               *, temperature: float = 0.0) -> list[RoutedResult]:
    """Serve ``workload`` on ``replicas`` (started) through ``policy``; one
    :class:`RoutedResult` per request, in dispatch order. Greedy by default, ``ignore_eos`` so
    every request makes exactly ``max_tokens`` tokens. The event loop runs in a thread of its
    own, so a notebook (which already runs one) can call it too. Chapter 11."""
    if policy.num_replicas != len(replicas):
        raise ValueError(f"the policy routes over {policy.num_replicas} replicas but "
                         f"{len(replicas)} are running")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _dispatch(replicas.loops, policy, workload,
                                                  temperature)).result()


def summarize_routing(results: Sequence[RoutedResult], num_replicas: int) -> dict:
    """Hit rate = cached prompt tokens / prompt tokens; TTFT p50 / p90 (s, router clock);
    throughput = output tokens / (last finish − first arrival); per replica the requests,
    prompt tokens and prompt tokens computed (not cached); ``load_imbalance`` = max / mean
    requests per replica (1.0 is even). Chapter 11."""
    if not results:
        raise ValueError("no results to summarise")
    prompt = sum(r.prompt_tokens for r in results)
    cached = sum(r.cached_prompt_tokens for r in results)
    ttft = [r.ttft_s for r in results]
    duration = max(r.arrival_s + r.e2e_s for r in results) - min(r.arrival_s for r in results)
    out_tokens = sum(len(r.output_token_ids) for r in results)
    per = [[r for r in results if r.replica == i] for i in range(num_replicas)]
    counts = [len(p) for p in per]
    return {
        "num_requests": len(results), "prompt_tokens": prompt, "cached_prompt_tokens": cached,
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
        "duration_s": duration, "output_tokens": out_tokens,
        "throughput_tokens_per_s": out_tokens / duration if duration > 0 else float("inf"),
        "requests_per_replica": counts,
        "prompt_tokens_per_replica": [sum(r.prompt_tokens for r in p) for p in per],
        "computed_prompt_tokens_per_replica": [sum(r.prompt_tokens - r.cached_prompt_tokens
                                                   for r in p) for p in per],
        "load_imbalance": max(counts) / (sum(counts) / num_replicas),
    }


def compare_policies(replicas: Replicas, workload: Sequence[SharedPromptRequest], *,
                     policies: Sequence[str] = tuple(POLICIES), block_size: int = 16,
                     max_blocks_per_replica: int = 4096, repeats: int = 1) -> dict:
    """Run ``workload`` under each policy on the same started ``replicas``, ``repeats`` times
    (the order reversed on every other round, so no policy always goes first); ``{name:
    summary}``: :func:`summarize_routing` of the policy's requests pooled over its runs, with
    ``duration_s`` the sum of its runs' and ``throughput_tokens_per_s`` over that sum, plus
    ``"results"`` (the per-request dicts). The j-th run puts salt token ``j`` in front of every
    prompt (:func:`with_cache_salt`; for one round, run ``k`` is policy ``k``), so no run
    inherits another's cached blocks; first the replicas warm up on the workload's first 4
    requests each (all at once, their own salt). ``block_size`` must be the replicas' KV block
    size (the prefix-aware policy hashes with it). Chapter 11.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    n = len(replicas)
    warm = [dataclasses.replace(r, arrival_time_s=0.0)
            for r in with_cache_salt(workload[:4 * n], repeats * len(policies))]
    run_policy(replicas, make_policy("round_robin", n), warm)
    pooled: dict[str, list[RoutedResult]] = {name: [] for name in policies}
    durations: dict[str, float] = {name: 0.0 for name in policies}
    salt = 0
    for rep in range(repeats):
        for name in (policies if rep % 2 == 0 else tuple(reversed(policies))):
            options = ({"block_size": block_size, "max_blocks_per_replica":
                        max_blocks_per_replica} if name == "prefix_aware" else {})
            results = run_policy(replicas, make_policy(name, n, **options),
                                 with_cache_salt(workload, salt))
            salt += 1
            pooled[name] += results
            durations[name] += summarize_routing(results, n)["duration_s"]
    out = {}
    for name, results in pooled.items():
        summary = summarize_routing(results, n)
        summary["duration_s"] = durations[name]
        summary["throughput_tokens_per_s"] = summary["output_tokens"] / durations[name]
        out[name] = {**summary, "runs": repeats, "results": as_dict(results)}
    return out


def as_dict(results: Sequence[RoutedResult]) -> list[dict]:
    """The results as plain dicts (JSON-ready)."""
    return [dataclasses.asdict(r) for r in results]


__all__ = ["Replicas", "RoutedResult", "as_dict",
           "compare_policies", "replica_engine", "run_policy", "summarize_routing"]
