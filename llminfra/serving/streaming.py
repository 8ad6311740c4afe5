"""Server-sent events for the OpenAI streaming responses, and the one rule for text deltas.

A token can be half of a UTF-8 character (every token of the byte-level tiny model is one
byte; a BPE token of the real model can end inside a Korean syllable or an emoji);
``CompletionOutput.text`` then ends in U+FFFD until the next byte arrives, so deltas hold back a
trailing U+FFFD until the request finishes (:func:`stable_delta`). A client that leaves
mid-stream aborts its request. Taught in chapter 05.
"""

from __future__ import annotations

import json

from fastapi.responses import StreamingResponse

from llminfra.serving import openai_protocol as api
from llminfra.serving.async_engine import EngineDeadError


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
