"""``python -m llminfra bench parallel [--quick] --json PATH``: tensor and pipeline parallelism.

Measured side by side in one run (chapter 07):

* the Megatron SwiGLU MLP at hidden 1024 and 4096 (inner size 8/3·h rounded up to 256, the
  Llama rule: 2816 and 11008 — the latter is Llama-2-7B's MLP) on 2 ranks over gloo, one thread
  per rank, against the same MLP in this process with one thread: ``tp_max_abs_error``,
  ``tp_speedup_vs_single`` (single time / 2-rank time), the all-reduce alone;
* ``allreduce_bytes_per_layer``: the bytes the two all-reduces of one layer carry in that run
  (``2 · tokens · h · 4`` in float32), and for Llama-2-70B in bf16 (prefill of 2048 tokens,
  decode at batch 1) from :mod:`llminfra.calc.communication`;
* the GPipe bubble for p = 2, 4 stages and m = 1, 2, 4, 8, 16 micro-batches. Each stage runs a
  real MLP block per micro-batch, padded with ``time.sleep`` to a FIXED cost
  ``stage_time_s`` (a calibrated stage cost ``t``: on a CPU shared with other work, unpadded
  compute times scatter too much to see the schedule). What is measured is the schedule —
  recv/send over gloo, waiting, and the real time stamps of every stage — not the speed of the
  compute. The median of the repeats is reported.

``run_gpu()`` runs the tensor-parallel check on CUDA: NCCL with one GPU per rank when there are
two or more, else gloo with CUDA tensors on the single GPU (and says so).
"""

from __future__ import annotations

import copy
import statistics

import torch

from llminfra.bench.timing import best_time_s, environment
from llminfra.calc.communication import allreduce_bytes_per_layer
from llminfra.parallel.launch import launch
from llminfra.parallel.megatron import make_mlp, parallel_mlp
from llminfra.parallel.pipeline import StageEvent, bubble_fraction, measured_bubble
from llminfra.parallel.world import World
from llminfra.parallel.workers import pipeline_timeline

HIDDEN = (1024, 4096)
MICRO_BATCHES = (1, 2, 4, 8, 16)
STAGES = (2, 4)


