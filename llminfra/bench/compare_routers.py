"""Our router beside the real ones, on the same replicas: ``make compare-routers``.

The same two workloads go, one run each, through four routers over the same ``llminfra serve``
replicas (prefix caching on, :class:`~llminfra.bench.router_fleet.ServeReplicas`):

* ``prefix_aware`` and ``round_robin`` — chapter 11's own policies
  (:mod:`llminfra.cluster.router`), run in the client: it hashes each prompt's token ids and
  sends the request straight to the chosen replica;
* ``vllm-router cache_aware`` and ``sglang-router cache_aware`` — the real routers
  (:class:`~llminfra.bench.router_fleet.RealRouter`): the client sends everything to the
  router, which keeps its own approximate prefix tree per replica.

Workloads (:func:`~llminfra.cluster.router_workload.shared_prompt_workload`: a few long system
prompts shared by many short user turns, Poisson arrivals): ``prefix_heavy`` as
``/v1/completions`` with the whole prompt as text, ``chat`` as ``/v1/chat/completions`` with the
system prompt and the user turn as two messages. Every run puts its own salt character in front
of every prompt (:func:`~llminfra.cluster.router_workload.with_cache_salt`), so no run inherits
another's cached blocks.

Measured per run: the prefix-cache hit rate from the replicas' own counters (the change of
``llminfra_prefix_cache_hits_total`` / ``llminfra_prefix_cache_queries_total`` over the run,
summed over replicas), TTFT p50 / p99 on the client's clock (first streamed text − scheduled
arrival), output tokens / (last finish − first arrival), requests per replica (their finished
counters), failures. The ceiling no router can beat is
:func:`~llminfra.cluster.router_workload.prefix_hit_rate_ceiling`. Chapter 11 teaches routing
on the recorded table (``llminfra/data/compare_routers_cpu.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import torch

from llminfra.cluster.router import RouteRequest, make_policy
from llminfra.bench.router_fleet import ROUTERS, RealRouter, ServeReplicas, version
from llminfra.cluster.router_workload import (SharedPromptRequest, prefix_hit_rate_ceiling,
                                              shared_prompt_workload, with_cache_salt)
from llminfra.engine.metrics import percentile
from llminfra.model import ByteTokenizer
from llminfra.serving.server import DEFAULT_MODEL_NAME, parse_metrics

#: the rows of the table, in order
ROUTER_ROWS = ("prefix_aware", "round_robin", "vllm-router cache_aware",
               "sglang-router cache_aware")
WORKLOADS = ("prefix_heavy", "chat")
#: the replicas' KV block size (``build_engine``'s default): the prefix-aware policy hashes
#: with it
BLOCK_SIZE = 16
#: the salt of run k is character ``SALT0 + k`` (printable ASCII: the tiny model's byte ids)
SALT0 = 33


def text(ids: Sequence[int]) -> str:
    """The tiny byte model's text of ``ids`` (one character per id, ids 0 … 127)."""
    return "".join(map(chr, ids))


def chat_messages(req: SharedPromptRequest, system_tokens: int) -> list[dict]:
    """A request as two chat messages: its first ``system_tokens`` ids (salt and system
    prompt) as the system message, the rest (the user turn) as the user's."""
    ids = req.prompt_token_ids
    return [{"role": "system", "content": text(ids[:system_tokens])},
            {"role": "user", "content": text(ids[system_tokens:])}]


def as_chat(requests: list[SharedPromptRequest], system_tokens: int
            ) -> list[SharedPromptRequest]:
    """The same requests with the token ids the replica sees for their chat messages (the
    tiny model's chat template around them): what a router hashes, and the ceiling's input."""
    tok = ByteTokenizer()
    return [dataclasses.replace(r, prompt_token_ids=tuple(tok.encode(tok.apply_chat_template(
        chat_messages(r, system_tokens))))) for r in requests]


