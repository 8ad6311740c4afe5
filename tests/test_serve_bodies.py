"""A body over the limit gets a 413 its client can read (issue 54, item 6).

A client sends its whole body before it reads the answer. A server that answered 413 and
closed the connection while a 3 MB body was still arriving reset the connection: the client
saw a broken pipe (``urllib``, which always sends ``Connection: close``; a raw socket) instead
of the 413 and its message. The server now reads and drops the refused body — at most
``DRAIN_FACTOR`` times the limit, within the body timeout — before it answers; what it cannot
drain so it answers at once with ``Connection: close``. Servers on 127.0.0.1, the tiny model's
engine in a thread, the default 1 MiB limit."""

import json
import socket
import time
import urllib.error
import urllib.request

import openai
import pytest

from llminfra.engine import LLMEngine
from llminfra.model import load_model
from llminfra.serving.background import ServerThread
from llminfra.serving.http_limits import DRAIN_FACTOR, MAX_BODY_BYTES
from llminfra.serving.server import create_app

MODEL = "llminfra-tiny"
BODY_TIMEOUT_S = 1.0
#: what the red team sent: a 3 MB model name, and a 3 MB prompt of the wrong type
BODIES = ({"model": "m" * 3_000_000, "prompt": "a"},
          {"model": MODEL, "prompt": [{"x": "y" * 3_000_000}]})


@pytest.fixture(scope="module")
def server(one_thread):
    model, tokenizer = load_model("tiny")
    engine = LLMEngine(model, tokenizer, num_blocks=16, max_num_seqs=2)
    app = create_app(engine, tokenizer, model_name=MODEL, body_timeout_s=BODY_TIMEOUT_S)
    with ServerThread(app) as srv:
        yield srv


def exchange(server, head: str, body: bytes = b"", pause_s: float = 0.0):
    """Send a request head (without its blank line) and ``body`` on a raw socket, in 64 KiB
    pieces (``pause_s`` after the head), then read one response; ``(error sending or None,
    status, headers, json body, whether the server then closed)``."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(head.encode() + b"\r\n\r\n")
        time.sleep(pause_s)
        sent_error = None
        try:
            for i in range(0, len(body), 65536):
                s.sendall(body[i:i + 65536])
        except OSError as e:
            sent_error = e
        data = b""
        while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
            data += chunk
        head_bytes, _, payload = data.partition(b"\r\n\r\n")
        lines = head_bytes.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        while len(payload) < int(headers["content-length"]):
            payload += s.recv(65536)
        s.settimeout(1)
        try:
            closed = s.recv(1) == b""
        except ConnectionResetError:             # closed with the rest of the body unread
            closed = True
        except TimeoutError:                     # kept open for the next request
            closed = False
    return sent_error, int(lines[0].split()[1]), headers, json.loads(payload), closed


def post(length: int | None, *extra: str) -> str:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return "\r\n".join(["POST /v1/completions HTTP/1.1", "Host: 127.0.0.1",
                        "Content-Type: application/json", framing, *extra])


def chunked(body: bytes) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + 65536]), body[i:i + 65536])
             for i in range(0, len(body), 65536)]
    return b"".join(parts) + b"0\r\n\r\n"


def assert_too_large(status: int, body: dict):
    assert status == 413, body
    assert body["error"]["code"] == "request_too_large"
    assert f"limit of {MAX_BODY_BYTES} bytes" in body["error"]["message"]


def test_a_3_mb_body_gets_a_413_every_client_can_read(server):
    """A raw socket that asks to close (by length, and chunked), ``urllib`` (it always asks)
    and the ``openai`` client: each sends its 3 MB whole and reads the 413 with its message
    — no broken pipe. The server had read the body, so the connection stays open unless the
    client asked to close it."""
    for payload in BODIES:
        body = json.dumps(payload).encode()
        for head, data in ((post(len(body), "Connection: close"), body),
                           (post(None, "Connection: close"), chunked(body))):
            sent_error, status, headers, answer, _ = exchange(server, head, data)
            assert sent_error is None, f"the upload was cut off: {sent_error!r}"
            assert_too_large(status, answer)
        _, status, headers, answer, closed = exchange(server, post(len(body)), body)
        assert_too_large(status, answer)
        assert "connection" not in headers and not closed
        for _ in range(3):                     # a reset came for some of the tries, not all
            request = urllib.request.Request(f"{server.base_url}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert_too_large(refused.value.code, json.loads(refused.value.read()))
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                       timeout=30, default_headers={"Connection": "close"}) as client:
        for payload in BODIES:
            with pytest.raises(openai.APIStatusError) as refused:
                client.completions.create(**payload, max_tokens=1)
            assert refused.value.status_code == 413
            assert_too_large(413, refused.value.response.json())


def test_what_cannot_be_drained_is_answered_at_once_and_closed(server):
    """Beyond the drain's bounds the 413 comes without waiting for the body, with
    ``Connection: close``: a body declared over ``DRAIN_FACTOR`` × the limit (none of it
    sent), one that asks ``Expect: 100-continue`` (its client waits to be asked), a chunked
    one that runs past the bound, and one that stops arriving (after the body timeout)."""
    limit = DRAIN_FACTOR * MAX_BODY_BYTES
    t0 = time.monotonic()
    for head in (post(limit + 1), post(3_000_000, "Expect: 100-continue")):
        _, status, headers, answer, closed = exchange(server, head)
        assert_too_large(status, answer)
        assert headers["connection"] == "close" and closed
    assert time.monotonic() - t0 < BODY_TIMEOUT_S          # answered, not waited for
    _, status, headers, answer, closed = exchange(server, post(None),
                                                  chunked(b" " * (limit + 2**20)))
    assert_too_large(status, answer)
    assert headers["connection"] == "close" and closed
    t0 = time.monotonic()
    _, status, headers, answer, closed = exchange(server, post(3_000_000),
                                                  b" " * (2 * MAX_BODY_BYTES))
    assert_too_large(status, answer)
    assert headers["connection"] == "close" and closed
    assert BODY_TIMEOUT_S <= time.monotonic() - t0 < BODY_TIMEOUT_S + 10
