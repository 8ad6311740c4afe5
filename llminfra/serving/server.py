"""An OpenAI-compatible HTTP server on the engine: FastAPI + uvicorn, streaming by SSE.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with
``"stream": true`` as server-sent events ending in ``data: [DONE]``, written by Starlette's
``StreamingResponse``, which also notices a client that went away), ``GET /health`` and
``GET /metrics`` (Prometheus text, :class:`ServerMetrics`, below). The official
``openai`` client works against it unchanged — the point of vLLM's OpenAI-compatible server
(vLLM docs, "OpenAI-Compatible Server"): an application written for a hosted API moves to a
self-hosted engine by changing ``base_url``.

The engine runs in a loop of its own — a process of its own
(:class:`~llminfra.serving.engine_process.EngineProcess`, what ``python -m llminfra serve`` does)
or a background thread (:class:`~llminfra.serving.async_engine.AsyncEngine`, for tests and
notebooks); handlers only validate, queue and relay. Every malformed request gets a 4xx with
OpenAI's error body naming the field (``param``), quoting at most 200 characters of the bad value;
a client that disconnects — mid-stream, or while waiting for a non-streamed answer — aborts its
request (blocks freed). A request that fails inside the engine (finish reason ``"error"``) gets a
500 (or, mid-stream, an error event) while the engine serves the others; ``/health`` answers 503
when the engine loop is stopped or has made no progress for ``stall_timeout_s``. Bodies, slow
senders and connections are bounded (:mod:`llminfra.serving.http_limits`; the bodies by
:class:`RequestBodyLimits`, this app's middleware).

The routes are the methods of :class:`OpenAIService`, registered onto the app by
:meth:`OpenAIService.add_routes`; what they share — checking a prompt, building its
``SamplingParams``, queueing it and relaying its outputs — is
:class:`~llminfra.serving.relay.Relay`, streaming included: deltas hold back a trailing half
UTF-8 character until the next byte arrives (:func:`~llminfra.serving.relay.stable_delta`);
refusals are :class:`~llminfra.serving.api_errors.APIError`.

``GET /metrics`` is :class:`ServerMetrics`, one Prometheus registry per server (no process-global
registry): gauges and counters read from the engine loop's latest ``stats()`` at each scrape
(``llminfra_num_requests_running`` counts sequences, as ``max_num_seqs`` does: a request with
n > 1 counts n), histograms observed in the engine thread when a request finishes — TTFT (first
token − arrival), TPOT ((finish − first token) / (tokens − 1)) and arrival to finish — with
``llminfra_request_success_total{finish_reason}``, and ``llminfra_client_disconnects_total``.
Names follow Prometheus' conventions (base units, ``_total`` for counters; prometheus.io/docs/
practices/naming) and mirror vLLM's (``vllm:time_to_first_token_seconds`` …).

Taught in chapter 05.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from llminfra.engine.sampling_params import clip_repr
from llminfra.serving import openai_protocol as api
from llminfra.serving.api_errors import APIError, add_error_handlers
from llminfra.serving.async_engine import EngineLoop
from llminfra.serving.http_limits import BODY_TIMEOUT_S, MAX_BODY_BYTES
from llminfra.serving.relay import Relay
from llminfra.validate import non_negative_int

log = logging.getLogger(__name__)

#: default name the server gives the tiny model in ``/v1/models``
DEFAULT_MODEL_NAME = "llminfra-tiny"
#: ``/health`` says 503 once the engine loop has made no progress for this long (seconds)
STALL_TIMEOUT_S = 30.0

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


class OpenAIService(Relay):
    """The OpenAI routes of one app, one method each (:meth:`add_routes` registers them);
    the engine loop starts and stops with the app's :meth:`lifespan`."""

    def __init__(self, engine, tokenizer, model_name: str, max_model_len: int, max_n: int,
                 stall_timeout_s: float = float("inf")):
        super().__init__(engine, tokenizer, model_name, max_model_len, max_n,
                         ServerMetrics(lambda: self.loop.stats), stall_timeout_s)

    def add_routes(self, app: FastAPI) -> None:
        """Register every route of this service onto ``app``."""
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/metrics", self.metrics_text, methods=["GET"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/v1/models/{name}", self.model, methods=["GET"])
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"])

    @asynccontextmanager
    async def lifespan(self, app):
        """Start the engine loop (in a worker thread: an engine process takes seconds to
        build) and the stall watchdog; stop both when the app shuts down."""
        await asyncio.to_thread(self.loop.start)
        watchdog = asyncio.ensure_future(self.stall.run())
        try:
            yield
        finally:
            watchdog.cancel()
            self.loop.stop()

    async def health(self):
        """``GET /health``: 200 while the engine loop runs and moves, else 503."""
        if not self.loop.is_running:
            raise APIError(503, "the engine loop is not running", type_="server_error")
        self.check_stalled()
        return {"status": "ok"}

    async def metrics_text(self):
        """``GET /metrics``: Prometheus' text format."""
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": 0,
                "owned_by": "llminfra", "max_model_len": self.max_model_len}

    async def models(self):
        """``GET /v1/models``: the one model served."""
        return {"object": "list", "data": [self.model_card()]}

    async def model(self, name: str):
        """``GET /v1/models/{name}``: its card, or a 404."""
        if name != self.model_name:
            raise APIError(404, f"the model {clip_repr(name)} does not exist", param="model",
                           code="model_not_found")
        return self.model_card()

    async def completions(self, req: api.CompletionRequest, request: Request):
        """``POST /v1/completions``: whole, or streamed as server-sent events."""
        self.check_model(req)
        ids = await self.encode(req.prompt, "prompt")
        params = self.sampling(req, len(ids), req.max_tokens)
        rid = api.new_id("cmpl")
        stream = await self.submit(ids, params, rid)
        echo = self.tokenizer.decode(ids) if req.echo else ""
        if req.stream:
            return self.sse(stream, rid, len(ids), False, req.include_usage, prefix=echo)
        choices, use = await self.complete(stream, len(ids), rid, request)
        for c in choices:
            c["text"] = echo + c["text"]
            if c["logprobs"] is not None:
                c["logprobs"] = api.completion_logprobs(c["logprobs"], self.token_text,
                                                        len(echo))
        return api.completion_response(rid, self.model_name, choices, use)

    async def chat(self, req: api.ChatCompletionRequest, request: Request):
        """``POST /v1/chat/completions``: the messages through the chat template, then as
        :meth:`completions`."""
        self.check_model(req)
        try:
            messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        ids = await self.encode_chat(messages)
        params = self.sampling(req, len(ids), req.max_completion_tokens or req.max_tokens,
                               "messages")
        rid = api.new_id("chatcmpl")
        stream = await self.submit(ids, params, rid, prompt_param="messages")
        if req.stream:
            return self.sse(stream, rid, len(ids), True, req.include_usage)
        choices, use = await self.complete(stream, len(ids), rid, request)
        for c in choices:
            c["logprobs"] = self.logprobs_object(c["logprobs"], True)
        return api.chat_response(rid, self.model_name, choices, use)


