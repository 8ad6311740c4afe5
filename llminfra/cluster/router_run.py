"""Data-parallel replicas as real processes, and a router in this process that feeds them.

Each replica is an :class:`~llminfra.serving.engine_process.EngineProcess`: a whole engine
(model, scheduler, paged KV cache with prefix caching) in a process of its own, started with
``spawn``. The router runs an ``asyncio`` loop here: at each request's arrival time it asks the
policy (:mod:`llminfra.cluster.router`) for a replica, sends the request there, and reads the
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

from llminfra.cluster.router import POLICIES, NoReplicaAvailable, RoutePolicy, make_policy
from llminfra.cluster.router_workload import SharedPromptRequest, with_cache_salt
from llminfra.engine.metrics import percentile
from llminfra.engine.sampling_params import SamplingParams
from llminfra.serving.engine_core import EngineDeadError
from llminfra.serving.engine_process import EngineProcess
from llminfra.serving.serve import build_engine
from llminfra.validate import positive_finite


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
    router's clock, ``engine_ttft_s`` on the replica's). A request that could not be answered
    (its replica died or stalled, no answer within the deadline, no replica in rotation) has
    ``finish_reason == "error"``, no output tokens and ``error``, the reason; ``replica`` is -1
    when none was chosen. Chapter 11."""

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
    error: str | None = None


#: a replica whose engine has made no progress for this long (seconds) is out of rotation and
#: its requests fail (an idle engine process says it is alive every
#: :data:`~llminfra.serving.engine_process.HEARTBEAT_S`)
STALL_TIMEOUT_S = 10.0
#: how often the router checks its replicas (seconds)
HEALTH_CHECK_S = 0.25


def _failed(req: SharedPromptRequest, replica: int, t_end: float, t0: float,
            reason: str) -> RoutedResult:
    waited = t_end - (t0 + req.arrival_time_s)
    return RoutedResult(req.request_id, replica, req.system_prompt, len(req.prompt_token_ids),
                        0, (), "error", req.arrival_time_s, waited, waited, None, reason)


