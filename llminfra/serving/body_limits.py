"""The request-body limits of the OpenAI server: :class:`RequestBodyLimits`, the app's ASGI
middleware, enforcing :data:`~llminfra.serving.http_limits.MAX_BODY_BYTES` (413) and
:data:`~llminfra.serving.http_limits.BODY_TIMEOUT_S` (408) as each part of a body arrives, and
draining a refused body so that its client reads the 413 (the bounds and why:
:mod:`llminfra.serving.http_limits`). :func:`~llminfra.serving.server.create_app` installs it.
Taught in chapter 05.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import HTTPException

from llminfra.serving.http_limits import BODY_TIMEOUT_S, DRAIN_FACTOR, MAX_BODY_BYTES
from llminfra.validate import non_negative_int


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
    ``max_bytes`` is refused with 413 — by its ``Content-Length`` before a byte is parsed, or
    as soon as a chunked body passes the limit — and a body whose next part does not arrive
    within ``timeout_s`` seconds gets 408. Both are raised as ``HTTPException`` from
    ``receive``, so the app's own handler writes the error body. Once the body is complete,
    ``receive`` is passed through untouched: waiting for ``http.disconnect`` (how a handler
    notices a client that left) is no body read.

    Before a 413 goes out, the rest of the refused body is read and thrown away
    (:meth:`drain`: at most :data:`~llminfra.serving.http_limits.DRAIN_FACTOR` × ``max_bytes``
    in all, within ``timeout_s``), so that a client still sending reads the answer instead of
    a reset connection. A body that cannot be drained so — declared larger, cut off, or sent
    with ``Expect: 100-continue`` (its client sends nothing until asked) — is answered at once
    with ``Connection: close``."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES, timeout_s: float = BODY_TIMEOUT_S):
        non_negative_int("max_bytes", max_bytes)
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 (seconds), got {timeout_s!r}")
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s
        #: bytes of a refused body read in all (then thrown away) before its 413
        self.drain_bytes = DRAIN_FACTOR * max_bytes

    def too_large(self, drained: bool) -> HTTPException:
        """The 413; ``drained``: the whole body has been read, so the connection can stay."""
        return HTTPException(413, f"the request body is larger than this server's limit of "
                                  f"{self.max_bytes} bytes",
                             headers=None if drained else {"Connection": "close"})

    async def drain(self, receive, read: int) -> bool:
        """Read and throw away the rest of a refused body, ``read`` bytes of it already in;
        True once its last part has come, False when cut off (past :attr:`drain_bytes`, no
        part for ``timeout_s`` seconds or the client gone)."""
        deadline = time.monotonic() + self.timeout_s
        while read <= self.drain_bytes:
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                return False
            if message["type"] != "http.request":
                return False
            if not message.get("more_body"):
                return True
            read += len(message.get("body", b""))
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = content_length(scope)
        waits_to_send = (b"expect", b"100-continue") in scope.get("headers", ())
        read, body_done = 0, False

        async def limited_receive():
            nonlocal read, body_done
            if body_done:
                return await receive()
            if declared is not None and declared > self.max_bytes:
                body_done = True
                raise self.too_large(declared <= self.drain_bytes and not waits_to_send
                                     and await self.drain(receive, 0))
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except asyncio.TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within "
                                         f"{self.timeout_s:g} s") from None
            body_done = message["type"] != "http.request" or not message.get("more_body")
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.max_bytes:
                    drained = body_done or await self.drain(receive, read)
                    body_done = True
                    raise self.too_large(drained)
            return message

        await self.app(scope, limited_receive, send)
