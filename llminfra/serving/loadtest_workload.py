"""What a load test sends and when: request lengths, arrival times and prompt texts.

Arrivals (the open-loop regimes of vLLM's ``vllm bench serve``, ``get_request`` in
``vllm/benchmarks/serve.py``, github.com/vllm-project/vllm, read 2026-12-03):

* Poisson — exponential gaps with mean 1/rate (Kwon et al., 2023, arXiv:2309.06180, §6.1);
* ``burstiness`` b ≠ 1 — gamma gaps of shape b and scale 1/(rate·b): the mean gap stays 1/rate,
  the squared coefficient of variation is 1/b (b < 1 burstier, b > 1 more even, b = 1 is
  Poisson). vLLM also rescales the drawn schedule to end at exactly n/rate; we do not (the mean
  gap is 1/rate in expectation, as for our Poisson arrivals);
* fixed gaps of exactly 1/rate (``arrivals="fixed"``);
* **ramp-up** (vLLM's ``--ramp-up-strategy``, ``--ramp-up-start-rps``, ``--ramp-up-end-rps``):
  the rate changes with the request's index i of n, not with the clock: progress p = i/(n − 1),
  linear r_i = r_start + (r_end − r_start)·p, exponential r_i = r_start·(r_end/r_start)^p; the
  gap before request i is drawn at r_i (Poisson, gamma of shape ``burstiness``, or exactly
  1/r_i with ``arrivals="fixed"``). Not rescaled, as in vLLM. :class:`RampUp`.

Lengths come from :func:`llminfra.sim.workload.serving_workload` (the chapter-04 trace). A
**shared-prefix** workload (vLLM's "prefix repetition" dataset idea) puts one of
``num_prefixes`` shared prefixes of ``prefix_tokens`` tokens before each request's own prompt,
the prefix drawn uniformly per request: a server with prefix caching skips their prefill.

Taught in chapter 05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llminfra.sim.workload import WorkloadRequest, serving_workload

#: the longest open-loop schedule a run accepts: (requests − 1) / rate seconds, one day
MAX_SCHEDULE_S = 86_400.0
#: requests in one run (each is a record in memory and a line of the JSON file)
MAX_REQUESTS = 1_000_000
#: prompt characters per token: about 1 for a byte model, about 4 for a BPE model's English
MAX_CHARS_PER_TOKEN = 100.0
#: shared prefixes in a shared-prefix workload
MAX_PREFIXES = 10_000
#: how the rate of a ramp-up grows with the request index (vLLM's ``--ramp-up-strategy``)
RAMP_UP_STRATEGIES = ("linear", "exponential")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_burstiness(burstiness) -> None:
    """``ValueError`` unless ``burstiness`` is a finite number > 0 (the gamma shape)."""
    if not _is_number(burstiness) or not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0 (1 = Poisson, < 1 burstier, "
                         f"> 1 more even), got {burstiness!r}")


@dataclass(frozen=True)
class RampUp:
    """An open loop whose rate goes from ``start_rps`` to ``end_rps`` over the run, by request
    index (vLLM's ``--ramp-up-strategy {linear,exponential}``, ``--ramp-up-start-rps``,
    ``--ramp-up-end-rps``; ``_get_current_request_rate`` and ``get_request`` in
    ``vllm/benchmarks/serve.py``). Request i of n has the rate

        p = i / max(n − 1, 1),   linear: r_i = r_start + (r_end − r_start)·p,
                                 exponential: r_i = r_start·(r_end / r_start)^p,

    so r_0 = r_start and r_(n−1) = r_end; the exponential spends more of the requests at low
    rates (its middle request has √(r_start·r_end), the linear one the mean). Rates are
    finite numbers > 0 with ``start_rps ≤ end_rps`` (vLLM refuses a start above the end and a
    rate ≤ 0; it takes whole numbers, this takes any). Taught in chapter 05."""

    strategy: str
    start_rps: float
    end_rps: float

    def __post_init__(self):
        if self.strategy not in RAMP_UP_STRATEGIES:
            raise ValueError(f"ramp-up strategy must be one of {', '.join(RAMP_UP_STRATEGIES)}"
                             f", got {self.strategy!r}")
        for name in ("start_rps", "end_rps"):
            value = getattr(self, name)
            if not _is_number(value) or not (value > 0 and math.isfinite(value)):
                raise ValueError(f"ramp-up {name} must be a finite number of requests per "
                                 f"second > 0, got {value!r}")
        if self.start_rps > self.end_rps:
            raise ValueError(f"ramp-up start_rps {self.start_rps:g} is above end_rps "
                             f"{self.end_rps:g}: the rate ramps up (start_rps <= end_rps)")

    def rates(self, num_requests: int) -> list[float]:
        """r_i (requests/s) of requests 0..n − 1, by the rule of the class docstring."""
        lo, hi, last = self.start_rps, self.end_rps, max(num_requests - 1, 1)
        if self.strategy == "linear":
            return [lo + (hi - lo) * (i / last) for i in range(num_requests)]
        return [lo * (hi / lo) ** (i / last) for i in range(num_requests)]

    def span_s(self, num_requests: int) -> float:
        """The schedule's mean length (s): Σ 1/r_i over i = 1..n − 1 (request 0 at t = 0)."""
        return sum(1 / r for r in self.rates(num_requests)[1:])


