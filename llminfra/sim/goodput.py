"""Goodput: the requests per second that meet their latency targets, from timestamps.

Throughput counts every token; a user counts only answers that came fast enough. DistServe
(Zhong et al. 2024, arXiv:2401.09670, §2) measures a serving system by its **goodput**: the
request rate at which a given share of requests meets both a time-to-first-token (TTFT) and a
time-per-output-token (TPOT) service-level objective. Here, from one run's timestamps:

* ``TTFT = first_token_s − arrival_s``;
* ``TPOT = (finish_s − first_token_s) / (output_tokens − 1)`` — the mean gap between output
  tokens after the first (a one-token answer has no gap: it meets any TPOT target);
* a request is *good* when ``TTFT ≤ ttft_slo_s`` and ``TPOT ≤ tpot_slo_s``;
* ``goodput = good requests / duration_s`` (duration: first arrival to last finish unless
  given).

Taught in chapter 11 (prefill/decode disaggregation is judged by it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from llminfra.engine.metrics import tpot, ttft
from llminfra.validate import positive_int


@dataclass(frozen=True)
class RequestTimes:
    """One request's timestamps (seconds on one clock) and its number of output tokens."""

    arrival_s: float
    first_token_s: float
    finish_s: float
    output_tokens: int

    def __post_init__(self):
        for name in ("arrival_s", "first_token_s", "finish_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number of seconds, got {v!r}")
        positive_int("output_tokens", self.output_tokens)
        if not self.arrival_s <= self.first_token_s <= self.finish_s:
            raise ValueError(f"timestamps must satisfy arrival_s <= first_token_s <= finish_s, "
                             f"got {self.arrival_s}, {self.first_token_s}, {self.finish_s}")

    @property
    def ttft_s(self) -> float:
        """:func:`llminfra.engine.metrics.ttft`."""
        return ttft(self.arrival_s, self.first_token_s)

    @property
    def tpot_s(self) -> float | None:
        """:func:`llminfra.engine.metrics.tpot`: None for a one-token answer."""
        return tpot(self.first_token_s, self.finish_s, self.output_tokens)


def _times(requests: Iterable) -> list[RequestTimes]:
    out = []
    for r in requests:
        out.append(r if isinstance(r, RequestTimes) else RequestTimes(*r))
    return out


def within_slo(ttft_s: float, tpot_s: float | None, ttft_slo_s: float,
               tpot_slo_s: float) -> bool:
    """The one rule: ``TTFT ≤ ttft_slo_s`` and ``TPOT ≤ tpot_slo_s`` (a TPOT of None — one
    output token, no gap — meets any TPOT target)."""
    return ttft_s <= ttft_slo_s and (tpot_s is None or tpot_s <= tpot_slo_s)


def goodput(requests: Iterable, ttft_slo_s: float, tpot_slo_s: float,
            duration_s: float | None = None) -> float:
    """Requests per second that meet both SLOs. ``requests``: :class:`RequestTimes` or tuples
    ``(arrival_s, first_token_s, finish_s, output_tokens)``.

    ``goodput([(0, 0.1, 1.0, 10), (0, 0.5, 1.0, 10)], ttft_slo_s=0.2, tpot_slo_s=0.2) == 1.0``
    (the second misses its TTFT; the run lasts 1 s)."""
    for name, v in (("ttft_slo_s", ttft_slo_s), ("tpot_slo_s", tpot_slo_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
    rs = _times(requests)
    if not rs:
        return 0.0
    if duration_s is None:
        duration_s = max(r.finish_s for r in rs) - min(r.arrival_s for r in rs)
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    good = sum(within_slo(r.ttft_s, r.tpot_s, ttft_slo_s, tpot_slo_s) for r in rs)
    return good / duration_s