def content_length(scope) -> int | None:
    """The request's ``Content-Length`` header as an int (None if absent or malformed)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class RequestBodyLimits:
    """ASGI middleware bounding what reading a request body can cost: more than
    ``max_bytes`` is refused with 413 — by its ``Content-Length`` before a byte is read, or as
    soon as a chunked body passes the limit — and a body whose next part does not arrive within
    ``timeout_s`` seconds gets 408. Both are raised as ``HTTPException`` from ``receive``, so
    the app's own handler writes the error body. Once the body is complete, ``receive`` is
    passed through untouched: waiting for ``http.disconnect`` (how a handler notices a client
    that left) is no body read."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES, timeout_s: float = BODY_TIMEOUT_S):
        non_negative_int("max_bytes", max_bytes)
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 (seconds), got {timeout_s!r}")
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    def too_large(self) -> HTTPException:
        return HTTPException(413, f"the request body is larger than this server's limit of "
                                  f"{self.max_bytes} bytes")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = content_length(scope)
        read, body_done = 0, False

        async def limited_receive():
            nonlocal read, body_done
            if body_done:
                return await receive()
            if declared is not None and declared > self.max_bytes:
                raise self.too_large()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except asyncio.TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within "
                                         f"{self.timeout_s:g} s") from None
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.max_bytes:
                    raise self.too_large()
            body_done = message["type"] != "http.request" or not message.get("more_body")
            return message

        await self.app(scope, limited_receive, send)


def create_app(engine, tokenizer, *, model_name: str = DEFAULT_MODEL_NAME,
               max_model_len: int | None = None, max_n: int = 8,
               max_body_bytes: int = MAX_BODY_BYTES, body_timeout_s: float = BODY_TIMEOUT_S,
               stall_timeout_s: float = STALL_TIMEOUT_S) -> FastAPI:
    """The FastAPI app serving ``engine``: an ``LLMEngine`` (or anything with its API), run in
    a thread of this process by :class:`~llminfra.serving.async_engine.AsyncEngine`, or an
    unstarted :class:`~llminfra.serving.async_engine.EngineLoop` such as
    :class:`~llminfra.serving.engine_process.EngineProcess` (the engine in its own process).

    ``max_model_len`` defaults to ``engine.model.config.max_seq_len`` (required with an
    ``EngineLoop``, which holds no model here); ``max_n`` caps ``n``. ``max_body_bytes`` and
    ``body_timeout_s`` bound request bodies (413 / 408, :class:`RequestBodyLimits`);
    ``/health`` is 503 once the engine loop has made no progress for ``stall_timeout_s``
    seconds (more than an idle engine process' heartbeat,
    :data:`~llminfra.serving.engine_process.HEARTBEAT_S`); then every request in flight fails
    with a 503 and new ones are refused until the engine moves again
    (:class:`~llminfra.serving.engine_core.StallWatch`). The engine loop starts and stops with
    the app's lifespan (uvicorn start-up / shutdown). The routes are :class:`OpenAIService`'s
    methods; the service is ``app.state.service``.
    """
    if not stall_timeout_s > 0:
        raise ValueError(f"stall_timeout_s must be > 0 (seconds), got {stall_timeout_s!r}")
    if max_model_len is None:
        if isinstance(engine, EngineLoop):
            raise ValueError("max_model_len is required when the engine is an EngineLoop")
        max_model_len = engine.model.config.max_seq_len
    svc = OpenAIService(engine, tokenizer, model_name, max_model_len, max_n, stall_timeout_s)
    app = FastAPI(title="llminfra OpenAI-compatible server", lifespan=svc.lifespan)
    app.add_middleware(RequestBodyLimits, max_bytes=max_body_bytes, timeout_s=body_timeout_s)
    app.state.service = svc
    add_error_handlers(app)
    svc.add_routes(app)
    return app
