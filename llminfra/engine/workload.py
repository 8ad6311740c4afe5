"""A seeded serving workload: request lengths from the chapter-04 trace, Poisson arrivals.

Lengths come from :func:`llminfra.kvcache.trace.request_trace` (log-normal with the ShareGPT /
Alpaca means of Kwon et al. 2023, arXiv:2309.06180, Fig. 11), capped to the served model's
context. Arrivals form a Poisson process of ``rate_per_s`` requests per second: gaps are
exponential with mean 1 / rate (the arrival model of vLLM's ``benchmark_serving`` and of the
paper's §6.1); ``rate_per_s = inf`` puts every request at t = 0 (an offline batch). The same
list drives the real engine (:mod:`llminfra.bench.serving`) and the simulator. Chapter 05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llminfra.kvcache.trace import request_trace


@dataclass(frozen=True)
class WorkloadRequest:
    """One request: arrival time (s from the start), prompt and output lengths in tokens."""

    arrival_time_s: float
    prompt_len: int
    output_len: int


def serving_workload(num_requests: int, generator: torch.Generator, *,
                     rate_per_s: float = math.inf, workload: str = "sharegpt",
                     max_seq_len: int = 2048, scale: float = 1.0) -> list[WorkloadRequest]:
    """``num_requests`` requests with trace lengths (times ``scale``, at least 1 token, prompt
    + output <= ``max_seq_len``) arriving as a Poisson process of ``rate_per_s``."""
    if not (rate_per_s > 0):
        raise ValueError(f"rate_per_s must be > 0 (math.inf: all at once), got {rate_per_s!r}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    trace = request_trace(num_requests, generator, workload,
                          max_seq_len=max(2, int(max_seq_len / scale)))
    if math.isinf(rate_per_s):
        times = [0.0] * num_requests
    else:
        gaps = torch.empty(num_requests, dtype=torch.float64).exponential_(
            rate_per_s, generator=generator)
        times = (gaps.cumsum(0) - gaps[0]).tolist()
    out = []
    for t, r in zip(times, trace):
        p = max(1, min(max_seq_len - 1, round(r.prompt_len * scale)))
        o = max(1, min(max_seq_len - p, round(r.output_len * scale)))
        out.append(WorkloadRequest(float(t), p, o))
    return out