def replica_counters(urls: Sequence[str]) -> list[dict]:
    """Each replica's prefix-cache hits and queries (tokens) and finished requests."""
    out = []
    for url in urls:
        page = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
        out.append({"hits": page.get("llminfra_prefix_cache_hits_total", 0.0),
                    "queries": page.get("llminfra_prefix_cache_queries_total", 0.0),
                    "finished": sum(v for k, v in page.items()
                                    if k.startswith("llminfra_request_success_total"))})
    return out


async def _one(client, kind: str, body: dict, arrival: float, t0: float) -> dict:
    """Send one streamed request at its arrival time; its TTFT, end and output tokens."""
    await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
    start = t0 + arrival
    first, tokens = None, 0
    try:
        if kind == "chat":
            stream = await client.chat.completions.create(**body)
        else:
            stream = await client.completions.create(**body)
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            piece = ((chunk.choices[0].delta.content if kind == "chat" else
                      chunk.choices[0].text) if chunk.choices else None)
            if piece and first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        return {"ttft_s": (first or end) - start, "end_s": end - t0, "arrival_s": arrival,
                "output_tokens": tokens, "error": None}
    except Exception as e:                      # recorded, never raised: every request ends
        return {"ttft_s": None, "end_s": time.perf_counter() - t0, "arrival_s": arrival,
                "output_tokens": 0, "error": f"{type(e).__name__}: {str(e)[:200]}"}


async def _run(requests: list[SharedPromptRequest], kind: str, system_tokens: int,
               base_url_for) -> list[dict]:
    """Every request at its arrival time; ``base_url_for(request, ids) -> (url, done)`` picks
    where it goes (``done()`` is called when it ends)."""
    import openai

    chat_ids = as_chat(requests, system_tokens) if kind == "chat" else requests
    clients: dict[str, openai.AsyncOpenAI] = {}
    t0 = time.perf_counter() + 0.05
    tasks = []
    for req, seen in zip(requests, chat_ids):
        body = ({"messages": chat_messages(req, system_tokens)} if kind == "chat"
                else {"prompt": text(req.prompt_token_ids)})
        body.update(model=DEFAULT_MODEL_NAME, max_tokens=req.max_tokens, temperature=0,
                    stream=True, stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True})
        url, done = base_url_for(req, seen.prompt_token_ids)
        if url not in clients:
            clients[url] = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused",
                                              max_retries=0, timeout=120)

        async def go(client=clients[url], body=body, arrival=req.arrival_time_s, done=done):
            try:
                return await _one(client, kind, body, arrival, t0)
            finally:
                done()
        tasks.append(asyncio.ensure_future(go()))
    results = await asyncio.gather(*tasks)
    for c in clients.values():
        await c.close()
    return results


def run_one(row: str, requests: list[SharedPromptRequest], kind: str, system_tokens: int,
            replicas: ServeReplicas, routers: dict[str, RealRouter],
            num_blocks: int = 4096) -> dict:
    """One run of ``requests`` through router ``row`` (:data:`ROUTER_ROWS`): each request's
    outcome and the replicas' counters over the run (:func:`summarize` pools runs)."""
    if row in ("prefix_aware", "round_robin"):
        options = ({"block_size": BLOCK_SIZE, "max_blocks_per_replica": num_blocks}
                   if row == "prefix_aware" else {})
        policy = make_policy(row, len(replicas), **options)

        def pick(req, ids):
            route = RouteRequest(req.request_id, tuple(ids), req.max_tokens)
            i = policy.route(route)
            return replicas.urls[i], lambda: policy.on_finish(route, i)
    else:
        url = routers[row.split()[0]].url

        def pick(req, ids):
            return url, lambda: None
    before = replica_counters(replicas.urls)
    results = asyncio.run(_run(requests, kind, system_tokens, pick))
    time.sleep(0.2)                             # the last finished requests' counters
    after = replica_counters(replicas.urls)
    return {"results": results,
            "hits": sum(a["hits"] - b["hits"] for a, b in zip(after, before)),
            "queries": sum(a["queries"] - b["queries"] for a, b in zip(after, before)),
            "per_replica": [a["finished"] - b["finished"] for a, b in zip(after, before)],
            "duration_s": (max(r["end_s"] for r in results)
                           - min(r["arrival_s"] for r in results))}


