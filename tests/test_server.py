"""The OpenAI-compatible server on the real engine and the tiny model, over real sockets on
127.0.0.1: the official ``openai`` client (streaming and not), malformed requests, 64 concurrent
streams, a client that disconnects, and SIGTERM of ``python -m llminfra serve``.

Every wait is bounded (client timeouts, ``asyncio.wait_for``, polling deadlines)."""

import asyncio
import json
import signal
import time
from functools import partial

import httpx
import openai
import pytest

from llminfra.serving.background import ServerProcess, ServerThread
from llminfra.serving.relay import stable_delta
from llminfra.serving.server import create_app
from server_helpers import metrics

MODEL = "llminfra-tiny"
PROMPT = "def json.dumps(obj)\n\nReturn "
NUM_BLOCKS = 96


ENGINE_SETTINGS = dict(num_blocks=NUM_BLOCKS, block_size=16, max_num_seqs=64,
                       max_num_batched_tokens=512)


def make_app(where: str = "thread"):
    """The app with its engine in a thread of this process, or in a process of its own (what
    ``python -m llminfra serve`` runs): every server test runs on both."""
    from llminfra.serving.serve import build_engine
    if where == "thread":
        engine = build_engine(**ENGINE_SETTINGS)
        return create_app(engine, engine.tokenizer, model_name=MODEL)
    from llminfra.serving.engine_process import EngineProcess
    from llminfra.model import ByteTokenizer
    factory = partial(build_engine, num_threads=1, **ENGINE_SETTINGS)
    return create_app(EngineProcess(factory), ByteTokenizer(), model_name=MODEL,
                      max_model_len=256)


@pytest.fixture(scope="module", params=["thread", "process"])
def server(one_thread, request):
    with ServerThread(make_app(request.param)) as srv:
        yield srv


def wait_idle(server, timeout_s=20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = metrics(server)
        if m["llminfra_kv_blocks_used"] == 0 and m["llminfra_num_requests_running"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"server still busy after {timeout_s} s: {m}")


def test_stable_delta_holds_back_half_characters():
    """'é' is two bytes: after the first the text ends in U+FFFD, which is held back."""
    assert stable_delta("ab\ufffd", "a", False) == ("b", "ab")
    assert stable_delta("abé", "ab", False) == ("é", "abé")
    assert stable_delta("ab\ufffd", "ab", True) == ("\ufffd", "ab\ufffd")


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.base_url}/health", timeout=10).json() == {"status": "ok"}
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    for name in ("llminfra_num_requests_running", "llminfra_num_requests_waiting",
                 "llminfra_kv_blocks_used", "llminfra_generation_tokens_total",
                 "llminfra_time_to_first_token_seconds_bucket",
                 "llminfra_time_per_output_token_seconds_bucket"):
        assert name in text
    assert metrics(server)["llminfra_kv_blocks_total"] == NUM_BLOCKS


def test_completions_stream_equals_non_stream(server, client):
    before = metrics(server)["llminfra_generation_tokens_total"]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(PROMPT.encode()) and r.usage.completion_tokens == 12
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == r.choices[0].text          # greedy: the same tokens either way
    assert chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert metrics(server)["llminfra_generation_tokens_total"] >= before + 24


def test_chat_stream_and_n(server, client):
    msgs = [{"role": "system", "content": "Answer with code."},
            {"role": "user", "content": "Sort a list."}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                                            temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == r.choices[0].message.content
    r2 = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, n=3,
                                        temperature=1.0, seed=7)
    assert sorted(c.index for c in r2.choices) == [0, 1, 2]
    assert r2.usage.completion_tokens == 18


