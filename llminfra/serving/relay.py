"""Between HTTP and the engine loop: what every OpenAI route does before and after the engine.

A prompt becomes checked token ids (in a worker thread when it is long:
:data:`THREAD_TOKENIZE_CHARS`), the request's fields become
:class:`~llminfra.engine.sampling_params.SamplingParams` by the engine's own length rule
(:func:`~llminfra.engine.sampling_params.max_tokens_for`), the request is queued on the engine
loop, and its outputs come back whole or as server-sent events (:func:`sse_response`). Every
refusal is an :class:`~llminfra.serving.api_errors.APIError` naming the field at fault; a client
that leaves before its answer aborts the request (its blocks freed). The routes themselves are
:class:`~llminfra.serving.server.OpenAIService`.

Streaming has one rule for text deltas. A token can be half of a UTF-8 character (every token of
the byte-level tiny model is one byte; a BPE token of the real model can end inside a Korean
syllable or an emoji); ``CompletionOutput.text`` then ends in U+FFFD until the next byte
arrives, so deltas hold back a trailing U+FFFD until the request finishes
(:func:`stable_delta`). A client that leaves mid-stream aborts its request. Taught in
chapter 05.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import StreamingResponse

from llminfra.engine.sampling_params import (InvalidParameter, SamplingParams, clip_repr,
                                              max_tokens_for)
from llminfra.serving import openai_protocol as api
from llminfra.serving.api_errors import CLIENT_CLOSED_REQUEST, APIError
from llminfra.serving.async_engine import AsyncEngine, EngineLoop
from llminfra.serving.engine_core import EngineDeadError, StallWatch

#: a text prompt longer than this (characters) is tokenized in a worker thread: tokenizing 1 MiB
#: takes the real model's BPE about a second, which on the event loop would stall every stream
#: (it helps where the tokenizer lets go of the GIL while it works)
THREAD_TOKENIZE_CHARS = 8192


async def _until_disconnected(request: Request) -> None:
    """Return once the client has gone. After the body is read, the ASGI server's next
    message for this request is ``http.disconnect``, sent when the connection closes."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Relay:
    """Validation and relaying between HTTP and the engine loop (one per app). ``metrics``
    (:class:`~llminfra.serving.server.ServerMetrics`) observes every finished request and
    counts the clients that left before their answer."""

    def __init__(self, engine, tokenizer, model_name: str, max_model_len: int, max_n: int,
                 metrics, stall_timeout_s: float = float("inf")):
        self.tokenizer, self.model_name = tokenizer, model_name
        self.max_model_len, self.max_n = max_model_len, max_n
        cache = None if isinstance(engine, EngineLoop) else getattr(engine, "cache", None)
        #: (num_blocks, block_size) of an engine in this process; an engine in a process of
        #: its own checks its pool itself, by the same rule
        #: (:func:`~llminfra.engine.sampling_params.max_tokens_for`)
        self.kv_pool = None if cache is None else (cache.allocator.num_blocks, cache.block_size)
        self.metrics = metrics
        if isinstance(engine, EngineLoop):          # e.g. an EngineProcess
            engine.on_finished = self.metrics.observe_finished
            self.loop = engine
        else:
            self.loop = AsyncEngine(engine, on_finished=self.metrics.observe_finished)
        #: judges the engine stalled after ``stall_timeout_s`` without progress
        self.stall = StallWatch(self.loop, stall_timeout_s)

    def check_stalled(self) -> None:
        """A 503 while the engine is stalled (:class:`~llminfra.serving.engine_core.StallWatch`:
        ``/health`` and every new request alike)."""
        if self.stall.stalled:
            raise APIError(503, self.stall.message, type_="server_error")

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
        :func:`~llminfra.engine.sampling_params.max_tokens_for` with the context
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
            return SamplingParams(
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
        self.check_stalled()
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
        aborts the request (its blocks freed) and gets
        :data:`~llminfra.serving.api_errors.CLIENT_CLOSED_REQUEST`."""
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
        (:func:`sse_response`)."""
        return sse_response(self, stream, rid, n_prompt, chat, include_usage, prefix)


def stable_delta(text: str, sent: str, finished: bool) -> tuple[str, str]:
    """``(delta, new_sent)``: the new part of cumulative ``text`` after ``sent``, holding back
    trailing U+FFFD (an unfinished UTF-8 character) unless ``finished``.
    ``stable_delta("ab\\ufffd", "a", False) == ("b", "ab")``."""
    stable = text if finished else text.rstrip("\ufffd")
    if not stable.startswith(sent):
        return "", sent
    return stable[len(sent):], stable


def _chunk(svc, rid: str, chat: bool, index: int, text: str, finish_reason: str | None,
           logprobs: dict | None = None, first: bool = False) -> str:
    """One event's JSON: a completion chunk holding ``text``, or a chat chunk whose delta
    holds it (the ``first`` chat chunk names the role, with empty content)."""
    if not chat:
        return json.dumps(api.completion_chunk(rid, svc.model_name, index, text,
                                               finish_reason, logprobs))
    delta = ({"role": "assistant", "content": ""} if first
             else {"content": text} if text else {})
    return json.dumps(api.chat_chunk(rid, svc.model_name, index, delta, finish_reason,
                                     logprobs))


def sse_response(svc, stream, rid, n_prompt, chat: bool, include_usage: bool,
                 prefix: str = "") -> StreamingResponse:
    """Streaming: one SSE event per new text of one choice (with its tokens' logprobs when
    asked for), then the usage chunk if asked for, then ``[DONE]``. ``svc`` is the app's
    service: its engine loop, metrics, model name and logprobs formatting."""
    obj = "chat.completion.chunk" if chat else "text_completion"

    async def events():
        sent, n_tokens, finished = {}, {}, False
        offsets: dict[int, int] = {}               # text_offset of each choice's next token
        try:
            async for out in stream:
                finished = out.finished
                if out.error is not None:       # this request failed in the engine
                    yield json.dumps(api.error_body(
                        f"the engine failed this request: {out.error}", "server_error"))
                    return
                for c in out.outputs:
                    if c.index not in sent:
                        sent[c.index] = ""
                        if chat or prefix:
                            yield _chunk(svc, rid, chat, c.index, prefix, None, first=True)
                    delta, sent[c.index] = stable_delta(c.text, sent[c.index],
                                                        c.finish_reason is not None)
                    before = n_tokens.get(c.index, 0)
                    n_tokens[c.index] = len(c.token_ids)
                    lps = None if c.logprobs is None else svc.logprobs_object(
                        c.logprobs[before:], chat, offsets.setdefault(c.index, len(prefix)))
                    if lps is not None and not chat:
                        offsets[c.index] += sum(len(t) for t in lps["tokens"])
                    new_tokens = lps is not None and len(c.token_ids) > before
                    if not delta and c.finish_reason is None and not new_tokens:
                        continue
                    yield _chunk(svc, rid, chat, c.index, delta, c.finish_reason, lps)
            if include_usage:
                yield json.dumps(api.usage_chunk(rid, svc.model_name, obj,
                                                 api.usage(n_prompt, sum(n_tokens.values()))))
            yield "[DONE]"
        except EngineDeadError as e:
            finished = True                     # nothing left to abort
            yield json.dumps(api.error_body(str(e), "server_error"))
        finally:
            if not finished:                    # the client left mid-stream
                svc.loop.abort(rid)
                svc.metrics.client_disconnects.inc()

    async def sse_lines():
        async for data in events():
            yield f"data: {data}\n\n"

    return StreamingResponse(sse_lines(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
