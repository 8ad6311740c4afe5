"""An OpenAI-compatible HTTP server on the engine: FastAPI + uvicorn, streaming by SSE.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with
``"stream": true`` as server-sent events ending in ``data: [DONE]``, written by Starlette's
``StreamingResponse``, which also notices a client that went away), ``GET /health`` and
``GET /metrics`` (Prometheus text, :mod:`llminfra.serving.server_metrics`). The official
``openai`` client works against it unchanged — the point of vLLM's OpenAI-compatible server
(vLLM docs, "OpenAI-Compatible Server"): an application written for a hosted API moves to a
self-hosted engine by changing ``base_url``.

The engine runs in a loop of its own — a process of its own
(:class:`~llminfra.serving.engine_process.EngineProcess`, what ``python -m llminfra serve`` does)
or a background thread (:class:`~llminfra.serving.async_engine.AsyncEngine`, for tests and
notebooks); handlers only validate, queue and relay. Every malformed request gets a 4xx with OpenAI's
error body naming the field (``param``), quoting at most 200 characters of the bad value; a
client that disconnects — mid-stream, or while waiting for a non-streamed answer — aborts its
request (blocks freed). A request that fails inside the engine (finish reason ``"error"``) gets
a 500 (or, mid-stream, an error event) while the engine serves the others; ``/health`` answers
503 when the engine loop is stopped or has made no progress for ``stall_timeout_s``. Bodies,
slow senders and connections are bounded (:mod:`llminfra.serving.http_limits`).

Streaming (:mod:`llminfra.serving.streaming`): deltas hold back a trailing half UTF-8
character until the next byte arrives (:func:`~llminfra.serving.streaming.stable_delta`).

Taught in chapter 05.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from llminfra.serving import openai_protocol as api
from llminfra.serving.async_engine import AsyncEngine, EngineDeadError, EngineLoop
from llminfra.serving.http_limits import BODY_TIMEOUT_S, MAX_BODY_BYTES, RequestBodyLimits
from llminfra.engine.request_limits import max_tokens_for
from llminfra.engine.sampling_params import InvalidParameter, clip, clip_repr
from llminfra.serving.server_metrics import CONTENT_TYPE, ServerMetrics
from llminfra.serving.stall_watch import stall_message, watch_for_stalls
from llminfra.serving.streaming import sse_response, stable_delta  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

#: default name the server gives the tiny model in ``/v1/models``
DEFAULT_MODEL_NAME = "llminfra-tiny"
#: ``/health`` says 503 once the engine loop has made no progress for this long (seconds)
STALL_TIMEOUT_S = 30.0
#: the status of a request whose client left before the answer (nginx's "client closed request")
CLIENT_CLOSED_REQUEST = 499
#: a text prompt longer than this (characters) is tokenized in a worker thread: tokenizing 1 MiB
#: takes the real model's BPE about a second, which on the event loop would stall every stream
#: (it helps where the tokenizer lets go of the GIL while it works)
THREAD_TOKENIZE_CHARS = 8192


class APIError(Exception):
    """A request the server refuses: HTTP ``status`` and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.type_ = status, param, code, type_

    def response(self) -> JSONResponse:
        return JSONResponse(api.error_body(str(self), self.type_, self.param, self.code),
                            status_code=self.status)


def _validation_error(exc: RequestValidationError) -> APIError:
    err = exc.errors()[0] if exc.errors() else {}
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {err.get('msg', '')}")
    param = loc[0] if loc else None
    where = ".".join(loc) or "body"
    if err.get("type") == "extra_forbidden":
        return APIError(400, f"{where}: this server does not support the field {where!r} "
                             f"(it refuses what it would otherwise ignore)", param=param)
    return APIError(400, f"{where}: {err.get('msg', 'invalid value')} "
                         f"(got {clip_repr(err.get('input'))})", param=param)


