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
    times = poisson_arrivals(num_requests, rate_per_s, generator)
    out = []
    for t, r in zip(times, trace):
        p = max(1, min(max_seq_len - 1, round(r.prompt_len * scale)))
        o = max(1, min(max_seq_len - p, round(r.output_len * scale)))
        out.append(WorkloadRequest(float(t), p, o))
    return out


def poisson_arrivals(num_requests: int, rate_per_s: float, generator: torch.Generator) -> list[float]:
    """Arrival times (s) of a Poisson process of ``rate_per_s``: exponential gaps of mean
    1 / rate, the first request at t = 0; ``math.inf`` puts every request at t = 0."""
    if not (rate_per_s > 0):
        raise ValueError(f"rate_per_s must be > 0 (math.inf: all at once), got {rate_per_s!r}")
    if math.isinf(rate_per_s):
        return [0.0] * num_requests
    gaps = torch.empty(num_requests, dtype=torch.float64).exponential_(rate_per_s,
                                                                        generator=generator)
    return (gaps.cumsum(0) - gaps[0]).tolist()


def workload_from_means(num_requests: int, generator: torch.Generator, *, mean_prompt: float,
                        mean_output: float, rate_per_s: float = math.inf, sigma: float = 0.5,
                        max_seq_len: int = 8192) -> list[WorkloadRequest]:
    """Requests whose prompt and output lengths are log-normal with the given means (σ of the
    log = ``sigma``, an assumption: real traces are wider, see chapter 04), capped to
    ``max_seq_len``, arriving as a Poisson process. Chapter 10 plans with it: a service's
    stated mean lengths, at its peak rate.

    A log-normal with log-mean μ and log-σ s has mean exp(μ + s²/2), so μ = ln(mean) − s²/2.
    """
    for name, v in (("mean_prompt", mean_prompt), ("mean_output", mean_output)):
        if not v >= 1:
            raise ValueError(f"{name} must be >= 1 token, got {v!r}")
    if not sigma >= 0:
        raise ValueError(f"sigma must be >= 0, got {sigma!r}")
    times = poisson_arrivals(num_requests, rate_per_s, generator)
    out = []
    for t in times:
        p, o = (float(torch.empty((), dtype=torch.float64).log_normal_(
            math.log(m) - sigma ** 2 / 2, sigma, generator=generator)) if sigma > 0 else m
                for m in (mean_prompt, mean_output))
        p = max(1, min(max_seq_len - 1, round(p)))
        out.append(WorkloadRequest(float(t), p, max(1, min(max_seq_len - p, round(o)))))
    return out