def summarize(runs: list[dict]) -> dict:
    """One row of the table from a router's runs (:func:`run_one`), pooled: hit rate = hits /
    queries of the replicas' counters over all its runs; TTFT p50 / p99 over all its answered
    requests; throughput = output tokens / the sum of the runs' durations (first arrival to
    last finish); requests per replica summed; failures and up to 3 distinct errors."""
    results = [r for run in runs for r in run["results"]]
    ok = [r for r in results if r["error"] is None]
    queries = sum(run["queries"] for run in runs)
    ttft = [r["ttft_s"] for r in ok] or [float("nan")]
    duration = sum(run["duration_s"] for run in runs)
    tokens = sum(r["output_tokens"] for r in ok)
    return {"runs": len(runs), "num_requests": len(results),
            "num_failed": len(results) - len(ok),
            "errors": sorted({r["error"] for r in results if r["error"]})[:3],
            "prefix_hit_rate": sum(run["hits"] for run in runs) / queries if queries else 0.0,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "output_tokens": tokens, "duration_s": duration,
            "throughput_tokens_per_s": tokens / duration if duration > 0 else float("nan"),
            "requests_per_replica": [sum(x) for x in zip(*(run["per_replica"]
                                                           for run in runs))]}


def compare_routers(*, num_replicas: int = 2, num_requests: int = 96, rate_per_s: float = 12.0,
                    num_system_prompts: int = 16, system_prompt_tokens: int = 128,
                    num_blocks: int = 128, max_tokens: int = 16, seed: int = 0,
                    repeats: int = 3, log_dir: Path | None = None) -> dict:
    """Start the replicas and both real routers, run each workload ``repeats`` times through
    each router of :data:`ROUTER_ROWS` (the order turned by one each round, so no router always
    goes first or last; a router's runs pooled by :func:`summarize`); the record :func:`main`
    writes (without the environment).

    The defaults make routing matter on 2 replicas: 16 system prompts of 128 tokens are 128
    KV blocks, as many as one replica's whole pool (``num_blocks``), which its running
    requests share; a replica that sees every prompt (round robin) keeps evicting them, one
    that sees half of them can keep those."""
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="compare-routers-"))
    settings = dict(num_replicas=num_replicas, num_requests=num_requests, rate_per_s=rate_per_s,
                    num_system_prompts=num_system_prompts,
                    system_prompt_tokens=system_prompt_tokens, num_blocks=num_blocks,
                    max_tokens=max_tokens, seed=seed, repeats=repeats, block_size=BLOCK_SIZE,
                    model="tiny", replica_threads=1)
    out = {"settings": settings, "workloads": {}}
    with ServeReplicas(num_replicas, log_dir, num_blocks=num_blocks) as replicas:
        routers = {name: RealRouter(name, replicas.urls, log_dir).start() for name in ROUTERS}
        try:
            warm = shared_prompt_workload(4 * num_replicas, torch.Generator().manual_seed(999),
                                          max_tokens=4)
            for url in replicas.urls:           # each engine's first steps, not measured
                for w in warm:
                    httpx.post(f"{url}/v1/completions", timeout=60, json={
                        "model": DEFAULT_MODEL_NAME, "prompt": text(w.prompt_token_ids),
                        "max_tokens": 4})
            salt = SALT0
            for k, kind in enumerate(WORKLOADS):
                base = shared_prompt_workload(
                    num_requests, torch.Generator().manual_seed(seed + k),
                    num_system_prompts=num_system_prompts,
                    system_prompt_tokens=system_prompt_tokens, max_tokens=max_tokens,
                    rate_per_s=rate_per_s)
                runs: dict[str, list[dict]] = {row: [] for row in ROUTER_ROWS}
                for rep in range(repeats):
                    turn = (rep + k) % len(ROUTER_ROWS)
                    for row in ROUTER_ROWS[turn:] + ROUTER_ROWS[:turn]:
                        runs[row].append(run_one(row, with_cache_salt(base, salt), kind,
                                                 system_prompt_tokens + 1, replicas, routers,
                                                 num_blocks))
                        salt += 1
                seen = with_cache_salt(base, SALT0)
                if kind == "chat":
                    seen = as_chat(seen, system_prompt_tokens + 1)
                out["workloads"][kind] = {
                    "endpoint": "/v1/chat/completions" if kind == "chat" else "/v1/completions",
                    "hit_rate_ceiling": prefix_hit_rate_ceiling(seen, BLOCK_SIZE),
                    "rows": {row: summarize(runs[row]) for row in ROUTER_ROWS}}
        finally:
            for r in routers.values():
                r.stop()
    return out


