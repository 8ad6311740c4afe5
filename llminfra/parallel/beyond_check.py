"""Chapter 11's check on real ranks: expert parallelism and context parallelism in ONE launch.

Spawning ranks costs seconds (each imports torch), so the chapter, ``bench distributed`` and
the tests start one group and run both on it: the expert-parallel and tensor-parallel MoE layer
against one process (:func:`~llminfra.parallel.expert_parallel.moe_rank_check`), and ring
attention (three layouts, causal and not) plus decode context parallelism against full
attention (:func:`~llminfra.parallel.context_parallel.context_parallel_selfcheck`).
Taught in chapter 11.
"""

from __future__ import annotations

import time

from llminfra.parallel.context_parallel import context_parallel_selfcheck
from llminfra.parallel.expert_parallel import MoECase, compare_to_single, moe_rank_check
from llminfra.parallel.launch import launch
from llminfra.parallel.world import World, run_simulated
from llminfra.validate import positive_int


def beyond_rank_check(world: World, case: MoECase, seed: int) -> dict:
    """What one rank runs: the MoE layer both ways, then every context-parallel case."""
    return {"moe": moe_rank_check(world, case), "context": context_parallel_selfcheck(world, seed)}


def distributed_selfcheck(world_size: int = 2, seed: int = 0, real_processes: bool = True,
                          timeout_s: float = 180.0) -> dict:
    """Run :func:`beyond_rank_check` on ``world_size`` ranks (spawned processes over gloo, or
    simulated threads) and compare with one process. Keys: ``world_size``, ``backend``,
    ``ep_max_error``, ``tp_experts_max_error``, ``ring_attention_max_error``,
    ``decode_cp_max_error`` (max |parallel − single| over every rank and case), ``cases`` (the
    context-parallel cases by name), ``seconds`` (the whole run, spawn included)."""
    positive_int("world_size", world_size)
    case = MoECase(num_experts=4 * world_size, top_k=2, tokens=8 * world_size + 5,
                   ffn_dim=24 * world_size,
                   capacity_factor=None, seed=seed)
    t0 = time.perf_counter()
    if real_processes:
        results = launch(beyond_rank_check, world_size, case, seed, timeout_s=timeout_s)
        backend = "gloo"
    else:
        results, backend = run_simulated(beyond_rank_check, world_size, case, seed), "simulated"
    seconds = time.perf_counter() - t0
    moe = compare_to_single(case, [r["moe"] for r in results])
    cases: dict[str, float] = {}
    for r in results:
        for c in r["context"]:
            cases[c["case"]] = max(cases.get(c["case"], 0.0), float(c["max_abs_err"]))
    return {"world_size": world_size, "backend": backend,
            "ep_max_error": moe["max_abs_diff_ep"],
            "tp_experts_max_error": moe["max_abs_diff_tp"],
            "ring_attention_max_error": max(v for k, v in cases.items() if k.startswith("ring")),
            "decode_cp_max_error": max(v for k, v in cases.items() if k.startswith("decode")),
            "cases": cases, "seconds": seconds}


__all__ = ["beyond_rank_check", "distributed_selfcheck"]
