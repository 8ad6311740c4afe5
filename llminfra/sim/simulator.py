"""A discrete-event simulator of serving: the engine's own scheduler, a step-time model instead
of a model.

The simulator keeps a virtual clock. At each event it hands the waiting and running sequences to
the SAME :class:`~llminfra.engine.scheduler.Scheduler` the real engine uses (same policies,
chunked prefill, block accounts, preemption), asks a step-time model how long that step takes,
advances the clock, and credits one token to every sequence whose prompt is fully read — no
tensor of the model is touched. The padding rows of a static batch
(:mod:`llminfra.engine.static_batch`) are in the step's batch, so they cost time as they do in
the engine. The default step-time model is the roofline
(:func:`llminfra.calc.roofline.step_time_s`)::

    t_step = max(FLOPs / peak, bytes / bandwidth) + overhead_s   (+ tensor-parallel all-reduces)

where a step's batch is its list of ``(new_tokens, context_tokens)`` pairs. So a learner without
a GPU can ask what Llama-2-13B on an A100 or Llama-3-70B on 4 H100s would do under a load. The
``overhead_s`` term (launches, Python, sampling) is what the roofline cannot see; chapter 05
fits it against the real engine on this CPU (:func:`fit_overhead_s`) and shows the residual.
Taught in chapter 05.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass, field

from llminfra.calc.memory import kv_budget
from llminfra.calc.roofline import step_time_s
from llminfra.engine.metrics import RequestMetrics
from llminfra.engine.sampling_params import SamplingParams
from llminfra.engine.scheduler import Scheduler, SchedulerConfig
from llminfra.engine.sequence import Request, Sequence
from llminfra.kvcache.paged_cache import PagedKVCache
from llminfra.sim.workload import WorkloadRequest
from llminfra.specs.models import get_model

#: step_time_fn(batch) -> seconds, batch = [(new_tokens, context_tokens), ...]
StepTimeFn = Callable[[list[tuple[int, int]]], float]


def roofline_step_time(model, device, *, dtype: str = "bf16", tensor_parallel: int = 1,
                       overhead_s: float = 0.0, **kwargs) -> StepTimeFn:
    """``batch -> step_time_s(model, device, batch, ...)``: the roofline as a step-time model
    (``model`` a preset name or ModelSpec, ``device`` a GPU name or a Roofline)."""
    step_time_s(model, device, [(1, 1)], dtype=dtype, tensor_parallel=tensor_parallel,
                overhead_s=overhead_s, **kwargs)                 # fail early on bad names
    return lambda batch: step_time_s(model, device, batch, dtype=dtype,
                                     tensor_parallel=tensor_parallel, overhead_s=overhead_s,
                                     **kwargs)


def kv_blocks_for(model, gpu, *, dtype: str = "bf16", tensor_parallel: int = 1,
                  block_size: int = 16, context: int = 2048) -> int:
    """Blocks of ``block_size`` tokens that fit beside the weights on ``tensor_parallel`` GPUs
    (:func:`llminfra.calc.memory.kv_budget`, vLLM's sizing)."""
    budget = kv_budget(model, gpu, dtype, context=context, num_gpus=tensor_parallel)
    if budget.kv_budget_tokens < block_size:
        raise ValueError(f"{model} in {dtype} leaves no room for a KV block on "
                         f"{tensor_parallel} x {gpu}")
    return budget.kv_budget_tokens // block_size


@dataclass
class SimulationResult:
    """Per-request metrics, per-step ``(start_s, batch, step_s)`` and preemptions."""

    metrics: list[RequestMetrics]
    steps: list[tuple[float, list[tuple[int, int]], float]] = field(default_factory=list)
    num_preemptions: int = 0

    @property
    def duration_s(self) -> float:
        """First arrival to last finish."""
        return (max(m.finished_time for m in self.metrics)
                - min(m.arrival_time for m in self.metrics))


class Simulator:
    """Serve a list of :class:`~llminfra.sim.workload.WorkloadRequest` on a virtual clock.

    ``Simulator(step_time_fn, num_blocks=..., block_size=16, max_seq_len=..., policy=...,
    max_num_seqs=..., max_num_batched_tokens=..., enable_chunked_prefill=...,
    max_prefill_chunk_tokens=..., preemption=..., dynamic_window_s=...)``; ``run(requests)``.
    The KV pool is a :class:`~llminfra.kvcache.PagedKVCache` of one 1-value head: real block
    accounts, no real memory.
    """

    def __init__(self, step_time_fn: StepTimeFn, *, num_blocks: int, max_seq_len: int,
                 block_size: int = 16, **scheduler_kwargs):
        if not callable(step_time_fn):
            raise ValueError("step_time_fn must be callable: batch -> seconds")
        self.step_time_fn = step_time_fn
        self.config = SchedulerConfig(max_seq_len=max_seq_len, **scheduler_kwargs)
        self.num_blocks, self.block_size = num_blocks, block_size

    @classmethod
    def for_gpu(cls, model, gpu, *, tensor_parallel: int = 1, dtype: str = "bf16",
                overhead_s: float = 0.0, block_size: int = 16, max_seq_len: int | None = None,
                **scheduler_kwargs) -> "Simulator":
        """A simulator of ``model`` (preset name or ModelSpec) served on ``tensor_parallel``
        GPUs ``gpu``: roofline step time, KV pool from :func:`kv_blocks_for`, context from the
        model's ``max_positions`` unless given. E.g. ``Simulator.for_gpu("llama-3-70b", "h100",
        tensor_parallel=4, max_num_seqs=128, max_num_batched_tokens=4096)``."""
        spec = get_model(model)
        max_seq_len = max_seq_len or spec.max_positions
        blocks = kv_blocks_for(spec, gpu, dtype=dtype, tensor_parallel=tensor_parallel,
                               block_size=block_size, context=max_seq_len)
        step = roofline_step_time(spec, gpu, dtype=dtype, tensor_parallel=tensor_parallel,
                                  overhead_s=overhead_s)
        return cls(step, num_blocks=blocks, max_seq_len=max_seq_len, block_size=block_size,
                   **scheduler_kwargs)

    def run(self, requests: Seq[WorkloadRequest], max_steps: int = 10_000_000
            ) -> SimulationResult:
        """Serve every request; ``ValueError`` if one can never fit the pool or the context."""
        cache = PagedKVCache(1, 1, 1, self.num_blocks, self.block_size)
        sched = Scheduler(self.config, cache)
        pending = sorted(requests, key=lambda r: r.arrival_time_s)
        for r in pending:
            total = min(r.prompt_len + r.output_len, self.config.max_seq_len)
            if r.prompt_len > self.config.max_seq_len or \
                    -(-total // self.block_size) > self.num_blocks:
                raise ValueError(f"request {r} does not fit the context "
                                 f"{self.config.max_seq_len} or the pool of {self.num_blocks} "
                                 f"blocks of {self.block_size}")
        result, now, i = SimulationResult([]), 0.0, 0
        for _ in range(max_steps):
            while i < len(pending) and pending[i].arrival_time_s <= now:
                result.metrics.append(self._add(sched, pending[i], len(result.metrics)))
                i += 1
            if i == len(pending) and not sched.has_unfinished():
                break
            out = sched.schedule(now)
            if not out.scheduled:
                arrival = pending[i].arrival_time_s if i < len(pending) else None
                events = [t for t in (arrival, sched.batches.next_event_time(now))
                          if t is not None and t > now]
                if not events:
                    raise RuntimeError("the simulation is stuck: nothing can be scheduled")
                now = min(events)
                continue
            batch = self._batch(cache, out)
            cache.reserve_slots([s.cache_seq for s, _ in out.scheduled]
                                + [s.cache_seq for s in out.padding], [n for n, _ in batch])
            dt = float(self.step_time_fn(batch))
            result.steps.append((now, batch, dt))
            now += dt
            self._advance(sched, out, now)
        result.num_preemptions = sched.num_preemptions
        return result

    @staticmethod
    def _batch(cache: PagedKVCache, out) -> list[tuple[int, int]]:
        """The step's ``(new_tokens, context_tokens)`` pairs, as the engine's ``step_log``
        has them: the scheduled sequences, then one token for each padding row of a static
        batch (computed, so it costs time, though its token is thrown away)."""
        return ([(n, s.num_computed_tokens + n) for s, n in out.scheduled]
                + [(1, cache.seq_len(s.cache_seq) + 1) for s in out.padding])

    def _add(self, sched: Scheduler, r: WorkloadRequest, k: int) -> RequestMetrics:
        metrics = RequestMetrics(arrival_time=r.arrival_time_s)
        req = Request(str(k), None, [0] * r.prompt_len, SamplingParams(max_tokens=r.output_len),
                      metrics)
        req.seqs.append(Sequence(k, req, 0, [0] * r.prompt_len, r.output_len))
        sched.add(req.seqs[0])
        return metrics

    def _advance(self, sched: Scheduler, out, now: float) -> None:
        """The step is over at ``now``: every sequence that caught up gets a token (its
        value is of no interest here), and the scheduler writes the result as it does for
        the engine."""
        sampled = {}
        for seq, n in out.scheduled:
            if seq.request.metrics.first_scheduled_time is None:
                seq.request.metrics.first_scheduled_time = now
            if seq in out.caught:
                sampled[seq] = [0]
        for seq, got in sched.update_from_output(out, sampled).items():
            for _ in range(got):
                seq.request.metrics.record_token(now, seq.status.is_finished)


def fit_overhead_s(measured: Seq[tuple[list[tuple[int, int]], float]],
                   step_time_fn: StepTimeFn) -> dict:
    """Least-squares constant overhead: ô = mean(t_measured - t_roofline) over the steps, and
    the residual of the fitted model.

    ``measured`` holds ``(batch, seconds)`` of real engine steps; ``step_time_fn`` is the
    roofline with ``overhead_s = 0``. Returns ``overhead_s``, ``residual_rms_s`` (root mean
    square of t_measured - t_roofline - ô), ``relative_error_median`` (median of
    |residual| / t_measured), ``num_steps`` and the total measured and modelled seconds.
    """
    if not measured:
        raise ValueError("no measured steps to fit")
    base = [float(step_time_fn(b)) for b, _ in measured]
    t = [float(s) for _, s in measured]
    overhead = sum(x - y for x, y in zip(t, base)) / len(t)
    resid = [x - y - overhead for x, y in zip(t, base)]
    rel = sorted(abs(r) / x for r, x in zip(resid, t))
    return {"overhead_s": overhead, "num_steps": len(t),
            "residual_rms_s": math.sqrt(sum(r * r for r in resid) / len(resid)),
            "relative_error_median": rel[len(rel) // 2],
            "measured_total_s": sum(t), "model_total_s": sum(base) + overhead * len(t)}