def check_request_settings(num_requests: int, seed: int, *, rate: float | None = None,
                           arrivals: str = "poisson",
                           max_output_tokens: int | None = None,
                           burstiness: float = 1.0, ramp_up: RampUp | None = None) -> None:
    """``ValueError`` naming the setting when a run's requests cannot be drawn sensibly:
    ``num_requests`` in 1..:data:`MAX_REQUESTS`, ``seed`` in 0..2**64 − 1 (a
    ``torch.Generator`` seed), ``arrivals`` ``"poisson"`` or ``"fixed"``, ``rate`` a finite
    number > 0 whose schedule, ``(num_requests − 1) / rate`` seconds on average, fits in
    :data:`MAX_SCHEDULE_S`, ``ramp_up`` a :class:`RampUp` (in place of ``rate``) whose
    schedule, :meth:`RampUp.span_s`, fits too, ``max_output_tokens`` None or an int >= 1,
    ``burstiness`` a finite number > 0 (other than 1 only with Poisson arrivals at a rate or a
    ramp-up)."""
    if not _is_int(num_requests) or not 1 <= num_requests <= MAX_REQUESTS:
        raise ValueError(f"num_requests must be an int in 1..{MAX_REQUESTS:,}, "
                         f"got {num_requests!r}")
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in 0..2**64 - 1, got {seed!r}")
    if arrivals not in ("poisson", "fixed"):
        raise ValueError(f"arrivals must be 'poisson' or 'fixed', got {arrivals!r}")
    check_burstiness(burstiness)
    if burstiness != 1 and ((rate is None and ramp_up is None) or arrivals != "poisson"):
        raise ValueError(f"burstiness {burstiness!r} shapes the gaps of Poisson arrivals at a "
                         "rate: give a rate (or a ramp-up) with arrivals='poisson', or leave "
                         "burstiness at 1")
    if ramp_up is not None:
        if not isinstance(ramp_up, RampUp):
            raise ValueError(f"ramp_up must be a RampUp(strategy, start_rps, end_rps), "
                             f"got {ramp_up!r}")
        if rate is not None:
            raise ValueError("ramp_up sets the rate (from start_rps to end_rps): give it "
                             f"without a rate, got rate {rate!r}")
        span_s = ramp_up.span_s(num_requests)
        if span_s > MAX_SCHEDULE_S:
            raise ValueError(f"a {ramp_up.strategy} ramp-up from {ramp_up.start_rps:g} to "
                             f"{ramp_up.end_rps:g} requests/s spreads {num_requests} requests "
                             f"over about {span_s:.3g} s, beyond the {MAX_SCHEDULE_S:,.0f} s "
                             "(one day) a load test may last: raise the rates or send fewer "
                             "requests")
    if rate is not None:
        if not _is_number(rate) or not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a finite number of requests per second > 0, "
                             f"got {rate!r}")
        span_s = (num_requests - 1) / rate
        if span_s > MAX_SCHEDULE_S:
            raise ValueError(f"rate {rate:g} requests/s spreads {num_requests} requests over "
                             f"about {span_s:.3g} s, beyond the {MAX_SCHEDULE_S:,.0f} s (one "
                             "day) a load test may last: raise the rate or send fewer requests")
    if max_output_tokens is not None and (not _is_int(max_output_tokens)
                                          or max_output_tokens < 1):
        raise ValueError(f"max_output_tokens must be None or an int >= 1, "
                         f"got {max_output_tokens!r}")


