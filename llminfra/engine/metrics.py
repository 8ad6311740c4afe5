"""Per-request timestamps and the serving metrics made from them: TTFT, TPOT, latency, throughput.

For one request (all times in seconds on the engine's clock):

* TTFT (time to first token) = first_token_time - arrival_time — queueing plus prefill;
* TPOT (time per output token) = (last token time - first token time) / (tokens - 1), the mean
  gap between tokens after the first (vLLM's benchmark calls it TPOT, others ITL's mean);
* end-to-end latency = finished_time - arrival_time.

Over a run: percentiles p50 / p90 / p99 of each, and throughput = generated tokens / (last
finish - first arrival). These are the quantities vLLM's ``benchmark_serving`` reports (Kwon et
al. 2023, arXiv:2309.06180, §6 measure normalised latency; Agrawal et al. 2024, Sarathi-Serve,
arXiv:2403.02310, §2 define TTFT and TBT). Taught in chapter 05.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field


def ttft(arrival_s: float, first_token_s: float) -> float:
    """Time to first token: ``first_token_s − arrival_s`` (queueing plus prefill). The one
    definition: the engine, the simulators, the goodput rule and the benches derive theirs
    from it."""
    return first_token_s - arrival_s


def tpot(first_token_s: float, last_token_s: float, num_tokens: int) -> float | None:
    """Time per output token: ``(last_token_s − first_token_s) / (num_tokens − 1)``, the mean
    gap after the first token. A one-token answer has no gap: its TPOT is **None** (never 0, never
    NaN), and it meets any TPOT target (:func:`llminfra.sim.goodput.within_slo`).

    Worked by hand: first token at 0.5 s, last at 0.8 s, 3 tokens -> 0.3 / 2 = 0.15 s."""
    if num_tokens < 2:
        return None
    return (last_token_s - first_token_s) / (num_tokens - 1)


@dataclass
class RequestMetrics:
    """Timestamps of one request. ``token_times`` holds the time of every token of its first
    completion; ``num_output_tokens`` counts the tokens of all its completions;
    ``num_draft_tokens`` / ``num_accepted_tokens`` the speculative drafts proposed for it and
    kept; ``num_cached_prompt_tokens`` the prompt tokens its first step found in the prefix
    cache (not computed again)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    num_output_tokens: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_cached_prompt_tokens: int = 0

    def record_token(self, now: float, finished: bool, first_completion: bool = True) -> bool:
        """A token arrived at ``now``; ``finished``: the request is done. ``token_times`` gets
        one entry per token of the first completion (``first_completion``; a speculative step
        that keeps several tokens gives several entries at one time, so TPOT counts tokens, not
        steps). True if this made it finish (its ``finished_time`` set now)."""
        if first_completion:
            self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now
        self.num_output_tokens += 1
        if finished and self.finished_time is None:
            self.finished_time = now
            return True
        return False

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, or None before it."""
        return None if self.first_token_time is None else ttft(self.arrival_time,
                                                                self.first_token_time)

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (:func:`tpot`), or None with fewer
        than two."""
        if not self.token_times:
            return None
        return tpot(self.token_times[0], self.token_times[-1], len(self.token_times))

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency (arrival to finish), or None while running."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def queue_s(self) -> float | None:
        """Time waiting before the first step that included the request."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics
    (numpy's default): rank r = q/100 · (n - 1).

    Worked by hand: values [1, 2, 3, 4], q = 50 -> r = 1.5 -> 2.5; q = 99 -> r = 2.97 -> 3.97.
    """
    if not values:
        raise ValueError("percentile of an empty list; give at least one value")
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 <= q <= 100:
        raise ValueError(f"q must be a number in [0, 100], got {q!r}")
    xs = sorted(values)
    r = q / 100 * (len(xs) - 1)
    lo, hi = math.floor(r), math.ceil(r)
    return xs[lo] + (xs[hi] - xs[lo]) * (r - lo)


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": sum(values) / len(values), "p50": percentile(values, 50),
            "p90": percentile(values, 90), "p99": percentile(values, 99)}


def summarize(metrics: Sequence[RequestMetrics]) -> dict:
    """TTFT / TPOT / e2e statistics (mean, p50, p90, p99, seconds) and throughput of finished
    requests.

    Returns ``{"num_requests", "duration_s", "output_tokens", "throughput_tokens_per_s",
    "requests_per_s", "ttft_s": {...}, "tpot_s": {...}, "e2e_s": {...}}``; the duration runs
    from the first arrival to the last finish.
    """
    done = [m for m in metrics if m.finished_time is not None]
    if not done:
        raise ValueError("no finished request among the metrics given")
    start = min(m.arrival_time for m in done)
    end = max(m.finished_time for m in done)
    duration = end - start
    tokens = sum(m.num_output_tokens for m in done)
    return {
        "num_requests": len(done), "duration_s": duration, "output_tokens": tokens,
        "throughput_tokens_per_s": tokens / duration if duration > 0 else float("inf"),
        "requests_per_s": len(done) / duration if duration > 0 else float("inf"),
        "ttft_s": _stats([m.ttft_s for m in done if m.ttft_s is not None]),
        "tpot_s": _stats([m.tpot_s for m in done if m.tpot_s is not None]),
        "e2e_s": _stats([m.e2e_s for m in done]),
    }
