"""Pipeline parallelism: layers split into stages, GPipe micro-batches, the schedule as a timeline.

Huang et al., 2019, "GPipe" (arXiv:1811.06965), §2.2 and Fig. 2. The ``L`` layers are cut into
``p`` consecutive stages, one per rank; the batch is cut into ``m`` micro-batches. Stage ``s``
takes micro-batch ``i`` from stage ``s-1`` (``recv``), runs its layers and hands the result to
stage ``s+1`` (``send``). With the same time ``t`` per micro-batch on every stage, stage ``s``
works on micro-batch ``i`` during ``[(i+s)·t, (i+s+1)·t)``::

    stage 0 | 0 | 1 | 2 | 3 |   .   .   .        p = 3 stages, m = 4 micro-batches
    stage 1 .   | 0 | 1 | 2 | 3 |   .   .        makespan (m + p - 1)·t = 6·t
    stage 2 .   .   | 0 | 1 | 2 | 3 |            busy m·t per stage

so the idle share of the ``p`` stages, the *bubble*, is ``(p - 1) / (m + p - 1)`` (GPipe §2.2
gives the equivalent ``O((p-1)/(m+p-1))``); here ``2/6 = 1/3``. This module runs the forward
pass only (inference). :func:`measured_bubble` computes the same share from a recorded
timeline: ``1 - Σ_s busy_s / (p · makespan)``.

Timestamps come from ``time.monotonic()`` (CLOCK_MONOTONIC on Linux: one clock for every
process of the machine), so timelines recorded by different ranks line up.
Taught in chapter 07.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from llminfra.parallel.world import World
from llminfra.validate import positive_int
from llminfra.model.rope import rotary_angles


@dataclass(frozen=True)
class StageEvent:
    """Stage ``stage`` worked on micro-batch ``micro_batch`` from ``start_s`` to ``end_s``."""

    stage: int
    micro_batch: int
    start_s: float
    end_s: float


def bubble_fraction(n_stages: int, n_micro: int) -> float:
    """GPipe's idle share ``(p - 1) / (m + p - 1)``; p = 4, m = 8 -> 3/11 = 0.2727."""
    for name, v in (("n_stages", n_stages), ("n_micro", n_micro)):
        positive_int(name, v)
    return (n_stages - 1) / (n_micro + n_stages - 1)


def gpipe_schedule(n_stages: int, n_micro: int, stage_time_s: float = 1.0) -> list[StageEvent]:
    """The ideal GPipe forward timeline: stage s runs micro-batch i in ``[(i+s)t, (i+s+1)t)``."""
    bubble_fraction(n_stages, n_micro)  # validates
    t = float(stage_time_s)
    if not t > 0:
        raise ValueError(f"stage_time_s must be > 0, got {stage_time_s!r}")
    return [StageEvent(s, i, (i + s) * t, (i + s + 1) * t)
            for s in range(n_stages) for i in range(n_micro)]


def measured_bubble(events: list[StageEvent], n_stages: int | None = None) -> float:
    """``1 - Σ busy / (p · makespan)`` of a recorded timeline (makespan: first start to last
    end over all stages; ``p`` defaults to the number of stages seen)."""
    if not events:
        raise ValueError("no events: run a pipeline first")
    p = n_stages or len({e.stage for e in events})
    makespan = max(e.end_s for e in events) - min(e.start_s for e in events)
    if not makespan > 0:
        raise ValueError(f"the events span {makespan} s: a bubble needs a timeline of "
                         "positive length")
    busy = sum(e.end_s - e.start_s for e in events)
    return 1.0 - busy / (p * makespan)


def split_layers(n_layers: int, n_stages: int) -> list[range]:
    """Consecutive layer ranges, one per stage, as equal as possible (the first stages take the
    remainder): ``split_layers(10, 4) -> [0:3, 3:6, 6:8, 8:10]``."""
    if not 1 <= n_stages <= n_layers:
        raise ValueError(f"cannot cut {n_layers} layers into {n_stages} stages "
                         f"(allowed: 1..{n_layers} stages)")
    q, r = divmod(n_layers, n_stages)
    bounds = [0]
    for s in range(n_stages):
        bounds.append(bounds[-1] + q + (1 if s < r else 0))
    return [range(bounds[s], bounds[s + 1]) for s in range(n_stages)]


def split_micro_batches(x: torch.Tensor, n_micro: int) -> list[torch.Tensor]:
    """Cut the batch dimension (dim 0) into ``n_micro`` equal micro-batches."""
    if n_micro < 1 or x.shape[0] % n_micro:
        raise ValueError(f"batch of {x.shape[0]} cannot be cut into {n_micro} equal "
                         f"micro-batches (n_micro must divide the batch size)")
    return list(x.chunk(n_micro, dim=0))