def check_prefix_settings(prefix_tokens: int, num_prefixes: int, max_model_len: int) -> None:
    """``ValueError`` unless ``prefix_tokens`` is an int >= 0 leaving at least 2 tokens of
    ``max_model_len`` (a prompt token and an output token) and ``num_prefixes`` an int in
    1..:data:`MAX_PREFIXES`."""
    if not _is_int(prefix_tokens) or prefix_tokens < 0:
        raise ValueError(f"prefix_tokens must be an int >= 0, got {prefix_tokens!r}")
    if prefix_tokens and prefix_tokens > max_model_len - 2:
        raise ValueError(f"prefix_tokens {prefix_tokens} leaves no room in max_model_len "
                         f"{max_model_len}: at most {max_model_len - 2} (a prompt token and "
                         "an output token must follow)")
    if not _is_int(num_prefixes) or not 1 <= num_prefixes <= MAX_PREFIXES:
        raise ValueError(f"num_prefixes must be an int in 1..{MAX_PREFIXES:,}, "
                         f"got {num_prefixes!r}")


def gamma_arrivals(num_requests: int, rate_per_s, burstiness: float,
                   generator: torch.Generator) -> list[float]:
    """Arrival times (s), the first at t = 0, with gamma gaps of shape ``burstiness`` and
    scale 1/(rate·burstiness): mean gap 1/rate, variance 1/(rate²·burstiness). Shape 1 is the
    exponential (Poisson arrivals); vLLM's ``--burstiness`` (``vllm/benchmarks/serve.py``).
    ``rate_per_s`` is one rate, or one per request (the gap before request i drawn at r_i: a
    ramp-up, :func:`ramp_up_arrivals`)."""
    check_burstiness(burstiness)
    rates = list(rate_per_s) if isinstance(rate_per_s, (list, tuple)) else [rate_per_s]
    if not all(_is_number(r) and r > 0 and math.isfinite(r) for r in rates):
        raise ValueError(f"rate_per_s must be a finite number > 0 (or one each), "
                         f"got {rate_per_s!r}")
    shape = torch.full((num_requests,), float(burstiness), dtype=torch.float64)
    rate = (torch.tensor(rates, dtype=torch.float64) if len(rates) > 1 else rates[0])
    # torch's seeded gamma sampler (torch.distributions.Gamma takes no generator)
    gaps = torch._standard_gamma(shape, generator=generator) / (rate * burstiness)
    return (gaps.cumsum(0) - gaps[0]).tolist()


def ramp_up_arrivals(num_requests: int, ramp_up: RampUp, generator: torch.Generator, *,
                     arrivals: str = "poisson", burstiness: float = 1.0) -> list[float]:
    """Arrival times (s) of a ramp-up, the first at t = 0: t_i = t_(i−1) + gap_i with gap_i
    drawn at request i's rate r_i (:meth:`RampUp.rates`) by :func:`gamma_arrivals`, or
    exactly 1/r_i with ``arrivals="fixed"``. With start_rps = end_rps it is
    :func:`gamma_arrivals` at that rate, draw for draw. vLLM's ``get_request`` with
    ``--ramp-up-strategy``."""
    if arrivals not in ("poisson", "fixed"):
        raise ValueError(f"arrivals must be 'poisson' or 'fixed', got {arrivals!r}")
    rates = ramp_up.rates(num_requests)
    if arrivals == "poisson":
        return gamma_arrivals(num_requests, rates, burstiness, generator)
    check_burstiness(burstiness)
    gaps = 1 / torch.tensor(rates, dtype=torch.float64)
    return (gaps.cumsum(0) - gaps[0]).tolist()


