"""What a client can make the server hold: bounds on bodies, connections and slow senders.

A server that people reach over a network must not let one client — careless or hostile — take
the memory, the connections or the event loop that the others need. The bounds, their
defaults, and what enforces each:

* the request body: at most :data:`MAX_BODY_BYTES` (1 MiB), else 413 —
  :class:`RequestBodyLimits`;
* each part of a body arrives within :data:`BODY_TIMEOUT_S` (30 s), else 408 — the same;
* open connections and requests: at most ``limit_concurrency`` (256), 503 beyond — uvicorn;
* an idle keep-alive connection closes after ``timeout_keep_alive`` (5 s) — uvicorn;
* the request line and headers: at most ``h11_max_incomplete_event_size`` (16 KiB) — uvicorn
  (h11).

A body over the limit is refused by its ``Content-Length`` before a byte of it is read, and a
chunked one as soon as it passes the limit, so parsing (on the event loop, where every stream
is written) is bounded by the limit: the largest useful body is a prompt as long as the context,
far below 1 MiB. Measured on a shared 2-core CPU: a 1 MiB list of token ids parses and
validates in about 50 ms; a 1 MiB text prompt tokenizes in 13 ms (the byte tokenizer) or about
1 s (SmolLM2's BPE), which is why the server tokenizes long prompts in a worker thread
(:data:`~llminfra.serving.relay.THREAD_TOKENIZE_CHARS`).

What this stack cannot bound: a client that sends its request *head* byte by byte holds a
connection until ``limit_concurrency`` is reached (uvicorn has no header timeout). A public
deployment therefore puts a reverse proxy in front (README, "Putting the server on a
network").

Taught in chapter 05.
"""

from __future__ import annotations

import asyncio
from types import MappingProxyType

from fastapi import HTTPException

from llminfra.validate import non_negative_int

#: largest request body accepted (bytes): nginx's default ``client_max_body_size``
MAX_BODY_BYTES = 2**20
#: longest wait for the next part of a request body (seconds)
BODY_TIMEOUT_S = 30.0
#: uvicorn's bounds on connections (``uvicorn.run`` / ``uvicorn.Config`` keyword arguments)
UVICORN_LIMITS = MappingProxyType({
    "limit_concurrency": 256,                  # connections + requests at once; 503 beyond
    "timeout_keep_alive": 5,                   # seconds an idle keep-alive connection stays
    "h11_max_incomplete_event_size": 16 * 1024,  # bytes of request line + headers
})


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