def _pad_to(start_s: float, stage_time_s: float | None) -> None:
    """Sleep until ``start_s + stage_time_s`` (a fixed stage cost; no-op when None)."""
    if stage_time_s is not None:
        left = start_s + stage_time_s - time.monotonic()
        if left > 0:
            time.sleep(left)


def _check_first_stage(stage: int, micro_batches, n_micro: int) -> None:
    if stage == 0 and (micro_batches is None or len(micro_batches) != n_micro):
        raise ValueError(f"stage 0 needs {n_micro} micro-batches, got "
                         f"{None if micro_batches is None else len(micro_batches)}")


@torch.no_grad()
def run_stage(world: World, stage: Callable[[torch.Tensor], torch.Tensor],
              micro_batches: list[torch.Tensor] | None, n_micro: int,
              recv_shape: tuple[int, ...], recv_dtype: torch.dtype = torch.float32,
              stage_time_s: float | None = None) -> tuple[list[torch.Tensor], list[StageEvent]]:
    """Run this rank's stage of a GPipe forward pass over ``n_micro`` micro-batches.

    Rank 0 reads ``micro_batches``; every other rank receives a ``recv_shape`` tensor per
    micro-batch from the rank before. Every rank but the last sends its output on. The receive
    of micro-batch ``i+1`` is posted before micro-batch ``i`` is computed and sends do not wait
    (``irecv`` / ``isend``), so transfers overlap the work as in real pipelines. An event spans
    from the moment micro-batch ``i``'s input is in hand to the moment its output is handed on:
    the gaps between events are the time spent waiting for the stage before (the bubble).

    ``stage_time_s``, if given, pads each micro-batch's work with sleep to that fixed duration
    (a calibrated stage cost, so that the schedule can be measured on a shared CPU; the real
    computation still runs). A sleep that wakes late (a busy CPU) shortens the next pads by as
    much, so that each stage's mean cost per micro-batch stays ``stage_time_s``.
    Returns (the last stage's outputs, ``[]`` elsewhere; this stage's events).
    """
    s, p = world.rank, world.size
    _check_first_stage(s, micro_batches, n_micro)
    outputs, events, sends = [], [], []
    late_s = 0.0  # how much the sleeps so far overshot: taken off the next pad
    pending = world.irecv(recv_shape, recv_dtype, src=s - 1) if s > 0 else None
    for i in range(n_micro):
        x = micro_batches[i] if s == 0 else pending.wait()  # idle: waiting for stage s-1
        t0 = time.monotonic()
        if s > 0 and i + 1 < n_micro:
            pending = world.irecv(recv_shape, recv_dtype, src=s - 1)
        y = stage(x)
        _pad_to(t0, None if stage_time_s is None else stage_time_s - late_s)
        if s < p - 1:
            sends.append(world.isend(y, dst=s + 1))
        else:
            outputs.append(y)
        events.append(StageEvent(s, i, t0, time.monotonic()))
        if stage_time_s is not None:
            late_s = max(0.0, late_s + events[-1].end_s - t0 - stage_time_s)
    for h in sends:
        h.wait()
    return outputs, events


class ModelStage(nn.Module):
    """Stage ``s`` of ``p`` of the tiny :class:`~llminfra.model.transformer.Transformer`
    (full-sequence forward, no cache): stage 0 adds the token embedding, the last stage the
    final norm and output projection. ``tokens (B, T) -> (B, T, dim)`` on the first stage,
    ``(B, T, dim) -> (B, T, dim)`` in between, ``… -> logits (B, T, vocab)`` on the last."""

    def __init__(self, model: nn.Module, stage: int, n_stages: int):
        super().__init__()
        self.model, self.stage, self.n_stages = model, stage, n_stages
        self.layer_ids = split_layers(len(model.layers), n_stages)[stage]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, cfg = self.model, self.model.config
        h = m.tok_embeddings(x) if self.stage == 0 else x
        cos, sin = rotary_angles(cfg.head_dim, 0, h.shape[1], cfg.rope_theta, device=h.device,
                                 scaling=cfg.rope_scaling)
        for i in self.layer_ids:
            h = m.layers[i](h, cos, sin)
        return m.output(m.norm(h)) if self.stage == self.n_stages - 1 else h


def pipeline_forward(world: World, model: nn.Module, tokens: torch.Tensor, n_micro: int,
                     stage_time_s: float | None = None):
    """The tiny model's logits for ``tokens (B, T)`` computed by a ``world.size``-stage GPipe
    pipeline with ``n_micro`` micro-batches. Returns ``(logits (B, T, vocab) on the last rank,
    None elsewhere; this rank's events)``. Every rank holds the full model; only its stage runs."""
    chunks = split_micro_batches(tokens, n_micro)
    stage = ModelStage(model, world.rank, world.size)
    shape = (chunks[0].shape[0], tokens.shape[1], model.config.dim)
    outs, events = run_stage(world, stage, chunks if world.rank == 0 else None, n_micro,
                             shape, stage_time_s=stage_time_s)
    return (torch.cat(outs) if outs else None), events