def loadtest_requests(num_requests: int, seed: int, max_model_len: int, *,
                      rate: float | None = None, arrivals: str = "poisson",
                      workload_name: str = "sharegpt",
                      max_output_tokens: int | None = None, burstiness: float = 1.0,
                      prefix_tokens: int = 0,
                      ramp_up: RampUp | None = None) -> list[WorkloadRequest]:
    """The requests of a run: :func:`llminfra.sim.workload.serving_workload` (trace lengths
    that fit ``max_model_len``; Poisson arrivals at ``rate``, or all at t = 0 without a rate),
    with ``arrivals="fixed"`` gaps of exactly 1/rate, gamma gaps when ``burstiness`` ≠ 1
    (:func:`gamma_arrivals`, drawn after the lengths: the lengths do not change), a ramp-up's
    arrivals in place of a rate (:func:`ramp_up_arrivals`, also drawn after the lengths),
    outputs capped at ``max_output_tokens``, and ``prefix_tokens`` shared-prefix tokens counted
    in each ``prompt_len`` (the trace then fits ``max_model_len − prefix_tokens``)."""
    check_request_settings(num_requests, seed, rate=rate, arrivals=arrivals,
                           max_output_tokens=max_output_tokens, burstiness=burstiness,
                           ramp_up=ramp_up)
    check_prefix_settings(prefix_tokens, 1, max_model_len)
    g = torch.Generator().manual_seed(seed)
    bursty = burstiness != 1 or ramp_up is not None        # arrivals drawn after the lengths
    reqs = serving_workload(num_requests, g, rate_per_s=math.inf if bursty else rate or math.inf,
                            workload=workload_name, max_seq_len=max_model_len - prefix_tokens)
    times = [r.arrival_time_s for r in reqs]
    if ramp_up is not None:
        times = ramp_up_arrivals(num_requests, ramp_up, g, arrivals=arrivals,
                                 burstiness=burstiness)
    elif bursty:
        times = gamma_arrivals(num_requests, rate, burstiness, g)
    elif rate and arrivals == "fixed":
        times = [i / rate for i in range(num_requests)]
    return [WorkloadRequest(t, prefix_tokens + r.prompt_len,
                            r.output_len if max_output_tokens is None
                            else max(1, min(r.output_len, max_output_tokens)))
            for t, r in zip(times, reqs)]


def shared_prefix_ids(num_requests: int, num_prefixes: int, seed: int) -> list[int]:
    """Which of the ``num_prefixes`` shared prefixes each request starts with: uniform, from a
    generator seeded ``seed`` (its own stream: lengths and arrivals do not change)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(num_prefixes, (num_requests,), generator=g).tolist()


def _corpus_text() -> str:
    from llminfra.model import heldout_tokens
    return bytes(b for b in heldout_tokens(8192).tolist() if 32 <= b < 127 or b == 10).decode()


def _cut(text: str, start: int, n_chars: int) -> str:
    start %= max(1, len(text) - n_chars)
    return (text * (2 + n_chars // len(text)))[start:start + n_chars]


def prompt_texts(lengths: list[int], chars_per_token: float = 1.0, *,
                 prefix_tokens: int = 0, prefix_ids: list[int] | None = None) -> list[str]:
    """Prompts cut from the held-out corpus (ASCII-only, so 1 char = 1 byte = 1 tiny token).
    With ``prefix_tokens`` > 0, prompt i is shared prefix ``prefix_ids[i]`` (the same text for
    the same id) followed by ``lengths[i] − prefix_tokens`` tokens of its own."""
    text = _corpus_text()
    n_prefix = int(round(prefix_tokens * chars_per_token)) if prefix_tokens else 0
    out = []
    for i, n in enumerate(lengths):
        n_chars = max(1, int(round((n - prefix_tokens) * chars_per_token)))
        own = _cut(text, i * 997, n_chars)
        if n_prefix:
            own = _cut(text, 4099 + 7919 * prefix_ids[i], n_prefix) + own
        out.append(own)
    return out