async def _serve_one(loop: EngineProcess, replica: int, policy: RoutePolicy,
                     req: SharedPromptRequest, params: SamplingParams, t0: float,
                     deadline_s: float | None, down: asyncio.Event) -> RoutedResult:
    """Send one request and read its outputs until it finishes, its replica is taken out of
    rotation (``down``), or ``deadline_s`` passes; always a result, never an exception."""
    route = req.route_request()
    arrival = t0 + req.arrival_time_s
    seen: dict = {"first": None, "last": None}

    async def consume():
        stream = await loop.generate(list(req.prompt_token_ids), params, req.request_id)
        async for out in stream:
            if seen["first"] is None and out.outputs and out.outputs[0].token_ids:
                seen["first"] = time.perf_counter()
            seen["last"] = out

    run = asyncio.ensure_future(consume())
    gone = asyncio.ensure_future(down.wait())
    error = None
    try:
        done, _ = await asyncio.wait({run, gone}, timeout=deadline_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if run in done:
            exc = run.exception()
            if isinstance(exc, EngineDeadError):
                policy.mark_down(replica, f"its engine is gone ({exc})")
                error = f"replica {replica} died: {exc}"
            elif exc is not None:
                error = f"replica {replica} refused it: {type(exc).__name__}: {exc}"
            elif seen["last"] is None or getattr(seen["last"], "error", None):
                error = f"replica {replica} failed it: {getattr(seen['last'], 'error', None)}"
        elif gone in done:
            error = f"replica {replica} was taken out of rotation: {policy.down.get(replica)}"
        else:
            error = f"no answer from replica {replica} within {deadline_s:g} s"
    finally:
        for task in (run, gone):
            task.cancel()
        await asyncio.gather(run, gone, return_exceptions=True)   # aborts an unfinished one
        policy.on_finish(route, replica)
    done_t = time.perf_counter()
    if error is not None:
        return _failed(req, replica, done_t, t0, error)
    last, first = seen["last"], seen["first"]
    m = last.metrics
    return RoutedResult(req.request_id, replica, req.system_prompt, len(req.prompt_token_ids),
                        int(m.num_cached_prompt_tokens),
                        tuple(last.outputs[0].token_ids), last.outputs[0].finish_reason,
                        req.arrival_time_s, (first or done_t) - arrival, done_t - arrival,
                        m.ttft_s)


async def _watch(loops: Sequence[EngineProcess], policy: RoutePolicy,
                 down: Sequence[asyncio.Event], stall_timeout_s: float) -> None:
    """The health check: a replica whose engine loop is not running, or has made no progress
    for ``stall_timeout_s`` (a stopped process), is taken out of rotation and its requests
    are failed (their ``down`` event is set)."""
    while True:
        for i, loop in enumerate(loops):
            if i in policy.down:
                continue
            if not loop.is_running:
                policy.mark_down(i, "its engine loop is not running")
            elif loop.seconds_since_progress > stall_timeout_s:
                policy.mark_down(i, f"its engine made no progress for "
                                    f"{loop.seconds_since_progress:.1f} s")
        for i in policy.down:
            down[i].set()
        await asyncio.sleep(HEALTH_CHECK_S)


async def _dispatch(loops: Sequence[EngineProcess], policy: RoutePolicy,
                    workload: Sequence[SharedPromptRequest], temperature: float,
                    deadline_s: float | None, stall_timeout_s: float) -> list:
    t0 = time.perf_counter()
    down = [asyncio.Event() for _ in loops]
    watch = asyncio.ensure_future(_watch(loops, policy, down, stall_timeout_s))
    tasks = []
    try:
        for req in sorted(workload, key=lambda r: r.arrival_time_s):
            delay = t0 + req.arrival_time_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                replica = policy.route(req.route_request())
            except NoReplicaAvailable as e:
                tasks.append(_failed(req, -1, time.perf_counter(), t0, str(e)))
                continue
            params = SamplingParams(max_tokens=req.max_tokens, temperature=temperature,
                                    ignore_eos=True, seed=0)
            tasks.append(asyncio.ensure_future(_serve_one(
                loops[replica], replica, policy, req, params, t0, deadline_s, down[replica])))
        pending = [t for t in tasks if isinstance(t, asyncio.Future)]
        outcomes = iter(await asyncio.gather(*pending, return_exceptions=True))
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    results = []
    for req, t in zip(sorted(workload, key=lambda r: r.arrival_time_s), tasks):
        if isinstance(t, RoutedResult):
            results.append(t)
            continue
        out = next(outcomes)
        results.append(out if isinstance(out, RoutedResult) else _failed(
            req, -1, time.perf_counter(), t0, f"the router failed it: {out!r}"))
    return results


def run_policy(replicas: Replicas, policy: RoutePolicy, workload: Sequence[SharedPromptRequest],
               *, temperature: float = 0.0, deadline_s: float | None = 300.0,
               stall_timeout_s: float = STALL_TIMEOUT_S) -> list[RoutedResult]:
    """Serve ``workload`` on ``replicas`` (started) through ``policy``; one
    :class:`RoutedResult` per request, in dispatch order, whatever happens to the replicas.
    Greedy by default, ``ignore_eos`` so every request makes exactly ``max_tokens`` tokens.

    Every request ends: answered, or failed with a reason — its replica died (taken out of
    rotation at once), its replica made no progress for ``stall_timeout_s`` (the health check,
    every :data:`HEALTH_CHECK_S`), or no answer within ``deadline_s`` of being sent (None: no
    deadline). The event loop runs in a thread of its own, so a notebook (which already runs
    one) can call it too. Chapter 11."""
    if policy.num_replicas != len(replicas):
        raise ValueError(f"the policy routes over {policy.num_replicas} replicas but "
                         f"{len(replicas)} are running")
    if deadline_s is not None:
        positive_finite("deadline_s", deadline_s)
    positive_finite("stall_timeout_s", stall_timeout_s)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _dispatch(replicas.loops, policy, workload,
                                                  temperature, deadline_s,
                                                  stall_timeout_s)).result()


def summarize_routing(results: Sequence[RoutedResult], num_replicas: int) -> dict:
    """Hit rate = cached prompt tokens / prompt tokens; TTFT p50 / p90 (s, router clock, of the
    answered requests; ``num_failed`` counts the others);
    throughput = output tokens / (last finish − first arrival); per replica the requests,
    prompt tokens and prompt tokens computed (not cached); ``load_imbalance`` = max / mean
    requests per replica (1.0 is even). Chapter 11."""
    if not results:
        raise ValueError("no results to summarise")
    prompt = sum(r.prompt_tokens for r in results)
    cached = sum(r.cached_prompt_tokens for r in results)
    ttft = [r.ttft_s for r in results if r.error is None] or [float("nan")]
    duration = max(r.arrival_s + r.e2e_s for r in results) - min(r.arrival_s for r in results)
    out_tokens = sum(len(r.output_token_ids) for r in results)
    per = [[r for r in results if r.replica == i] for i in range(num_replicas)]
    counts = [len(p) for p in per]
    return {
        "num_requests": len(results), "num_failed": sum(r.error is not None for r in results),
        "prompt_tokens": prompt, "cached_prompt_tokens": cached,
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
