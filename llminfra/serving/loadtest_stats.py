"""A load test's numbers: per-request latencies, their statistics, goodput, vLLM's field names.

Per request (client clock): TTFT = first text chunk − send; **TPOT** = (last − first chunk) /
(tokens − 1), the mean gap after the first token; **ITL** (inter-token latency) = every gap
between consecutive streamed chunks, each a sample of its own; **E2EL** = done − send. Each is
summarised by mean, population std, p50 (median), p90, p95, p99 (linear interpolation, numpy's
default, as vLLM's ``np.percentile``).

**Goodput** (DistServe, Zhong et al. 2024, arXiv:2401.09670, §2; vLLM's ``--goodput``): the
completed requests per second that meet every SLO given, SLOs in milliseconds as
``ttft:500 tpot:50 e2el:3000``. TTFT and TPOT use the engine's one rule,
:func:`llminfra.sim.goodput.within_slo` (a one-token answer has no TPOT and meets any TPOT
target, as in vLLM, which counts its TPOT as 0); E2EL is added here: ``e2e ≤ e2el``.

vLLM's result names: :func:`vllm_fields` writes the keys of ``vllm bench serve --save-result``
(``benchmark()`` and ``calculate_metrics()`` in ``vllm/benchmarks/serve.py``,
github.com/vllm-project/vllm, read 2026-12-03; formerly ``benchmarks/benchmark_serving.py``):
``duration``, ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
``request_throughput``, ``request_goodput``, ``output_throughput``, ``total_token_throughput``
``{mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms`` (we add p90 and p95), and the peaks
``max_output_tokens_per_s`` and ``max_concurrent_requests``. Differences: a metric with no
sample is NaN (``null`` in JSON) where vLLM writes 0.

**Peaks** (vLLM's ``calculate_metrics``), over the completed requests: the run is cut into
1-second buckets from the earliest send, bucket k = ⌊t − t_send,min⌋, and each streamed chunk
counts one token in the bucket of its arrival; the peak output rate is the fullest bucket
(:func:`output_tokens_each_second`). The peak concurrency is the most requests in flight at
once, each in flight over [send, done): a sweep over the sends and finishes in time order, a
finish before a send at the same instant (:func:`peak_concurrent_requests`).

Taught in chapter 05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llminfra.engine.metrics import percentile, tpot, ttft
from llminfra.sim.goodput import within_slo

#: the SLO names of ``--goodput`` (vLLM's), each a limit in milliseconds
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
#: the percentiles every latency summary reports
QUANTILES = (50, 90, 95, 99)


@dataclass
class RequestRecord:
    """What one request measured (seconds on the client's clock, from the start of the run)."""

    index: int
    prompt_len: int
    max_tokens: int
    sent_s: float = math.nan
    first_token_s: float = math.nan
    done_s: float = math.nan
    output_tokens: int = 0
    chunk_times_s: list = field(default_factory=list)
    error: str | None = None

    @property
    def ttft_s(self) -> float:
        """:func:`llminfra.engine.metrics.ttft` from the moment the request was sent."""
        return ttft(self.sent_s, self.first_token_s)

    @property
    def tpot_s(self) -> float | None:
        """:func:`llminfra.engine.metrics.tpot`: None for a one-token answer."""
        return tpot(self.first_token_s, self.done_s, self.output_tokens)

    @property
    def itl_s(self) -> list[float]:
        """Gaps (s) between consecutive streamed chunks: len(chunks) − 1 of them."""
        t = self.chunk_times_s
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def e2e_s(self) -> float:
        return self.done_s - self.sent_s


def percentiles(values: list[float], qs=QUANTILES) -> dict:
    """``{"mean", "std", "p50", "p90", "p95", "p99"}`` of the finite values (None and NaN left
    out; NaN when there are
    none): std the population standard deviation √(Σ(x − mean)²/n), percentiles by the
    engine's :func:`~llminfra.engine.metrics.percentile` (linear interpolation)."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": math.nan, "std": math.nan, **{f"p{q}": math.nan for q in qs}}
    mean = sum(v) / len(v)
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / len(v))
    return {"mean": mean, "std": std, **{f"p{q}": percentile(v, q) for q in qs}}


def parse_goodput(slos) -> dict[str, float]:
    """``{"ttft": ms, ...}`` from vLLM's ``--goodput`` syntax: ``"ttft:500 tpot:50"``, a list
    ``["ttft:500", "e2el:3000"]`` or a dict. Names in :data:`GOODPUT_METRICS`, each once;
    limits finite numbers of milliseconds >= 0 (``ValueError`` naming the bad item)."""
    if isinstance(slos, dict):
        items = list(slos.items())
    else:
        parts = [p for item in ([slos] if isinstance(slos, str) else slos)
                 for p in str(item).split()]
        items = []
        for part in parts:
            name, sep, value = str(part).partition(":")
            if not sep:
                raise ValueError(f"goodput SLO {part!r} is not NAME:MILLISECONDS "
                                 f"(e.g. ttft:500), NAME one of {', '.join(GOODPUT_METRICS)}")
            items.append((name.strip(), value.strip()))
    if not items:
        raise ValueError("goodput needs at least one SLO NAME:MILLISECONDS, NAME one of "
                         f"{', '.join(GOODPUT_METRICS)} (e.g. ttft:500 tpot:50)")
    out = {}
    for name, value in items:
        if name not in GOODPUT_METRICS:
            raise ValueError(f"goodput SLO name {name!r} is unknown: allowed "
                             f"{', '.join(GOODPUT_METRICS)}")
        if name in out:
            raise ValueError(f"goodput SLO {name!r} is given twice")
        try:
            ms = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            ms = math.nan
        if not (math.isfinite(ms) and ms >= 0):
            raise ValueError(f"goodput SLO {name}:{value} must be a finite number of "
                             "milliseconds >= 0")
        out[name] = ms
    return out


def meets_slos(rec: RequestRecord, slos_ms: dict[str, float]) -> bool:
    """True when a completed request meets every SLO of ``slos_ms`` (:func:`parse_goodput`):
    TTFT and TPOT by :func:`~llminfra.sim.goodput.within_slo`, then ``e2e ≤ e2el``."""
    if not within_slo(rec.ttft_s, rec.tpot_s, slos_ms.get("ttft", math.inf) / 1e3,
                      slos_ms.get("tpot", math.inf) / 1e3):
        return False
    return rec.e2e_s <= slos_ms.get("e2el", math.inf) / 1e3


def _completed(records: list[RequestRecord]) -> list[RequestRecord]:
    """The requests without error whose send and finish times are known."""
    return [r for r in records if r.error is None and math.isfinite(r.sent_s)
            and math.isfinite(r.done_s)]


def output_tokens_each_second(records: list[RequestRecord]) -> list[int]:
    """Streamed chunks (one token each from a server that streams token by token) arriving in
    each 1-second bucket of the run, over the completed requests: t_0 the earliest send,
    bucket k = ⌊t − t_0⌋ for a chunk arriving at t, ⌈t_done,max − t_0⌉ + 1 buckets (vLLM's
    ``tokens_per_second`` in ``calculate_metrics``); ``[]`` when none completed."""
    done = _completed(records)
    if not done:
        return []
    t0 = min(r.sent_s for r in done)
    counts = [0] * (math.ceil(max(r.done_s for r in done) - t0) + 1)
    for r in done:
        for t in r.chunk_times_s:
            k = int(t - t0)                   # a chunk arrives after its send: t − t0 >= 0
            if 0 <= k < len(counts):
                counts[k] += 1
    return counts


def peak_output_tokens_per_s(records: list[RequestRecord]) -> float:
    """The fullest 1-second bucket of :func:`output_tokens_each_second` (tokens/s); 0.0 when
    no request completed (as vLLM's ``max_output_tokens_per_s``)."""
    return float(max(output_tokens_each_second(records), default=0))


def peak_concurrent_requests(records: list[RequestRecord]) -> int:
    """The most completed requests in flight at once, each over [send, done): events (send,
    +1) and (done, −1) in time order, a finish before a send at the same instant (half-open:
    one request ending as another starts is one in flight); 0 when none completed (vLLM's
    ``max_concurrent_requests``)."""
    done = _completed(records)
    events = sorted([(r.sent_s, 1) for r in done] + [(r.done_s, -1) for r in done])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def _ms(stats: dict, name: str) -> dict:
    return {f"mean_{name}_ms": 1e3 * stats["mean"], f"median_{name}_ms": 1e3 * stats["p50"],
            f"std_{name}_ms": 1e3 * stats["std"],
            **{f"p{q}_{name}_ms": 1e3 * stats[f"p{q}"] for q in QUANTILES if q != 50}}


def vllm_fields(summary: dict) -> dict:
    """The keys of ``vllm bench serve``'s result JSON (``vllm/benchmarks/serve.py``) from
    :func:`summarize`'s own: milliseconds, token counts of the completed requests, rates over
    the run's wall time; ``request_goodput`` None when no SLO was given (as vLLM)."""
    wall = summary["wall_s"]

    def per_s(x):
        return x / wall if wall > 0 else math.nan
    return {"duration": wall, "completed": summary["num_ok"],
            "failed": summary["num_errors"],
            "total_input_tokens": summary["prompt_tokens"],
            "total_output_tokens": summary["output_tokens"],
            "request_throughput": per_s(summary["num_ok"]),
            "request_goodput": summary["goodput_requests_per_s"],
            "output_throughput": per_s(summary["output_tokens"]),
            "total_token_throughput": per_s(summary["prompt_tokens"] + summary["output_tokens"]),
            **_ms(summary["ttft_s"], "ttft"), **_ms(summary["tpot_s"], "tpot"),
            **_ms(summary["itl_s"], "itl"), **_ms(summary["e2e_s"], "e2el"),
            "max_output_tokens_per_s": summary["peak_output_tokens_per_s"],
            "max_concurrent_requests": summary["peak_concurrent_requests"]}


def summarize(records: list[RequestRecord], wall_s: float,
              goodput: dict[str, float] | None = None) -> dict:
    """Latency statistics (s) of TTFT, TPOT, ITL (all gaps of all requests) and end-to-end;
    throughput (output tokens/s, requests/s); the peaks (:func:`peak_output_tokens_per_s`,
    :func:`peak_concurrent_requests`); errors; goodput (requests/s meeting every SLO of
    ``goodput``, :func:`parse_goodput`'s dict; None without one); and :func:`vllm_fields`."""
    ok = [r for r in records if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    good = None
    if goodput:
        good = sum(meets_slos(r, goodput) for r in ok) / wall_s if wall_s > 0 else math.nan
    s = {"num_requests": len(records), "num_ok": len(ok),
         "num_errors": len(records) - len(ok),
         "errors": sorted({r.error for r in records if r.error})[:5],
         "wall_s": wall_s, "output_tokens": tokens,
         "prompt_tokens": sum(r.prompt_len for r in ok),
         "output_tokens_per_s": tokens / wall_s if wall_s > 0 else math.nan,
         "requests_per_s": len(ok) / wall_s if wall_s > 0 else math.nan,
         "peak_output_tokens_per_s": peak_output_tokens_per_s(records),
         "peak_concurrent_requests": peak_concurrent_requests(records),
         "goodput_slos_ms": dict(goodput) if goodput else None,
         "goodput_requests_per_s": good,
         "ttft_s": percentiles([r.ttft_s for r in ok]),
         "tpot_s": percentiles([r.tpot_s for r in ok]),
         "itl_s": percentiles([g for r in ok for g in r.itl_s]),
         "e2e_s": percentiles([r.e2e_s for r in ok])}
    s.update(vllm_fields(s))
    return s


def plain_number(v: float, digits: int = 4) -> str:
    """``v`` to ``digits`` significant digits as a person writes it, never with an exponent:
    ``38,240`` (not ``3.824e+04``), ``123.5``, ``4.4``, ``0.01235``; a missing value (NaN) "—"."""
    if v is None or math.isnan(v):
        return "—"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    v = float(f"{v:.{digits}g}")        # rounded first: 999.96 is 1,000
    if v == 0 or abs(v) >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(abs(v)))
    return f"{v:.{decimals}f}".rstrip("0").rstrip(".")   # 4.4, not 4.400 (as :.4g)


def format_summary(r: dict) -> str:
    """Plain-text table of a load test's result; a sweep (``r["sweep"]``) one table a rate.
    Numbers to 4 significant digits without exponents (:func:`plain_number`)."""
    if "sweep" in r:
        return "\n\n".join(format_summary(run) for run in r["sweep"])
    s = r["settings"]
    if s["concurrency"]:
        mode = f"concurrency {s['concurrency']}"
    elif s.get("ramp_up_strategy"):
        mode = (f"{s['arrivals']} arrivals, {s['ramp_up_strategy']} ramp-up from "
                f"{s['ramp_up_start_rps']:g} to {s['ramp_up_end_rps']:g} req/s")
    else:
        mode = f"{s['arrivals']} arrivals at {s['rate']:g} req/s"
    if not s["concurrency"] and s.get("burstiness", 1) != 1:
        mode += f", burstiness {s['burstiness']:g}"
    lines = [f"{r['num_requests']} requests to {s['base_url']} ({s['model']}), {mode}: "
             f"{r['num_ok']} ok, {r['num_errors']} errors, {r['wall_s']:.3g} s",
             f"throughput: {plain_number(r['output_tokens_per_s'])} output tokens/s, "
             f"{plain_number(r['requests_per_s'])} requests/s"]
    if "peak_output_tokens_per_s" in r:
        lines.append(f"peak: {plain_number(r['peak_output_tokens_per_s'])} output tokens/s "
                     f"(fullest 1-s bucket), {r['peak_concurrent_requests']} requests in flight")
    if r.get("goodput_slos_ms"):
        slos = " ".join(f"{k}:{v:g}" for k, v in r["goodput_slos_ms"].items())
        lines.append(f"goodput: {plain_number(r['goodput_requests_per_s'])} requests/s within "
                     f"{slos} ms")
    cols = ("mean", "std", "p50", "p90", "p95", "p99")
    lines.append(f"{'':24}" + "".join(f"{c:>10}" for c in cols))
    for key, name in (("ttft_s", "TTFT (ms)"), ("tpot_s", "time/output token (ms)"),
                      ("itl_s", "inter-token (ms)"), ("e2e_s", "end-to-end (ms)")):
        v = r.get(key)
        if v is not None:
            lines.append(f"{name:24}" + "".join(f"{plain_number(1e3 * v.get(q, math.nan)):>10}"
                                                 for q in cols))
    lines += [f"error: {e}" for e in r["errors"]]
    return "\n".join(lines)
