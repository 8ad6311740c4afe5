"""Step 2 of a plan, simulated: the service's peak traffic on the chosen GPUs, through the
serving engine's own scheduler (:class:`llminfra.sim.simulator.Simulator`).

Requests have the service's mean lengths and arrive as a Poisson process at its peak rate
(:func:`llminfra.sim.workload.workload_from_means`); each step takes the roofline time
(:func:`llminfra.calc.roofline.step_time_s`, the one step-time model of the course) divided by
the engine's ``efficiency`` — the same assumption :func:`~llminfra.planning.plan_deployment`
makes. The KV pool is what :func:`llminfra.calc.memory.kv_budget` leaves beside the weights.

Taught in chapter 10.
"""

from __future__ import annotations

import torch

from llminfra.engine.metrics import summarize
from llminfra.sim.simulator import Simulator, kv_blocks_for, roofline_step_time
from llminfra.sim.workload import workload_from_means
from llminfra.planning.plan import DEFAULT_EFFICIENCY
from llminfra.planning.requirements import ServiceRequirements, traffic

BLOCK_SIZE = 16


def simulate_peak(req: ServiceRequirements, gpu: str, *, tensor_parallel: int = 1,
                  num_requests: int = 300, seed: int = 0, policy: str = "continuous",
                  max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                  rate_per_s: float | None = None,
                  efficiency: float = DEFAULT_EFFICIENCY) -> dict:
    """Serve ``num_requests`` requests of ``req``'s lengths at its peak rate (or ``rate_per_s``)
    on one replica of ``tensor_parallel`` × ``gpu``; return :func:`llminfra.engine.summarize`'s
    dict plus ``num_preemptions``, ``num_blocks`` and ``rate_per_s``. Seeded: the same inputs
    give the same numbers."""
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    rate = traffic(req).peak_requests_per_s if rate_per_s is None else rate_per_s
    max_len = 2 * req.context_tokens
    work = workload_from_means(num_requests, torch.Generator().manual_seed(seed),
                               mean_prompt=req.input_tokens, mean_output=req.output_tokens,
                               rate_per_s=rate, max_seq_len=max_len)
    roof = roofline_step_time(req.model, gpu, dtype=req.dtype, tensor_parallel=tensor_parallel)
    blocks = kv_blocks_for(req.model, gpu, dtype=req.dtype, tensor_parallel=tensor_parallel,
                           block_size=BLOCK_SIZE, context=req.context_tokens)
    sim = Simulator(lambda batch: roof(batch) / efficiency, num_blocks=blocks,
                    max_seq_len=max_len, block_size=BLOCK_SIZE, policy=policy,
                    max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    result = sim.run(work)
    out = summarize(result.metrics)
    out.update(num_preemptions=result.num_preemptions, num_blocks=blocks, rate_per_s=rate)
    return out
