"""What a client can make the server hold: bounds on bodies, connections and slow senders.

A server that people reach over a network must not let one client — careless or hostile — take
the memory, the connections or the event loop that the others need. The bounds, their
defaults, and what enforces each:

* the request body: at most :data:`MAX_BODY_BYTES` (1 MiB), else 413, the refused rest read
  and dropped up to :data:`DRAIN_FACTOR` × the limit —
  :class:`~llminfra.serving.body_limits.RequestBodyLimits`, the app's middleware;
* each part of a body arrives within :data:`BODY_TIMEOUT_S` (30 s), else 408 — the same;
* open connections and requests: at most ``limit_concurrency`` (256), 503 beyond — uvicorn;
* an idle keep-alive connection closes after ``timeout_keep_alive`` (5 s) — uvicorn;
* the request line and headers: at most ``h11_max_incomplete_event_size`` (16 KiB) — uvicorn
  (h11).

A body over the limit is refused by its ``Content-Length`` before a byte of it is parsed, and a
chunked one as soon as it passes the limit, so parsing (on the event loop, where every stream
is written) is bounded by the limit: the largest useful body is a prompt as long as the context,
far below 1 MiB. The refused body is still read and thrown away — at most
:data:`DRAIN_FACTOR` times the limit in all, within :data:`BODY_TIMEOUT_S` — before the 413
goes out: a client reads its answer only once it has sent its body, and a server that answers
and closes mid-upload resets the connection, so the client sees a broken pipe instead of the
413 (nginx reads on after its answer for the same reason: its ``lingering_close``). A body
declared larger than that, or sent with ``Expect: 100-continue`` (its client waits to be
asked), is answered at once, and the connection closes after the 413. Parsing a body of that size takes the event loop tens of milliseconds, and a
BPE tokenizer takes far longer over a long text prompt than the byte tokenizer does, which is
why the server tokenizes long prompts in a worker thread
(:data:`~llminfra.serving.relay.THREAD_TOKENIZE_CHARS`).

What this stack cannot bound: a client that sends its request *head* byte by byte holds a
connection until ``limit_concurrency`` is reached (uvicorn has no header timeout). A public
deployment therefore puts a reverse proxy in front (README, "Putting the server on a
network").

This module holds the bounds only (it imports no web framework: ``llminfra serve`` reads its
defaults in the engine's process too); the server enforces them. Taught in chapter 05.
"""

from __future__ import annotations

from types import MappingProxyType

#: largest request body accepted (bytes): nginx's default ``client_max_body_size``
MAX_BODY_BYTES = 2**20
#: longest wait for the next part of a request body (seconds)
BODY_TIMEOUT_S = 30.0
#: a refused body is read and thrown away up to this many times the limit (bytes in all), so
#: that its client gets to read the 413; a larger one is answered at once
DRAIN_FACTOR = 4
#: uvicorn's bounds on connections (``uvicorn.run`` / ``uvicorn.Config`` keyword arguments)
UVICORN_LIMITS = MappingProxyType({
    "limit_concurrency": 256,                  # connections + requests at once; 503 beyond
    "timeout_keep_alive": 5,                   # seconds an idle keep-alive connection stays
    "h11_max_incomplete_event_size": 16 * 1024,  # bytes of request line + headers
})
