"""The server's Prometheus metrics: one registry per server, and the reader the tests use.

``GET /metrics`` is :class:`ServerMetrics`, one Prometheus registry per server (no process-global
registry): gauges and counters read from the engine loop's latest ``stats()`` at each scrape
(``llminfra_num_requests_running`` counts sequences, as ``max_num_seqs`` does: a request with
n > 1 counts n), histograms observed in the engine thread when a request finishes — TTFT (first
token − arrival), TPOT ((finish − first token) / (tokens − 1)) and arrival to finish — with
``llminfra_request_success_total{finish_reason}``, ``llminfra_client_disconnects_total`` and
the prefix cache's ``llminfra_prefix_cache_queries_total`` / ``_hits_total`` (prompt tokens
of finished requests, and of them those served from the cache: a replica's own hit rate, what
``make compare-routers`` reads).
Names follow Prometheus' conventions (base units, ``_total`` for counters; prometheus.io/docs/
practices/naming) and mirror vLLM's (``vllm:time_to_first_token_seconds`` …).

Taught in chapter 05.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

#: exposition format content type (Prometheus text format 0.0.4)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: histogram buckets in seconds: from a fast CPU token (1 ms) to a slow long request (60 s)
TTFT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                  10.0, 30.0, 60.0)
TPOT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

_GAUGES = {
    "num_requests_running": ("num_running", "sequences in the running batch (a request with "
                                            "n > 1 counts n; at most max_num_seqs)"),
    "num_requests_waiting": ("num_waiting", "requests queued, not yet admitted"),
    "num_requests_swapped": ("num_swapped", "requests preempted to CPU memory"),
    "kv_blocks_used": ("kv_blocks_used", "KV-cache blocks held by requests"),
    "kv_blocks_total": ("kv_blocks_total", "KV-cache blocks in the pool"),
    "spec_decode_acceptance_rate": ("spec_acceptance_rate", "speculative drafts kept / "
                                                            "proposed (0 without speculation)"),
}
_COUNTERS = {
    "num_preemptions": ("num_preemptions", "requests preempted so far"),
    "prompt_tokens": ("prompt_tokens_total", "prompt tokens processed (prefill)"),
    "generation_tokens": ("generation_tokens_total", "tokens generated (decode)"),
    "spec_decode_num_draft_tokens": ("spec_draft_tokens_total", "speculative draft tokens "
                                                                "proposed"),
    "spec_decode_num_accepted_tokens": ("spec_accepted_tokens_total", "speculative draft "
                                                                      "tokens kept"),
}


class _EngineStatsCollector:
    """Reads ``get_stats()`` (a dict) at every scrape."""

    def __init__(self, get_stats: Callable[[], dict]):
        self.get_stats = get_stats

    def collect(self):
        stats = self.get_stats()
        for name, (key, text) in _GAUGES.items():
            g = GaugeMetricFamily(f"llminfra_{name}", text)
            g.add_metric([], float(stats.get(key, 0)))
            yield g
        for name, (key, text) in _COUNTERS.items():
            c = CounterMetricFamily(f"llminfra_{name}", text)
            c.add_metric([], float(stats.get(key, 0)))
            yield c


class ServerMetrics:
    """The registry of one server; :meth:`observe_finished` is the engine loop's hook and
    :meth:`render` the body of ``GET /metrics``."""

    def __init__(self, get_stats: Callable[[], dict]):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineStatsCollector(get_stats))
        self.ttft = Histogram("llminfra_time_to_first_token_seconds",
                              "time to first token (arrival to first token)",
                              buckets=TTFT_BUCKETS_S, registry=self.registry)
        self.tpot = Histogram("llminfra_time_per_output_token_seconds",
                              "time per output token after the first",
                              buckets=TPOT_BUCKETS_S, registry=self.registry)
        self.e2e = Histogram("llminfra_e2e_request_latency_seconds",
                             "arrival to last token", buckets=TTFT_BUCKETS_S,
                             registry=self.registry)
        self.success = Counter("llminfra_request_success", "finished requests",
                               ["finish_reason"], registry=self.registry)
        self.client_disconnects = Counter("llminfra_client_disconnects",
                                          "requests aborted because their client left before "
                                          "the answer", registry=self.registry)
        self.prefix_queries = Counter("llminfra_prefix_cache_queries",
                                      "prompt tokens of finished requests looked up in the "
                                      "prefix cache (vLLM: vllm:prefix_cache_queries)",
                                      registry=self.registry)
        self.prefix_hits = Counter("llminfra_prefix_cache_hits",
                                   "of those, tokens served from the prefix cache",
                                   registry=self.registry)

    def observe_finished(self, output) -> None:
        """Record one finished ``RequestOutput`` (its ``metrics``; missing values skipped)."""
        m = output.metrics
        for hist, value in ((self.ttft, getattr(m, "ttft_s", None)),
                            (self.tpot, getattr(m, "tpot_s", None)),
                            (self.e2e, getattr(m, "e2e_s", None))):
            if value is not None:
                hist.observe(value)
        for c in output.outputs:
            self.success.labels(finish_reason=str(c.finish_reason)).inc()
        self.prefix_queries.inc(len(output.prompt_token_ids))
        self.prefix_hits.inc(getattr(m, "num_cached_prompt_tokens", 0) or 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def parse_metrics(text: str) -> dict[str, float]:
    """``/metrics`` text -> ``{sample name with labels: value}`` (comments skipped), e.g.
    ``{"llminfra_kv_blocks_used": 0.0, …}``; what the tests and the notebook read."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


__all__ = ["CONTENT_TYPE", "ServerMetrics", "TPOT_BUCKETS_S", "TTFT_BUCKETS_S", "parse_metrics"]
