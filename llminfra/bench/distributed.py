"""``python -m llminfra bench distributed [--quick] --json PATH``: chapter 11 measured in one run.

* ``ep_max_error``, ``ring_attention_max_error`` (and the tensor-parallel-experts and decode
  context-parallel errors): :func:`llminfra.parallel.beyond_check.distributed_selfcheck` on 2
  and on 4 spawned gloo ranks (``--quick``: 2) — the largest |parallel − one process|;
* ``disagg``: colocated vs disaggregated prefill/decode on SmolLM2-135M, TTFT / TPOT
  percentiles and goodput at the stated SLOs (:mod:`llminfra.bench.disagg`), and
  ``kv_transfer_bytes_per_s``, the KV handoff's measured rate between the two processes;
* ``router``: prefix-cache hit rate and TTFT p50 per routing policy on 4 replica processes of
  SmolLM2-135M, shared-system-prompt workload (:mod:`llminfra.bench.router`).

Targets (issue 23): every error ≤ 1e-5; prefix-aware hit rate ≥ 2× round robin's; every request
of every run finished. ``targets`` says which were met. Taught in chapter 11.
"""

from __future__ import annotations

from llminfra.bench import disagg as disagg_suite
from llminfra.bench import router as router_suite
from llminfra.bench.timing import cpu_name, environment
from llminfra.parallel.beyond_check import distributed_selfcheck

ERROR_TARGET = 1e-5
HIT_RATE_TARGET = 2.0

ERRORS = ("ep_max_error", "tp_experts_max_error", "ring_attention_max_error",
          "decode_cp_max_error")


def _router(result: dict) -> dict:
    done = {name: sum(r["finish_reason"] in ("stop", "length") for r in rs)
            for name, rs in result["results"].items()}
    policies = {name: {"prefix_hit_rate": s["prefix_hit_rate"], "ttft_p50_s": s["ttft_p50_s"],
                       "ttft_p90_s": s["ttft_p90_s"],
                       "throughput_tokens_per_s": s["throughput_tokens_per_s"],
                       "requests_per_replica": s["requests_per_replica"],
                       "num_requests": s["num_requests"], "num_finished": done[name]}
                for name, s in result["policies"].items()}
    rr = policies["round_robin"]["prefix_hit_rate"]
    ratio = policies["prefix_aware"]["prefix_hit_rate"] / rr if rr > 0 else float("inf")
    ceiling = result["prefix_hit_rate_ceiling"]
    return {"environment": result["environment"],   # its own run's (`bench router` re-runs it)
            "model": result["model"], "num_replicas": result["num_replicas"],
            "workload": result["workload"], "engine": result["engine"],
            "repeats": result["repeats"], "policies": policies,
            "hit_rate_prefix_aware_over_round_robin": ratio,
            "prefix_hit_rate_ceiling": ceiling,
            "prefix_aware_share_of_ceiling": policies["prefix_aware"]["prefix_hit_rate"] / ceiling,
            "ceiling_over_round_robin": ceiling / rr if rr > 0 else float("inf")}


def run(quick: bool = False) -> dict:
    """Every chapter-11 measurement; JSON-ready."""
    checks = [distributed_selfcheck(n) for n in ((2,) if quick else (2, 4))]
    errors = {k: max(c[k] for c in checks) for k in ERRORS}
    dis = disagg_suite.run(quick)
    router = _router(router_suite.run(quick))
    d = dis["disaggregated"]
    finished = (dis["colocated"]["num_errors"] == 0 and d["num_errors"] == 0
                and not any(d["blocks_leaked"].values())
                and all(p["num_finished"] == p["num_requests"]
                        for p in router["policies"].values()))
    keys = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "slo_attainment",
            "goodput_rps", "num_requests", "num_errors")
    summary = {"slo": dis["slo"], "threads": dis["threads"],
               **{k: {q: dis[k][q] for q in keys} for k in
                  ("colocated", "colocated_1_thread", "disaggregated")},
               "goodput_ratio": (d["goodput_rps"] / dis["colocated"]["goodput_rps"]
                                 if dis["colocated"]["goodput_rps"] > 0 else float("inf")),
               "greedy_outputs_equal": dis["greedy_outputs_equal"]}
    return {
        "suite": "distributed", "environment": {**environment(), "cpu": cpu_name()},
        "quick": quick,
        **errors,
        "selfchecks": checks,
        "disagg": summary,
        "kv_transfer_bytes_per_s": d["kv_bytes_per_request_mean"] / d["transfer_s_mean"],
        "disagg_run": dis,
        "router": router,
        "targets": {
            "errors_at_most_1e-5": all(v <= ERROR_TARGET for v in errors.values()),
            "prefix_aware_hit_rate_at_least_2x_round_robin":
                router["hit_rate_prefix_aware_over_round_robin"] >= HIT_RATE_TARGET,
            "every_request_finished": finished,
        },
    }


def format_table(result: dict) -> str:
    """The headline numbers as plain text."""
    lines = [f"errors vs one process (gloo, {', '.join(str(c['world_size']) for c in result['selfchecks'])} ranks):"]
    lines += [f"  {k}: {result[k]:.3g}" for k in ERRORS]
    lines.append(f"KV transfer between the processes: "
                 f"{result['kv_transfer_bytes_per_s'] / 1e6:.4g} MB/s")
    for design, d in result["disagg"].items():
        if isinstance(d, dict):
            lines.append(f"  {design}: " + ", ".join(
                f"{k} {v:.4g}" for k, v in d.items() if isinstance(v, (int, float))))
    lines.append("router (prefix hit rate, TTFT p50 s):")
    for name, p in result["router"]["policies"].items():
        lines.append(f"  {name}: {p['prefix_hit_rate']:.3g}, {p['ttft_p50_s']:.3g}")
    lines.append(f"targets: {result['targets']}")
    return "\n".join(lines)