async def _until_disconnected(request: Request) -> None:
    """Return once the client has gone. After the body is read, the ASGI server's next
    message for this request is ``http.disconnect``, sent when the connection closes."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Service:
    """Validation and relaying between HTTP and the engine loop (one per app)."""

    def __init__(self, engine, tokenizer, model_name, max_model_len, max_n, SamplingParams):
        self.tokenizer, self.model_name = tokenizer, model_name
        self.max_model_len, self.max_n = max_model_len, max_n
        self.SamplingParams = SamplingParams
        #: no progress for this long (s) and the engine counts as stalled (set by create_app)
        self.stall_timeout_s = float("inf")
        cache = None if isinstance(engine, EngineLoop) else getattr(engine, "cache", None)
        #: (num_blocks, block_size) of an engine in this process; an engine in a process of
        #: its own checks its pool itself, by the same rule (:mod:`~llminfra.engine.request_limits`)
        self.kv_pool = None if cache is None else (cache.allocator.num_blocks, cache.block_size)
        self.metrics = ServerMetrics(lambda: self.loop.stats)
        if isinstance(engine, EngineLoop):          # e.g. an EngineProcess
            engine.on_finished = self.metrics.observe_finished
            self.loop = engine
        else:
            self.loop = AsyncEngine(engine, on_finished=self.metrics.observe_finished)

    def check_model(self, req) -> None:
        if req.model != self.model_name:
            raise APIError(404, f"the model {clip_repr(req.model)} does not exist; this server "
                                f"serves {self.model_name!r}", param="model",
                           code="model_not_found")

    async def encode(self, prompt, param: str) -> list[int]:
        """:meth:`prompt_ids`, in a worker thread for a long text prompt
        (:data:`THREAD_TOKENIZE_CHARS`)."""
        if isinstance(prompt, str) and len(prompt) > THREAD_TOKENIZE_CHARS:
            return await asyncio.to_thread(self.prompt_ids, prompt, param)
        return self.prompt_ids(prompt, param)

    async def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of chat ``messages``: the tokenizer's ``encode_chat`` where it has one (only
        the template writes control tokens; a ``<|im_end|>`` typed in a message stays text),
        else its ``apply_chat_template`` text through :meth:`encode`; a refusal is a 400."""
        encode_chat = getattr(self.tokenizer, "encode_chat", None)
        try:
            if encode_chat is None:
                return await self.encode(self.tokenizer.apply_chat_template(messages),
                                         "messages")
            chars = sum(len(m["content"]) for m in messages)
            ids = await asyncio.to_thread(encode_chat, messages) \
                if chars > THREAD_TOKENIZE_CHARS else encode_chat(messages)
        except UnicodeError as e:
            raise APIError(400, f"messages is not valid Unicode text: {e.reason}",
                           param="messages") from None
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        return self.prompt_ids(ids, "messages")

    def prompt_ids(self, prompt, param: str) -> list[int]:
        """Token ids of a prompt (text or ids), checked: valid text, ids in the vocabulary;
        else a 400 naming ``param``. Its length is checked with ``max_tokens``
        (:meth:`sampling`)."""
        try:
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        except UnicodeError as e:        # e.g. a lone surrogate that slipped past validation
            raise APIError(400, f"{param} is not valid Unicode text: {e.reason}",
                           param=param) from None
        vocab = self.tokenizer.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise APIError(400, f"token ids must lie in [0, {vocab})", param=param)
        return ids

    def sampling(self, req, n_prompt: int, max_tokens: int | None, prompt_param: str = "prompt"):
        """The request's ``SamplingParams``. Its length goes by the engine's own rule,
        :func:`~llminfra.engine.request_limits.max_tokens_for` with the context
        ``max_model_len`` (and the KV pool of an engine in this process): a refusal is a 400
        with the same ``param`` and message and its ``code`` (``context_length_exceeded``…);
        ``max_tokens`` None takes the room left."""
        try:
            max_tokens = max_tokens_for(n_prompt, max_tokens, self.max_model_len, self.kv_pool,
                                        prompt_param)
        except InvalidParameter as e:
            raise APIError(400, str(e), param=e.param, code=getattr(e, "code", None)) from None
        try:
            logprobs = req.num_logprobs
        except ValueError as e:
            raise APIError(400, str(e), param="top_logprobs") from None
        if req.n > self.max_n:
            raise APIError(400, f"n must be at most {self.max_n}, got {req.n}", param="n")
        try:
            return self.SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_k=req.top_k, top_p=1.0 if req.top_p is None else req.top_p, n=req.n,
                seed=req.seed, stop=req.stop, ignore_eos=req.ignore_eos, logprobs=logprobs,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                repetition_penalty=(1.0 if req.repetition_penalty is None
                                    else req.repetition_penalty),
                min_p=req.min_p or 0.0, logit_bias=req.logit_bias, json_schema=req.json_schema)
        except ValueError as e:
            raise APIError(400, str(e), param=getattr(e, "param", None)) from None

    async def submit(self, ids, params, rid, prompt_param: str = "prompt"):
        """Queue the request; the engine's refusal is a 400 naming the field at fault. A
        ``response_format`` schema is compiled here first, in a worker thread, within the
        limits of :mod:`llminfra.engine.structured`: one the engine could not serve is a 400
        before anything is queued."""
        idle_s = self.loop.seconds_since_progress
        if idle_s > self.stall_timeout_s:
            raise APIError(503, stall_message(idle_s), type_="server_error")
        try:
            if params.json_schema is not None:   # imported here: llguidance only when used
                from llminfra.engine.structured import check_json_schema, check_schema_shape
                try:                                      # cheap: refuse before a thread
                    check_schema_shape(params.json_schema)
                except ValueError as e:
                    raise InvalidParameter("response_format", str(e)) from None
                await asyncio.to_thread(check_json_schema, params.json_schema, self.tokenizer)
            return await self.loop.generate(ids, params, rid)
        except ValueError as e:
            param = getattr(e, "param", None)
            raise APIError(400, str(e), param=prompt_param if param in (None, "prompt")
                           else param) from None
        except EngineDeadError as e:
            raise APIError(503, str(e), type_="server_error") from None

    async def complete(self, stream, n_prompt, rid, request: Request):
        """Non-streaming: run to the end; ``(choices, usage)``. A client that leaves first
        aborts the request (its blocks freed) and gets :data:`CLIENT_CLOSED_REQUEST`."""
        run = asyncio.ensure_future(self._last_output(stream))
        gone = asyncio.ensure_future(_until_disconnected(request))
        try:
            await asyncio.wait({run, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (run, gone):
                task.cancel()
            await asyncio.gather(run, gone, return_exceptions=True)
        if not run.done() or run.cancelled():
            self.loop.abort(rid)
            self.metrics.client_disconnects.inc()
            raise APIError(CLIENT_CLOSED_REQUEST, "the client closed the connection")
        last = run.result()
        choices = [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
                    "logprobs": c.logprobs} for c in last.outputs]
        return choices, api.usage(n_prompt, sum(len(c.token_ids) for c in last.outputs))

    @staticmethod
    async def _last_output(stream):
        """The final ``RequestOutput``; the engine's failure of this one request is a 500,
        the loss of the whole engine a 503."""
        last = None
        try:
            async for out in stream:
                last = out
        except EngineDeadError as e:      # the engine died mid-request: the server's fault
            raise APIError(503, str(e), type_="server_error") from None
        if last.error is not None:
            raise APIError(500, f"the engine failed this request: {last.error}",
                           type_="server_error")
        return last

    def token_text(self, token: int) -> str:
        """One token's text, as the logprobs objects show it."""
        return self.tokenizer.decode([token])

    def logprobs_object(self, entries: list[tuple] | None, chat: bool,
                        offset: int = 0) -> dict | None:
        """The API's ``logprobs`` object for ``entries`` (None when none were asked for);
        ``offset``: where the first token starts in the completion's text."""
        if entries is None:
            return None
        return (api.chat_logprobs(entries, self.token_text) if chat
                else api.completion_logprobs(entries, self.token_text, offset))

    def sse(self, stream, rid, n_prompt, chat: bool, include_usage: bool, prefix: str = ""):
        """Streaming: one SSE event per new text of one choice, then ``[DONE]``
        (:func:`llminfra.serving.streaming.sse_response`)."""
        return sse_response(self, stream, rid, n_prompt, chat, include_usage, prefix)


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
    ``body_timeout_s`` bound request bodies (413 / 408, :mod:`~llminfra.serving.http_limits`);
    ``/health`` is 503 once the engine loop has made no progress for ``stall_timeout_s``
    seconds (more than an idle engine process' heartbeat,
    :data:`~llminfra.serving.engine_process.HEARTBEAT_S`); then every request in flight fails
    with a 503 and new ones are refused until the engine moves again
    (:mod:`~llminfra.serving.stall_watch`). The engine loop starts and stops with the app's
    lifespan (uvicorn start-up / shutdown).
    """
    from llminfra.engine import SamplingParams
    if not stall_timeout_s > 0:
        raise ValueError(f"stall_timeout_s must be > 0 (seconds), got {stall_timeout_s!r}")
    if max_model_len is None:
        if isinstance(engine, EngineLoop):
            raise ValueError("max_model_len is required when the engine is an EngineLoop")
        max_model_len = engine.model.config.max_seq_len
    svc = _Service(engine, tokenizer, model_name, max_model_len, max_n, SamplingParams)

    svc.stall_timeout_s = stall_timeout_s

    @asynccontextmanager
    async def lifespan(app):
        await asyncio.to_thread(svc.loop.start)     # an engine process takes seconds to build
        watchdog = asyncio.ensure_future(watch_for_stalls(svc.loop, stall_timeout_s))
        try:
            yield
        finally:
            watchdog.cancel()
            svc.loop.stop()

    app = FastAPI(title="llminfra OpenAI-compatible server", lifespan=lifespan)
    app.add_middleware(RequestBodyLimits, max_bytes=max_body_bytes, timeout_s=body_timeout_s)
    app.state.service = svc

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        if exc.status_code in (408, 413):            # the body limits: said as they are
            code = "request_too_large" if exc.status_code == 413 else "request_timeout"
            return APIError(exc.status_code, exc.detail, code=code).response()
        code = "not_found" if exc.status_code == 404 else None
        return APIError(exc.status_code, f"{request.method} {clip(request.url.path)}: "
                                         f"{exc.detail}", code=code).response()

    @app.get("/health")
    async def health():
        if not svc.loop.is_running:
            raise APIError(503, "the engine loop is not running", type_="server_error")
        idle_s = svc.loop.seconds_since_progress
        if idle_s > stall_timeout_s:
            raise APIError(503, stall_message(idle_s), type_="server_error")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE)

    def model_card():
        return {"id": model_name, "object": "model", "created": 0, "owned_by": "llminfra",
                "max_model_len": max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name}")
    async def model(name: str):
        if name != model_name:
            raise APIError(404, f"the model {clip_repr(name)} does not exist", param="model",
                           code="model_not_found")
        return model_card()

    @app.post("/v1/completions")
    async def completions(req: api.CompletionRequest, request: Request):
        svc.check_model(req)
        ids = await svc.encode(req.prompt, "prompt")
        params = svc.sampling(req, len(ids), req.max_tokens)
        rid = api.new_id("cmpl")
        stream = await svc.submit(ids, params, rid)
        echo = svc.tokenizer.decode(ids) if req.echo else ""
        if req.stream:
            return svc.sse(stream, rid, len(ids), False, req.include_usage, prefix=echo)
        choices, use = await svc.complete(stream, len(ids), rid, request)
        for c in choices:
            c["text"] = echo + c["text"]
            if c["logprobs"] is not None:
                c["logprobs"] = api.completion_logprobs(c["logprobs"], svc.token_text,
                                                        len(echo))
        return api.completion_response(rid, model_name, choices, use)

    @app.post("/v1/chat/completions")
    async def chat(req: api.ChatCompletionRequest, request: Request):
        svc.check_model(req)
        try:
            messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from None
        ids = await svc.encode_chat(messages)
        params = svc.sampling(req, len(ids), req.max_completion_tokens or req.max_tokens,
                              "messages")
        rid = api.new_id("chatcmpl")
        stream = await svc.submit(ids, params, rid, prompt_param="messages")
        if req.stream:
            return svc.sse(stream, rid, len(ids), True, req.include_usage)
        choices, use = await svc.complete(stream, len(ids), rid, request)
        for c in choices:
            c["logprobs"] = svc.logprobs_object(c["logprobs"], True)
        return api.chat_response(rid, model_name, choices, use)

    return app
