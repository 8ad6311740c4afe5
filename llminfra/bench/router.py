"""``python -m llminfra bench router``: round robin vs least loaded vs prefix-aware routing over
4 data-parallel replicas, on real engine processes serving SmolLM2-135M.

One seeded shared-system-prompt workload (:func:`llminfra.cluster.router_workload.
shared_prompt_workload`: a few long system prompts, each shared by many short user turns,
Poisson arrivals) is served under each policy by the same four replica processes
(:class:`llminfra.cluster.router_run.Replicas`, one torch thread each; on the project's 2-core
machine they share the cores, which slows every policy alike), each run with its own cache salt so no run inherits another's cached blocks; the
full run does two rounds (round robin, least loaded, prefix aware, then the reverse order) and
pools each policy's requests, ``--quick`` one round of 24 requests. Each replica's KV
pool is sized so that it can hold the blocks of a quarter of the system prompts next to its
running requests: the router decides whether every replica computes (and keeps evicting) every
system prompt (round robin, least loaded) or each computes its quarter once (prefix aware) —
the aggregate-cache effect SGLang's cache-aware router is built for. With N replicas whose
caches each hold 1/N of the prompts, a router blind to prefixes finds a prompt cached about
1/N of the time at best, so prefix-aware routing gains up to about N× in hit rate: 2 replicas
cap the gain near 2× (the recorded run, ``llminfra/data/bench_distributed_cpu.json``, has the
hit rates this bench measures).

Also reported: ``prefix_hit_rate_ceiling``, the hit rate no router can beat on this workload
(:func:`llminfra.cluster.router_workload.prefix_hit_rate_ceiling`: each system prompt's first
request misses, every later one hits its whole blocks). Reported per policy: prefix-cache hit rate (prompt tokens served from the replicas' caches /
prompt tokens, measured in the engines), TTFT p50 / p90 on the router's clock, output
tokens/s, requests and computed prompt tokens per replica, and ``load_imbalance`` (max / mean
requests per replica). On a shared machine treat differences of a few percent in TTFT or
throughput as noise; the hit rate depends on timing less (through the load guard, and through
requests with one prefix that arrive together and are admitted in the same step, before
either has cached it).
Chapter 11.
"""

from __future__ import annotations

from functools import partial
from types import MappingProxyType

import pandas as pd
import torch

from llminfra.bench.timing import environment
from llminfra.cluster.router import POLICIES
from llminfra.cluster.router_run import Replicas, compare_policies, replica_engine
from llminfra.cluster.router_workload import (prefix_hit_rate_ceiling, shared_prompt_workload,
                                              with_cache_salt)

SEED = 2026
NUM_REPLICAS = 4
MODEL = "smollm2-135m"
#: each replica's engine: 40 blocks of 16 tokens = 640 tokens of K/V; a system prompt of 192
#: tokens takes 12 blocks, so the 8 prompts (96 blocks) cannot all stay cached on one replica,
#: while a quarter of them (2 prompts, 24 blocks) can, beside the running requests' own blocks
ENGINE = MappingProxyType(dict(num_threads=1, num_blocks=40, block_size=16, max_num_seqs=8,
                               max_num_batched_tokens=256))
#: the workload of the full and the ``--quick`` run
WORKLOAD = MappingProxyType(dict(num_requests=96, num_system_prompts=8, system_prompt_tokens=192,
                                 user_tokens=(8, 32), max_tokens=8, rate_per_s=2.0))
QUICK_WORKLOAD = MappingProxyType({**WORKLOAD, "num_requests": 24})
#: rounds of the three policies (order reversed every other round), pooled per policy
REPEATS = 2


def run(quick: bool = False, model: str = MODEL) -> dict:
    """Serve the workload under every policy on ``NUM_REPLICAS`` replica processes of
    ``model``; JSON-ready numbers (per policy: the summary and every request's result)."""
    cfg = dict(QUICK_WORKLOAD if quick else WORKLOAD)
    workload = shared_prompt_workload(generator=torch.Generator().manual_seed(SEED), **cfg)
    engine = dict(ENGINE)
    factory = partial(replica_engine, model, **engine)
    with Replicas(NUM_REPLICAS, factory) as replicas:
        runs = compare_policies(replicas, workload, policies=tuple(POLICIES),
                                block_size=engine["block_size"],
                                max_blocks_per_replica=engine["num_blocks"],
                                repeats=1 if quick else REPEATS)
    return {
        "suite": "router", "environment": environment(), "quick": quick, "seed": SEED,
        "model": model, "num_replicas": NUM_REPLICAS, "engine": engine,
        "repeats": 1 if quick else REPEATS,
        "workload": {**cfg, "user_tokens": list(cfg["user_tokens"])},
        "prefix_hit_rate_ceiling": prefix_hit_rate_ceiling(with_cache_salt(workload, 1),
                                                           engine["block_size"]),
        "policies": {name: {k: v for k, v in r.items() if k != "results"}
                     for name, r in runs.items()},
        "results": {name: r["results"] for name, r in runs.items()},
    }


def policy_table(result: dict) -> pd.DataFrame:
    """One row per policy of a :func:`run` result (or its JSON): hit rate, TTFT p50 / p90 in
    ms, output tokens/s, requests and computed prompt tokens per replica, load imbalance."""
    rows = []
    for name, s in result["policies"].items():
        rows.append({
            "policy": name, "prefix_hit_rate": s["prefix_hit_rate"],
            "ttft_p50_ms": 1e3 * s["ttft_p50_s"], "ttft_p90_ms": 1e3 * s["ttft_p90_s"],
            "throughput_tokens_per_s": s["throughput_tokens_per_s"],
            "requests_per_replica": " / ".join(map(str, s["requests_per_replica"])),
            "computed_prompt_tokens_per_replica": " / ".join(
                map(str, s["computed_prompt_tokens_per_replica"])),
            "load_imbalance": s["load_imbalance"], "duration_s": s["duration_s"]})
    return pd.DataFrame(rows).set_index("policy")


def format_table(result: dict) -> str:
    """The :func:`policy_table` as plain text, with the run's settings on top."""
    w = result["workload"]
    head = (f"router: {result['num_replicas']} replicas of {result['model']}, "
            f"{w['num_requests']} requests, {w['num_system_prompts']} system prompts of "
            f"{w['system_prompt_tokens']} tokens, {w['rate_per_s']} req/s")
    return head + "\n" + policy_table(result).to_string(float_format=lambda x: f"{x:.3g}")
