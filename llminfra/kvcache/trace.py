"""Request traces with realistic prompt and output lengths, drawn from an explicit generator.

Where the lengths come from: Kwon et al., 2023 (vLLM, arXiv:2309.06180), §6.1 and Fig. 11,
report the length distributions of the two workloads they serve — **ShareGPT** (real ChatGPT
conversations: mean input 161.31 tokens, mean output 337.99 tokens) and **Alpaca** (GPT-3.5
generated instructions: mean input 19.31, mean output 58.45). The datasets themselves are not
shipped here (no downloads), so we draw each length from a log-normal distribution with exactly
those means. The *spreads* (``sigma`` below) are our assumption, chosen to give long right tails
like the histograms of Fig. 11; they are not fitted to the data. Lengths are rounded, at least 1,
and a request's prompt + output is capped at ``max_seq_len`` = 2048 (the context of OPT-13B, the
model of the paper's Fig. 2 measurement).

Log-normal with mean m: ``X = exp(μ + σ Z)``, Z ~ N(0, 1), ``μ = ln m - σ²/2``.

Taught in chapter 04.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llminfra.validate import positive_int

#: name -> (mean prompt tokens, mean output tokens, sigma prompt, sigma output)
#: means: vLLM paper Fig. 11; sigmas: our assumption (see module docstring)
WORKLOADS = {
    "sharegpt": (161.31, 337.99, 1.0, 0.8),
    "alpaca": (19.31, 58.45, 0.6, 0.8),
}

#: context length of OPT-13B, the model of the vLLM paper's Fig. 2
DEFAULT_MAX_SEQ_LEN = 2048


@dataclass(frozen=True)
class Request:
    """One request of a trace: ``prompt_len`` tokens in, ``output_len`` tokens out."""

    prompt_len: int
    output_len: int

    @property
    def total_len(self) -> int:
        """Tokens whose K/V the request holds when it finishes: prompt + output."""
        return self.prompt_len + self.output_len


def _lognormal(n: int, mean: float, sigma: float, generator: torch.Generator) -> torch.Tensor:
    mu = math.log(mean) - sigma ** 2 / 2
    z = torch.randn(n, generator=generator, dtype=torch.float64)
    return torch.exp(mu + sigma * z)


def request_trace(num_requests: int, generator: torch.Generator, workload: str = "sharegpt",
                  max_seq_len: int = DEFAULT_MAX_SEQ_LEN) -> list[Request]:
    """``num_requests`` requests with log-normal lengths matching ``workload``'s means.

    ``workload`` is ``"sharegpt"`` or ``"alpaca"`` (:data:`WORKLOADS`). Prompts are capped at
    ``max_seq_len // 2`` and outputs at what is left, so every request fits ``max_seq_len``.
    """
    if workload not in WORKLOADS:
        raise KeyError(f"unknown workload {workload!r}; choose one of {sorted(WORKLOADS)}")
    positive_int("num_requests", num_requests)
    if max_seq_len < 2:
        raise ValueError(f"max_seq_len must be >= 2, got {max_seq_len}")
    m_in, m_out, s_in, s_out = WORKLOADS[workload]
    p = _lognormal(num_requests, m_in, s_in, generator).round().clamp(1, max_seq_len // 2)
    o = _lognormal(num_requests, m_out, s_out, generator).round().clamp(min=1)
    o = torch.minimum(o, max_seq_len - p)
    return [Request(int(a), int(b)) for a, b in zip(p.tolist(), o.tolist())]


def trace_summary(trace: list[Request]) -> dict:
    """Mean / median / max of prompt and output lengths (to set beside the paper's means)."""
    p = torch.tensor([r.prompt_len for r in trace], dtype=torch.float64)
    o = torch.tensor([r.output_len for r in trace], dtype=torch.float64)
    return {"num_requests": len(trace),
            "prompt_mean": float(p.mean()), "prompt_median": float(p.median()),
            "prompt_max": int(p.max()), "output_mean": float(o.mean()),
            "output_median": float(o.median()), "output_max": int(o.max())}