MALFORMED = [
    ("not json", "{bad", 400, None),
    ("unknown model", {"model": "gpt-9", "prompt": "a"}, 404, "model"),
    ("negative max_tokens", {"model": MODEL, "prompt": "a", "max_tokens": -3}, 400,
     "max_tokens"),
    ("huge max_tokens", {"model": MODEL, "prompt": "a", "max_tokens": 10**9}, 400,
     "max_tokens"),
    ("n too large", {"model": MODEL, "prompt": "a", "n": 1000}, 400, "n"),
    ("prompt longer than the context", {"model": MODEL, "prompt": "x" * 5000}, 400, "prompt"),
    ("prompt of wrong type", {"model": MODEL, "prompt": 12}, 400, "prompt"),
    ("max_tokens of wrong type", {"model": MODEL, "prompt": "a", "max_tokens": "ten"}, 400,
     "max_tokens"),
    ("temperature out of range", {"model": MODEL, "prompt": "a", "temperature": -1}, 400,
     "temperature"),
    ("token id out of range", {"model": MODEL, "prompt": [1, 2, 999]}, 400, "prompt"),
    ("missing prompt", {"model": MODEL}, 400, "prompt"),
    ("stream of wrong type", {"model": MODEL, "prompt": "a", "stream": "yes"}, 400, "stream"),
    ("logprobs above OpenAI's 5", {"model": MODEL, "prompt": "a", "logprobs": 6}, 400,
     "logprobs"),
    ("a field the server does not know", {"model": MODEL, "prompt": "a", "suffix": "b"}, 400,
     "suffix"),
    ("an unknown response_format", {"model": MODEL, "prompt": "a",
                                    "response_format": {"type": "xml"}}, 400,
     "response_format"),
    ("a schema that does not compile", {"model": MODEL, "prompt": "a", "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     400, "response_format"),
    ("presence_penalty out of range", {"model": MODEL, "prompt": "a", "presence_penalty": 3},
     400, "presence_penalty"),
    ("logit_bias key not a token id", {"model": MODEL, "prompt": "a", "logit_bias": {"x": 1}},
     400, "logit_bias"),
    ("logit_bias token outside the vocabulary", {"model": MODEL, "prompt": "a",
                                                 "logit_bias": {"300": 1}}, 400, "logit_bias"),
]


@pytest.mark.parametrize("case,body,status,param", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_completion_gets_openai_error(server, case, body, status, param):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(f"{server.base_url}/v1/completions", content=content,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, (case, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def test_malformed_chat_and_client_errors(server, client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content":
                                                               "x" * 400}], max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="a", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}],
                                       max_tokens=4, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}],
                                       max_tokens=4, tools=[{"type": "function", "function":
                                                             {"name": "f"}}])
    r = httpx.get(f"{server.base_url}/v1/nothing", timeout=10)
    assert r.status_code == 404 and "error" in r.json()


def test_64_concurrent_streams_all_complete(server):
    """64 streaming clients at once; every one gets all its tokens and a finish reason."""
    async def one(client, i):
        n_tok, finish, text = None, None, ""
        stream = await client.completions.create(
            model=MODEL, prompt=f"{i}: {PROMPT}", max_tokens=10, temperature=0.8, seed=i,
            stream=True, stream_options={"include_usage": True})
        async for c in stream:
            if c.choices:
                text += c.choices[0].text
                finish = c.choices[0].finish_reason or finish
            if c.usage:
                n_tok = c.usage.completion_tokens
        return n_tok, finish, text

    async def main():
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                                      max_retries=0, timeout=120) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(64))),
                                          timeout=240)

    results = asyncio.run(main())
    assert len(results) == 64
    assert all(n == 10 and f == "length" and t for n, f, t in results), results
    wait_idle(server)


def test_disconnect_mid_stream_frees_blocks(server):
    wait_idle(server)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "stream": True}
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", f"{server.base_url}/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()   # kept open: leaving a for-loop over it closes the socket
            events = 0
            while events < 3:
                events += next(lines).startswith("data:")
            busy = metrics(server)
            assert busy["llminfra_kv_blocks_used"] > 0      # the request holds blocks now
            assert busy["llminfra_num_requests_running"] == 1
    idle = wait_idle(server)                                # closed: aborted, blocks back
    assert idle["llminfra_generation_tokens_total"] < busy["llminfra_generation_tokens_total"] + 200


@pytest.mark.slow
def test_sigterm_stops_serve_cleanly():
    """uvicorn turns SIGTERM into a graceful shutdown (the app's shutdown stops the engine
    loop), then re-raises the signal so the parent sees why it ended (uvicorn >= 0.29):
    status 0 or -SIGTERM, and the log shows the clean path."""
    srv = ServerProcess(["--threads", "1", "--log-level", "info"]).start()
    try:
        r = httpx.post(f"{srv.base_url}/v1/completions",
                       json={"model": MODEL, "prompt": "a", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        code = srv.stop(timeout_s=30)
    out = srv.output
    assert code in (0, -signal.SIGTERM), out
    assert "Application shutdown complete" in out and "engine loop stopped" in out, out
    assert srv.proc.poll() is not None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.base_url}/health", timeout=2)


def test_serve_refuses_a_bad_port(capsys):
    from llminfra.cli import main
    assert main(["serve", "--port", "70000"]) == 2
    assert "port must be in 1..65535" in capsys.readouterr().err
