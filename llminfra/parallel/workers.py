"""Functions that run on every rank: ``fn(world, *args)`` for
:func:`~llminfra.parallel.launch.launch` (real processes) or
:func:`~llminfra.parallel.world.run_simulated` (threads).

They live in the package, not in a notebook, because ``spawn`` pickles a function by its module
and name. Each builds its inputs from a seed, so every rank (and the caller, for the reference)
draws the same weights and data without sending them. Results are plain tensors, lists and dicts.
Taught in chapter 07.
"""

from __future__ import annotations

import copy

import torch

from llminfra.parallel.data_parallel import replica_serve, tiny_model  # noqa: F401 (re-export)
from llminfra.parallel.megatron import apply_tensor_parallel, make_mlp, parallel_mlp
from llminfra.parallel.pipeline import pipeline_forward, run_stage, split_micro_batches
from llminfra.parallel.world import World
from llminfra.model.cache import DenseKVCache
from llminfra.model.generate import generate


def mlp_case(seed: int, dim: int = 48, ffn_dim: int = 96, batch: int = 3, tokens: int = 5):
    """``(mlp, x (batch, tokens, dim), w (batch, tokens, dim))`` drawn from ``seed``; the loss
    used for gradients is ``(mlp(x) · w).sum()``."""
    g = torch.Generator().manual_seed(seed)
    mlp = make_mlp(dim, ffn_dim, g)
    x = torch.randn(batch, tokens, dim, generator=g)
    w = torch.randn(batch, tokens, dim, generator=g)
    return mlp, x, w


def tp_mlp_step(world: World, seed: int) -> dict:
    """Forward and backward of the Megatron MLP on this rank: output, dL/dx, and this rank's
    shards of dL/dw1 (rows) and dL/dw2 (columns)."""
    mlp, x, w = mlp_case(seed)
    tp = parallel_mlp(copy.deepcopy(mlp), world)
    x = x.requires_grad_()
    y = tp(x)
    (y * w).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "dw1": tp.w1.weight.grad, "dw2": tp.w2.weight.grad}


def tp_generate(world: World, prompt: list[int], max_new_tokens: int,
                trained: bool = True) -> dict:
    """Greedy generation (KV cache) and full-sequence logits of the tiny model sharded over
    ``world`` with :func:`apply_tensor_parallel`."""
    model = apply_tensor_parallel(tiny_model(trained), world)
    with torch.no_grad():
        logits = model(torch.tensor([prompt]))
    cache = DenseKVCache(model.config.n_layers)
    tokens = generate(model, prompt, max_new_tokens, temperature=0.0, cache=cache)
    return {"tokens": tokens, "logits": logits}


def pipeline_logits(world: World, seed: int, n_micro: int, trained: bool = True) -> dict:
    """Tiny-model logits of a seeded ``(2·n_micro, 12)`` token batch through a GPipe pipeline."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (2 * n_micro, 12), generator=g)
    logits, events = pipeline_forward(world, tiny_model(trained), tokens, n_micro)
    return {"logits": logits, "n_events": len(events)}


def selfcheck(world: World, seed: int, prompt: list[int], max_new_tokens: int,
              trained: bool = True) -> dict:
    """Everything a test wants from one launch: MLP step, generation, pipeline logits."""
    return {"mlp": tp_mlp_step(world, seed),
            "generate": tp_generate(world, prompt, max_new_tokens, trained),
            "pipeline": pipeline_logits(world, seed, 2, trained)}


def distributed_selfcheck(world: World, seed: int, prompt: list[int], max_new_tokens: int,
                          trained: bool = True, dtensor: bool = True) -> dict:
    """:func:`selfcheck` plus (if ``dtensor``) the same MLP through
    ``torch.distributed.tensor.parallel`` (importing it costs about a second per rank)."""
    out = selfcheck(world, seed, prompt, max_new_tokens, trained)
    if dtensor:
        from llminfra.parallel.dtensor_check import dtensor_mlp_forward
        mlp, x, _ = mlp_case(seed)
        out["dtensor_y"] = dtensor_mlp_forward(world, mlp, x)
    out["backend"] = world.backend
    return out


def sleep_for(world: World, seconds: float) -> int:
    """Sleep, then return the rank (tests the launcher's deadline)."""
    import time
    time.sleep(seconds)
    return world.rank


def exit_on_rank(world: World, bad_rank: int, code: int) -> int:
    """``os._exit(code)`` on ``bad_rank`` (no exception, no result) while the others wait in an
    all-reduce: tests that the launcher names the rank that died and its exit code."""
    if world.rank == bad_rank:
        import os
        os._exit(code)
    world.all_reduce(torch.ones(1))
    return world.rank


def fail_on_rank(world: World, bad_rank: int) -> int:
    """Raise on ``bad_rank`` while the others wait in an all-reduce (tests error propagation)."""
    if world.rank == bad_rank:
        raise ValueError(f"rank {bad_rank} fails on purpose")
    world.all_reduce(torch.ones(1))
    return world.rank


@torch.no_grad()
def pipeline_timeline(world: World, micro_batch_counts: list[int], stage_time_s: float,
                      dim: int = 64, micro_batch_rows: int = 4, repeats: int = 1) -> dict:
    """For each ``m``: a ``world.size``-stage GPipe forward of ``m`` micro-batches of
    ``micro_batch_rows`` rows; each stage runs a real MLP block per micro-batch, padded by sleep
    to a fixed ``stage_time_s`` (the calibrated stage cost ``t`` of the bubble formula).
    Returns ``{m: [events per repeat]}``, events as ``(stage, micro_batch, start_s, end_s)``."""
    block = make_mlp(dim, 2 * dim, torch.Generator().manual_seed(world.rank))
    result = {}
    for m in micro_batch_counts:
        x = torch.randn(m * micro_batch_rows, dim, generator=torch.Generator().manual_seed(m))
        runs = []
        for _ in range(repeats):
            world.barrier()
            _, events = run_stage(world, lambda h: h + block(h), split_micro_batches(x, m), m,
                                  (micro_batch_rows, dim), stage_time_s=stage_time_s)
            runs.append([(e.stage, e.micro_batch, e.start_s, e.end_s) for e in events])
        result[m] = runs
    return result


def chapter_demo(world: World, prompt: list[int], max_new_tokens: int,
                 requests: list[list[int]], micro_batch_counts: list[int], stage_time_s: float,
                 trained: bool = True) -> dict:
    """Chapter 07's real multi-process run, one launch for everything: the tiny model's greedy
    tokens with tensor parallelism, GPipe timelines (``{m: events}`` for each count of
    micro-batches, fixed stage cost), and a data-parallel replica's share of ``requests``."""
    tp = tp_generate(world, prompt, max_new_tokens, trained)
    timeline = {m: runs[0] for m, runs in
                pipeline_timeline(world, micro_batch_counts, stage_time_s).items()}
    return {"rank": world.rank, "backend": getattr(world, "backend", "simulated"),
            "tp_tokens": tp["tokens"], "timeline": timeline,
            "replica": replica_serve(world, requests, max_new_tokens, trained)}