def ffn_size(dim: int) -> int:
    """Llama's inner size: 8/3·h rounded up to a multiple of 256 (1024 -> 2816, 4096 -> 11008)."""
    return 256 * -(-(8 * dim) // (3 * 256))


@torch.no_grad()
def tp_mlp_timing(world: World, dim: int, ffn_dim: int, tokens: int, repeats: int,
                  device: str = "cpu") -> dict:
    """On this rank: best time of the Megatron MLP forward on ``tokens`` tokens; on rank 0 also
    the unsharded MLP, timed alternately with it (the others wait at a barrier), so both see the
    same machine; then the all-reduce of the output alone. Outputs are returned on the CPU."""
    g = torch.Generator().manual_seed(0)
    full = make_mlp(dim, ffn_dim, g).to(device)
    x = torch.randn(tokens, dim, generator=g).to(device)
    tp = parallel_mlp(copy.deepcopy(full), world)
    single_s, step_s = float("inf"), float("inf")
    for k in range(repeats + 1):  # the first round warms up and is not counted
        world.barrier()
        if world.rank == 0:
            t = best_time_s(lambda: full(x), repeats=1, warmup=0, device=device)
            single_s = min(single_s, t) if k else single_s
        world.barrier()
        t = best_time_s(lambda: tp(x), repeats=1, warmup=0, device=device)
        step_s = min(step_s, t) if k else step_s
    y = tp(x)
    world.barrier()
    allreduce_s = best_time_s(lambda: world.all_reduce(y), repeats=repeats, device=device)
    y_full = full(x).cpu() if world.rank == 0 else None
    return {"step_s": step_s, "single_s": single_s, "allreduce_s": allreduce_s, "y": y.cpu(),
            "y_full": y_full}


def bench_ranks(world: World, tp_cfg: dict | None, pipe_cfg: dict | None) -> dict:
    """What each rank of a bench launch does: tensor-parallel timings (``tp_cfg``), then the
    pipeline timelines (``pipe_cfg``); either may be None."""
    out = {}
    if tp_cfg is not None:
        device = tp_cfg.get("device", "cpu")
        if device == "cuda":
            device = f"cuda:{world.rank % torch.cuda.device_count()}"
        out["tp"] = {d: tp_mlp_timing(world, d, f, tp_cfg["tokens"], tp_cfg["repeats"], device)
                     for d, f in tp_cfg["dims"]}
    if pipe_cfg is not None:
        out["pipe_all"] = pipeline_timeline(world, pipe_cfg["ms"], pipe_cfg["stage_time_s"],
                                            repeats=pipe_cfg["repeats"])
    return out


def _timeline(ranks: list, m: int, rep: int) -> list:
    """Every rank's events of repeat ``rep`` with ``m`` micro-batches, as one list."""
    return [e for r in ranks for e in r["pipe_all"][m][rep]]


def _bubbles(ranks: list) -> dict:
    """``{"m=4": median measured bubble over the repeats}`` from all ranks' timelines."""
    p, out = len(ranks), {}
    for m, reps in ranks[0]["pipe_all"].items():
        values = [measured_bubble([StageEvent(*e) for e in _timeline(ranks, m, k)], p)
                  for k in range(len(reps))]
        out[f"m={m}"] = statistics.median(values)
    return out


def run(quick: bool = False) -> dict:
    """Measure everything above; ``quick`` uses fewer repeats and shorter stage costs."""
    tokens, repeats = (32, 2) if quick else (64, 5)
    stage_time_s, pipe_repeats = (0.05, 1) if quick else (0.06, 3)
    tp_cfg = {"dims": [(d, ffn_size(d)) for d in HIDDEN], "tokens": tokens, "repeats": repeats}
    pipe_cfg = {"ms": list(MICRO_BATCHES), "stage_time_s": stage_time_s, "repeats": pipe_repeats}
    two = launch(bench_ranks, 2, tp_cfg, pipe_cfg, timeout_s=300)
    four = launch(bench_ranks, 4, None, pipe_cfg, timeout_s=300)
    result = {"environment": environment(), "tokens": tokens, "ranks": 2,
              "threads_per_rank": 1, "tp_max_abs_error": 0.0, "tp_speedup_vs_single": {},
              "tp_step_s": {}, "single_step_s": {}, "allreduce_s": {},
              "allreduce_share_of_step": {}, "allreduce_bytes_per_layer": {}}
    for dim in HIDDEN:
        tp = two[0]["tp"][dim]
        single_s, y_ref = tp["single_s"], tp["y_full"]
        err = max(float((r["tp"][dim]["y"] - y_ref).abs().max()) for r in two)
        step_s = max(r["tp"][dim]["step_s"] for r in two)
        key = f"h={dim}"
        result["tp_max_abs_error"] = max(result["tp_max_abs_error"], err)
        result["tp_speedup_vs_single"][key] = single_s / step_s
        result["tp_step_s"][key], result["single_step_s"][key] = step_s, single_s
        result["allreduce_s"][key] = tp["allreduce_s"]
        result["allreduce_share_of_step"][key] = tp["allreduce_s"] / step_s
        result["allreduce_bytes_per_layer"][key] = 2 * tokens * dim * 4
    result["allreduce_bytes_per_layer"]["llama-2-70b bf16 prefill 2048"] = \
        allreduce_bytes_per_layer("llama-2-70b", 2048)
    result["allreduce_bytes_per_layer"]["llama-2-70b bf16 decode batch 1"] = \
        allreduce_bytes_per_layer("llama-2-70b", 1)
    result["pipeline"] = {"stage_time_s": stage_time_s, "repeats": pipe_repeats,
                          "stage_cost": "real MLP block per micro-batch, padded by sleep to "
                                        "stage_time_s"}
    result["bubble_measured"] = {"p=2": _bubbles(two), "p=4": _bubbles(four)}
    result["bubble_formula"] = {f"p={p}": {f"m={m}": bubble_fraction(p, m) for m in MICRO_BATCHES}
                                for p in STAGES}
    result["pipeline_timelines"] = {f"p={p}": {f"m={m}": _timeline(r, m, 0) for m in MICRO_BATCHES}
                                    for p, r in ((2, two), (4, four))}
    return result


def format_table(result: dict) -> str:
    """The numbers of :func:`run` as plain text."""
    lines = [f"tensor-parallel MLP, 2 ranks over gloo, 1 thread each, {result['tokens']} tokens "
             f"(max |error| {result['tp_max_abs_error']:.2g})",
             f"{'hidden':>8} {'1 proc':>10} {'2 ranks':>10} {'speed-up':>9} {'all-reduce':>11} "
             f"{'share':>6} {'bytes/layer':>12}"]
    for key, speed in result["tp_speedup_vs_single"].items():
        lines.append(f"{key[2:]:>8} {result['single_step_s'][key] * 1e3:>8.2f}ms "
                     f"{result['tp_step_s'][key] * 1e3:>8.2f}ms {speed:>8.2f}x "
                     f"{result['allreduce_s'][key] * 1e3:>9.3f}ms "
                     f"{result['allreduce_share_of_step'][key]:>6.1%} "
                     f"{result['allreduce_bytes_per_layer'][key]:>12,}")
    for key, b in result["allreduce_bytes_per_layer"].items():
        if not key.startswith("h="):
            lines.append(f"  all-reduce bytes per layer, {key}: {b:,}")
    lines.append(f"GPipe bubble, measured (formula (p-1)/(m+p-1)); stage cost "
                 f"{result['pipeline']['stage_time_s']} s per micro-batch, padded by sleep")
    for p, row in result["bubble_measured"].items():
        cells = [f"{m}: {v:.3f} ({result['bubble_formula'][p][m]:.3f})" for m, v in row.items()]
        lines.append(f"  {p}  " + "  ".join(cells))
    return "\n".join(lines)


def run_gpu() -> dict:
    """The tensor-parallel MLP check on CUDA tensors: NCCL over the largest power of two (at
    most 8) of the visible GPUs when there are two or more, else gloo with 2 ranks sharing the
    one GPU (and the result says so)."""
    n_gpus = torch.cuda.device_count()
    ranks = 2 ** (min(n_gpus, 8).bit_length() - 1) if n_gpus >= 2 else 2  # divides 2816, 11008
    backend = "nccl" if n_gpus >= 2 else "gloo"
    dims = [(d, ffn_size(d)) for d in HIDDEN]
    out = launch(bench_ranks, ranks, {"dims": dims, "tokens": 256, "repeats": 10,
                                      "device": "cuda"}, None, backend=backend, timeout_s=120)
    res = {"backend": backend, "ranks": ranks, "gpus": n_gpus,
           "note": ("NCCL, one GPU per rank" if backend == "nccl" else
                    "only one GPU: 2 ranks over gloo, both on cuda:0 (tensors copied through the "
                    "host by gloo; checks correctness, not NVLink speed)"),
           "tp_max_abs_error": {}, "tp_step_s": {}, "single_step_s": {}, "allreduce_s": {}}
    for dim, _ in dims:
        key, tp = f"h={dim}", out[0]["tp"][dim]
        res["tp_max_abs_error"][key] = max(float((r["tp"][dim]["y"] - tp["y_full"]).abs().max())
                                           for r in out)
        res["tp_step_s"][key], res["single_step_s"][key] = tp["step_s"], tp["single_s"]
        res["allreduce_s"][key] = tp["allreduce_s"]
    return res
