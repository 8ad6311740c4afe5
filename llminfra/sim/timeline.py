"""Who ran when: the engine on a small workload, timed in engine steps, as one row per request.

The real :class:`~llminfra.engine.LLMEngine` runs the real tiny model, but its ``clock`` is a
:class:`StepClock` that reads the number of steps taken, so the timeline is the scheduler's
decisions alone — the same on every machine, free of timing noise — and the three policies
(static, dynamic, continuous batching) can be compared request by request. Step k occupies
the interval [k, k+1); a token sampled in step k is out at k + 1.

Per request (all in steps): queued = first scheduled − arrival; TTFT = first token out −
arrival; end-to-end = last token out − arrival; padding steps = the steps after its last token
in which static batching still computed its row (a discarded token:
:mod:`llminfra.engine.static_batch`), the slots an early finisher wastes while the rest of its
batch runs. Static batching (requests wait for a whole batch to finish) against iteration-level
scheduling: Yu et al., 2022, *Orca*, OSDI '22; chunked prefill: Agrawal et al., 2024,
*Sarathi-Serve*, arXiv:2403.02310.

Taught in chapter 05 (the batching-timeline widget).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.engine.metrics import ttft


class StepClock:
    """A clock that reads ``now`` (the driver sets it to the step index); pass it as
    ``LLMEngine(..., clock=StepClock())``."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class TimelineRow:
    """One request's life in steps; ``token_steps``: the steps whose end produced a token;
    ``padding_steps``: the steps that computed its row as padding after it finished."""

    request_id: str
    prompt_len: int
    output_len: int
    arrival: float
    first_scheduled: float
    first_token_out: float
    finished_out: float
    token_steps: tuple
    padding_steps: tuple = ()

    @property
    def queued(self) -> float:
        return self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float:
        """:func:`llminfra.engine.metrics.ttft` of the first token's way out."""
        return ttft(self.arrival, self.first_token_out)

    @property
    def e2e(self) -> float:
        return self.finished_out - self.arrival


@dataclass(frozen=True)
class WorkItem:
    """A request of a workload: ``prompt_len`` tokens in, ``max_tokens`` out, arriving at
    step ``arrival_step``."""

    prompt_len: int
    max_tokens: int
    arrival_step: int = 0


def demo_workload(num_requests: int = 8, seed: int = 0, gap_steps: int = 2,
                  prompt_range: tuple = (8, 48), output_range: tuple = (4, 40)) -> list:
    """A small mixed workload: lengths uniform in the ranges, one arrival every
    ``gap_steps`` steps (``random.Random(seed)``, so the same everywhere)."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    rng = random.Random(seed)
    return [WorkItem(rng.randint(*prompt_range), rng.randint(*output_range), i * gap_steps)
            for i in range(num_requests)]


def _prompt(n: int, i: int) -> list[int]:
    """``n`` printable byte ids, different per request (the tokens do not matter here)."""
    return [32 + (7 * i + 3 * j) % 95 for j in range(n)]


def step_timeline(model, tokenizer, workload: list, max_steps: int = 5000,
                  **engine_kwargs) -> list[TimelineRow]:
    """Run ``workload`` on a fresh ``LLMEngine(model, tokenizer, clock=StepClock(),
    **engine_kwargs)`` (greedy), adding each request at its arrival step; one row per request.

    Raises ``RuntimeError`` if it has not finished after ``max_steps`` steps.
    """
    clock = StepClock()
    engine = LLMEngine(model, tokenizer, clock=clock, **engine_kwargs)
    pending = sorted(enumerate(workload), key=lambda x: (x[1].arrival_step, x[0]))
    finished, padded = {}, {}
    for step in range(max_steps):
        clock.now = float(step)
        while pending and pending[0][1].arrival_step <= step:
            i, w = pending.pop(0)
            engine.add_request(_prompt(w.prompt_len, i),
                               SamplingParams(max_tokens=w.max_tokens, temperature=0.0),
                               request_id=str(i), arrival_time=float(w.arrival_step))
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        for seq in engine.last_scheduled.padding:
            padded.setdefault(seq.request.request_id, []).append(float(step))
        if not pending and not engine.has_unfinished_requests():
            break
    else:
        raise RuntimeError(f"workload not finished after {max_steps} steps")
    rows = []
    for i, w in enumerate(workload):
        m = finished[str(i)].metrics
        rows.append(TimelineRow(str(i), w.prompt_len, w.max_tokens, m.arrival_time,
                                m.first_scheduled_time, m.first_token_time + 1,
                                m.finished_time + 1, tuple(m.token_times),
                                tuple(padded.get(str(i), ()))))
    return rows


def timeline_summary(rows: list[TimelineRow]) -> dict:
    """Makespan and mean queueing / TTFT / end-to-end, in steps; the padding row-steps
    (Σ over requests of their padding steps: computed, thrown away)."""
    n = len(rows)
    return {"num_requests": n,
            "makespan_steps": max(r.finished_out for r in rows) - min(r.arrival for r in rows),
            "mean_queued_steps": sum(r.queued for r in rows) / n,
            "mean_ttft_steps": sum(r.ttft for r in rows) / n,
            "mean_e2e_steps": sum(r.e2e for r in rows) / n,
            "padding_row_steps": sum(len(r.padding_steps) for r in rows)}
