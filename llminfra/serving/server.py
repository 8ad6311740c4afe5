"""An OpenAI-compatible HTTP server on the engine: FastAPI + uvicorn, streaming by SSE.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with
``"stream": true`` as server-sent events ending in ``data: [DONE]``, written by Starlette's
``StreamingResponse``, which also notices a client that went away), ``GET /health`` and
``GET /metrics`` (Prometheus text, :class:`~llminfra.serving.server_metrics.ServerMetrics`); for the routers in front of
a fleet (``vllm-router``, ``sglang-router``: :mod:`llminfra.bench.router_fleet`) also vLLM's
``POST /v1/completions/render`` and ``/v1/chat/completions/render`` (a prompt's token ids) and
SGLang's ``GET /model_info``, ``/server_info`` (and their ``/get_…`` names), ``/get_load`` and
``GET /version``. The official
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

``GET /metrics`` is :class:`~llminfra.serving.server_metrics.ServerMetrics`, one Prometheus
registry per server.

Taught in chapter 05.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

import llminfra
from llminfra.engine.sampling_params import clip_repr
from llminfra.serving import openai_protocol as api
from llminfra.serving.api_errors import APIError, add_error_handlers
from llminfra.serving.async_engine import EngineLoop
from llminfra.serving.body_limits import RequestBodyLimits
from llminfra.serving.http_limits import BODY_TIMEOUT_S, MAX_BODY_BYTES
from llminfra.serving.relay import Relay
from llminfra.serving.server_metrics import CONTENT_TYPE, ServerMetrics, parse_metrics

log = logging.getLogger(__name__)

#: default name the server gives the tiny model in ``/v1/models``
DEFAULT_MODEL_NAME = "llminfra-tiny"
#: ``/health`` says 503 once the engine loop has made no progress for this long (seconds)
STALL_TIMEOUT_S = 30.0

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
        # what the routers in front of a fleet ask a worker beyond the OpenAI API
        app.add_api_route("/v1/completions/render", self.render_completion, methods=["POST"])
        app.add_api_route("/v1/chat/completions/render", self.render_chat, methods=["POST"])
        for path in ("/model_info", "/get_model_info"):
            app.add_api_route(path, self.model_info, methods=["GET"])
        for path in ("/server_info", "/get_server_info"):
            app.add_api_route(path, self.server_info, methods=["GET"])
        app.add_api_route("/get_load", self.load, methods=["GET"])
        app.add_api_route("/version", self.version, methods=["GET"])

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

    # ------------------------------------------------------------ what routers ask
    # vllm-router (--policy cache_aware) renders every request on each worker to match its
    # prefix tree on token ids; sglang-router reads the model and server info when it
    # registers a worker and /get_load for --policy power_of_two. Only what this server
    # knows is reported; nothing is made up to fill a field.
    async def render_completion(self, req: api.CompletionRequest):
        """``POST /v1/completions/render`` (vLLM's): the prompt's token ids as the engine
        would see them, without generating — ``[{"request_id", "token_ids", "model"}]``."""
        self.check_model(req)
        ids = await self.encode(req.prompt, "prompt")
        return [{"request_id": api.new_id("cmpl"), "token_ids": ids, "model": self.model_name}]

    async def render_chat(self, req: api.ChatCompletionRequest):
        """``POST /v1/chat/completions/render`` (vLLM's): the chat prompt's token ids, through
        the chat template — ``{"request_id", "token_ids", "model"}``."""
        self.check_model(req)
        ids = await self.encode_chat(self.chat_messages(req))
        return {"request_id": api.new_id("chatcmpl"), "token_ids": ids, "model": self.model_name}

    async def model_info(self):
        """``GET /model_info`` and ``/get_model_info`` (SGLang's): the served model. No
        ``model_path``: sglang-router would fetch a tokenizer by that name from the Hugging
        Face hub (it routes on text without one)."""
        return {"model_path": None, "tokenizer_path": None, "is_generation": True,
                "served_model_name": self.model_name, "max_context_length": self.max_model_len,
                "vocab_size": self.tokenizer.vocab_size}

    async def server_info(self):
        """``GET /server_info`` and ``/get_server_info`` (SGLang's): one replica of one model,
        no tensor or data parallelism inside it."""
        return {"model_path": None, "served_model_name": self.model_name, "tp_size": 1,
                "dp_size": 1, "context_length": self.max_model_len,
                "version": llminfra.__version__}

    async def load(self):
        """``GET /get_load`` (SGLang's shape, one data-parallel rank): requests in the
        engine (running sequences + waiting) and waiting, from the engine loop's latest stats."""
        stats = self.loop.stats
        running, waiting = int(stats.get("num_running", 0)), int(stats.get("num_waiting", 0))
        return [{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting}]

    async def version(self):
        """``GET /version``."""
        return {"version": llminfra.__version__}

    def chat_messages(self, req: api.ChatCompletionRequest) -> list[dict]:
        """``[{"role", "content"}]`` of the request's messages (text parts joined); a
        non-text part is a 400 naming ``messages``."""
        try:
            return [{"role": m.role, "content": m.text()} for m in req.messages]
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None

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
        ids = await self.encode_chat(self.chat_messages(req))
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


__all__ = ["CONTENT_TYPE", "DEFAULT_MODEL_NAME", "OpenAIService", "STALL_TIMEOUT_S",
           "ServerMetrics", "create_app", "parse_metrics"]
