"""What a service must do, and the traffic that follows from it.

:class:`ServiceRequirements` holds source 000's first step ("write the requirements down": requests a
day, input and output tokens per request, the TTFT you can accept, whether data may leave the
company) plus a monthly budget, the model and its precision, and how spiky the traffic is.
:func:`traffic` turns them into rates and, by Little's law (L = λ · W; Little, 1961), the
number of requests in flight at the busiest time — what the KV cache must hold.

Taught in chapter 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llminfra.validate import positive_int
from llminfra.specs import get_model

SECONDS_PER_DAY = 86_400


def _positive(name: str, value, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ServiceRequirements:
    """A service's requirements.

    ``requests_per_day``; ``input_tokens`` / ``output_tokens`` per request (means);
    ``ttft_target_s`` (time to first token you accept) and ``tpot_target_s`` (time per output
    token; 0.1 s ≈ 10 tokens/s, faster than people read); ``data_may_leave`` (may prompts go to
    an outside API?); ``budget_usd_per_month``; ``model`` (a preset of :mod:`llminfra.specs`) and
    its weight ``dtype``; ``peak_to_mean`` = busiest hour's rate / the day's mean rate.
    """

    requests_per_day: float
    input_tokens: int
    output_tokens: int
    ttft_target_s: float = 2.0
    tpot_target_s: float = 0.1
    data_may_leave: bool = True
    budget_usd_per_month: float = 10_000.0
    model: str = "llama-3-8b"
    dtype: str = "bf16"
    peak_to_mean: float = 3.0

    def __post_init__(self):
        _positive("requests_per_day", self.requests_per_day)
        for name in ("input_tokens", "output_tokens"):
            positive_int(name, getattr(self, name))
        _positive("ttft_target_s", self.ttft_target_s)
        _positive("tpot_target_s", self.tpot_target_s)
        _positive("budget_usd_per_month", self.budget_usd_per_month, allow_zero=True)
        if _positive("peak_to_mean", self.peak_to_mean) < 1:
            raise ValueError(f"peak_to_mean must be >= 1 (the peak is at least the mean), got "
                             f"{self.peak_to_mean!r}")
        if not isinstance(self.data_may_leave, bool):
            raise ValueError(f"data_may_leave must be True or False, got {self.data_may_leave!r}")
        get_model(self.model)  # KeyError naming the presets if unknown

    @property
    def context_tokens(self) -> int:
        """Tokens a request holds in the KV cache when it finishes: input + output."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class Traffic:
    """Rates that follow from :class:`ServiceRequirements` (all per second unless named)."""

    mean_requests_per_s: float
    peak_requests_per_s: float
    peak_output_tokens_per_s: float
    mean_output_tokens_per_s: float
    request_duration_s: float
    peak_concurrency: int


def traffic(req: ServiceRequirements, ttft_s: float | None = None, tpot_s: float | None = None) -> Traffic:
    """Mean and peak rates, and requests in flight at the peak by Little's law.

    A request lasts ``W = TTFT + output_tokens · TPOT`` (the targets unless measured values are
    given); at the peak rate ``λ = requests_per_day / 86,400 · peak_to_mean`` there are
    ``L = ceil(λ · W)`` requests in flight.

    Worked example: 100,000 requests a day, peak 3×, 500 output tokens at TPOT 0.1 s, TTFT 2 s:
    λ = 3.472/s, W = 52 s, L = ceil(180.6) = 181 requests in flight; peak output
    3.472 · 500 = 1,736 tokens/s.
    """
    ttft = req.ttft_target_s if ttft_s is None else _positive("ttft_s", ttft_s)
    tpot = req.tpot_target_s if tpot_s is None else _positive("tpot_s", tpot_s)
    mean = req.requests_per_day / SECONDS_PER_DAY
    peak = mean * req.peak_to_mean
    duration = ttft + req.output_tokens * tpot
    return Traffic(mean, peak, peak * req.output_tokens, mean * req.output_tokens, duration,
                   max(1, math.ceil(peak * duration - 1e-9)))