def lscpu() -> dict:
    """``lscpu``'s model name, CPU count and hypervisor (what the record names as device)."""
    import subprocess
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = dict(line.split(":", 1) for line in lines.splitlines() if ":" in line)
    keep = ("Model name", "CPU(s)", "Thread(s) per core", "Hypervisor vendor")
    return {k: fields[k].strip() for k in keep if k in fields}


def main(argv: list[str] | None = None) -> int:
    """``python -m llminfra.bench.compare_routers [--json PATH] [--requests N] [--rate R]
    [--repeats K] [--shared]``:
    the comparison, printed as a table and written as JSON with device, versions and date."""
    ap = argparse.ArgumentParser(prog="python -m llminfra.bench.compare_routers")
    ap.add_argument("--json", type=Path, default=None, help="write the record here")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--requests", type=int, default=96, help="requests per run")
    ap.add_argument("--rate", type=float, default=12.0, help="arrivals per second (Poisson)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="runs per router and workload")
    ap.add_argument("--shared", action="store_true",
                    help="say in the record that other work shared the machine")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record = compare_routers(num_replicas=args.replicas, num_requests=args.requests,
                             rate_per_s=args.rate, seed=args.seed, repeats=args.repeats)
    record = {
        "what": "the same workloads through chapter 11's routers and two real ones over the "
                "same llminfra serve replicas (tiny model, prefix caching on)",
        "command": "make compare-routers (python -m llminfra.bench.compare_routers "
                   + " ".join(argv if argv is not None else sys.argv[1:]) + ")",
        "date": started,
        "device": {"lscpu": lscpu(), "cpu_count": os.cpu_count()},
        "versions": {"llminfra": version("llminfra"), "vllm-router": version("vllm-router"),
                     "sglang-router": version("sglang-router"), "torch": torch.__version__,
                     "openai": version("openai"), "python": sys.version.split()[0]},
        "load_avg_before_after": [load_before, os.getloadavg()],
        "machine_shared": bool(args.shared),
        "note": ("TTFT on the client's clock (first streamed text - scheduled arrival); hit "
                 "rate from the replicas' own counters (llminfra_prefix_cache_hits_total / "
                 "_queries_total) over each run; each run salted so none inherits another's "
                 "cache" + ("; other sessions shared the machine's cores during the run, so "
                            "times are noisy and only their order within a run means much"
                            if args.shared else "")),
        **record}
    for kind, w in record["workloads"].items():
        print(f"{kind} ({w['endpoint']}): hit-rate ceiling {w['hit_rate_ceiling']:.3f}")
        for row, r in w["rows"].items():
            print(f"  {row:27s} hit {r['prefix_hit_rate']:.3f}  TTFT p50 "
                  f"{r['ttft_p50_s'] * 1e3:7.1f} ms  p99 {r['ttft_p99_s'] * 1e3:7.1f} ms  "
                  f"{r['throughput_tokens_per_s']:6.1f} tok/s  per replica "
                  f"{r['requests_per_replica']}  failed {r['num_failed']}")
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ROUTER_ROWS", "WORKLOADS", "as_chat", "chat_messages", "compare_routers",
           "run_one", "summarize", "text"]
