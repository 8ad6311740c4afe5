"""No request can stop the engine for the others, and a client that misbehaves gets a clear
4xx while the server keeps serving (issue 25, sections 1 and 2).

Engine (Python API): sampling is safe for every value the validator accepts (temperature
5e-324, top_p 1e-46); a step that fails for one request fails only that request and gives its
blocks back; seeds, ``dynamic_window_s`` and ``arrival_time`` are checked at the boundary;
stop strings follow one rule for streamed and final text, across token boundaries;
``max_num_seqs`` bounds running sequences when a request forks.

Server (official ``openai`` client and raw HTTP on 127.0.0.1, engine in a thread and — marked
slow — in a process of its own): a failed request gets a 500 and the others are served;
``/health`` turns 503 while the engine makes no progress and back to 200; a non-streaming
client that leaves aborts its request; lone surrogates, bodies too large or too slow, echoes of
huge values, more connections than allowed.

The engine of the test servers can be held inside a step (a *gate* file: while it exists, the
next step waits), which makes "the client left before the answer" and "the engine is wedged"
happen at a known point instead of a race. Every wait is bounded."""

import copy
import json
import math
import os
import signal
import socket
import threading
import time
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest
import torch

import llminfra.engine.sampler as sampler_module
from llminfra.engine import LLMEngine, SamplingParams, SchedulerConfig
from llminfra.serving.background import ServerThread
from llminfra.serving.http_limits import MAX_BODY_BYTES
from llminfra.engine.sampler import sample_tokens
from llminfra.engine.sampling_params import (MIN_TEMPERATURE, InvalidParameter, held_back,
                                             stop_at)
from llminfra.serving.serve import build_engine
from llminfra.serving.server import create_app
from server_helpers import metrics
from llminfra.model import ByteTokenizer, load_model

MODEL = "llminfra-tiny"
PROMPT = "def json.dumps(obj)\n\nReturn "
#: a request with this seed fails inside the engine's sampling step (injected)
FAILING_SEED = 666
SETTINGS = dict(num_blocks=96, block_size=16, max_num_seqs=4, max_num_batched_tokens=512)
BODY_LIMIT = 64 * 1024
STALL_S = 3.0                    # > the engine process' heartbeat (1 s)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def tiny():
    """The trained tiny model and its byte tokenizer (every character is a token, so a stop
    string of two characters spans two tokens)."""
    return load_model("tiny")


@pytest.fixture(scope="module")
def tiny64(tiny):
    """The tiny model in float64, so that batching cannot flip a near-tie by rounding."""
    model, tok = tiny
    return copy.deepcopy(model).double(), tok


def run_all(engine) -> dict:
    """Step to the end; the final output of every request, by id."""
    final = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


def assert_drained(engine):
    alloc = engine.cache.allocator
    alloc.check_invariants()
    assert alloc.num_free == alloc.num_blocks, "KV blocks leaked"
    assert not engine.has_unfinished_requests() and not engine.cache.tables


def fail_on_seed(sample_token):
    """``sample_token`` that raises for a request seeded :data:`FAILING_SEED`."""
    def sample(logits, params, generator):
        if params.seed == FAILING_SEED:
            raise RuntimeError("injected sampling failure")
        return sample_token(logits, params, generator)
    return sample


# ------------------------------------------------------------------ §1 sampling values
@pytest.mark.parametrize("temperature,top_p,top_k", [
    (5e-324, 1.0, None), (1e-39, 1.0, None), (MIN_TEMPERATURE / 2, 0.9, 5),
    (1.0, 1e-46, None), (1.0, 1e-300, None), (1.0, 5e-324, 3), (2.0, 1e-46, 10**9)])
def test_tiny_temperature_or_top_p_gives_the_argmax(temperature, top_p, top_k, gen):
    """Below the temperature floor sampling is greedy; a nucleus of almost no mass still holds
    the most likely token, so both pick the argmax (no inf / NaN into multinomial)."""
    logits = torch.randn(3, 256, generator=gen) * 20
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=1)
    tokens = sample_tokens(logits, [params] * 3, [torch.Generator().manual_seed(1)] * 3)
    assert tokens == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e-3, 0.7, 2.0, 1e6])
@pytest.mark.parametrize("top_p", [5e-324, 1e-46, 0.3, 1.0])
def test_every_accepted_value_samples_a_token(temperature, top_p, gen):
    logits = torch.randn(2, 256, generator=gen) * 30
    params = SamplingParams(temperature=temperature, top_p=top_p)
    for t in sample_tokens(logits, [params] * 2, [torch.Generator().manual_seed(3)] * 2):
        assert 0 <= t < 256


def test_engine_serves_tiny_temperatures(tiny):
    engine = LLMEngine(*tiny, **SETTINGS)
    greedy = engine.generate(PROMPT, SamplingParams(max_tokens=8))[0].outputs[0].text
    outs = engine.generate([PROMPT] * 4, [SamplingParams(max_tokens=8, temperature=t, top_p=p)
                                          for t, p in ((1e-39, 1.0), (5e-324, 1.0),
                                                       (1.0, 1e-46), (1.0, 1e-300))])
    assert [o.outputs[0].text for o in outs] == [greedy] * 4
    assert_drained(engine)


# ------------------------------------------------------------- §1 boundary validation
def test_seed_is_checked_and_sibling_seeds_wrap():
    with pytest.raises(InvalidParameter, match=r"seed must be .* \[0, 2\*\*64 - 1\]") as err:
        SamplingParams(seed=2**64)
    assert err.value.param == "seed"
    with pytest.raises(InvalidParameter, match="seed"):
        SamplingParams(seed=-1)
    p = SamplingParams(seed=2**64 - 1, n=2, temperature=1.0)
    assert [p.seed_of(j) for j in range(2)] == [2**64 - 1, 0]


def test_sibling_seed_past_2_64_runs(tiny):
    """seed = 2**64 - 1 with n = 2: completion 1 draws as a request seeded 0 does."""
    engine = LLMEngine(*tiny, **SETTINGS)
    pair = engine.generate(PROMPT, SamplingParams(max_tokens=6, temperature=1.0, n=2,
                                                  seed=2**64 - 1))[0]
    zero = engine.generate(PROMPT, SamplingParams(max_tokens=6, temperature=1.0, seed=0))[0]
    assert pair.outputs[1].token_ids == zero.outputs[0].token_ids
    assert_drained(engine)


@pytest.mark.parametrize("window", [math.inf, math.nan, -1.0, True])
def test_dynamic_window_must_be_finite(tiny, window):
    with pytest.raises(ValueError, match="dynamic_window_s must be a finite number >= 0"):
        SchedulerConfig(max_seq_len=64, policy="dynamic", dynamic_window_s=window)
    with pytest.raises(ValueError, match="dynamic_window_s"):
        LLMEngine(*tiny, policy="dynamic", dynamic_window_s=window)


@pytest.mark.parametrize("arrival", [math.nan, math.inf, -math.inf, "0", True])
def test_arrival_time_must_be_finite(tiny, arrival):
    engine = LLMEngine(*tiny, **SETTINGS)
    with pytest.raises(InvalidParameter, match="arrival_time must be None or a finite") as err:
        engine.add_request("abc", arrival_time=arrival)
    assert err.value.param == "arrival_time" and not engine.requests
    rid = engine.add_request("abc", SamplingParams(max_tokens=2), arrival_time=12.5)
    assert run_all(engine)[rid].metrics.arrival_time == 12.5


# --------------------------------------------------- §1 one request fails, others go on
def test_a_sampling_failure_fails_only_its_request(tiny64, monkeypatch):
    """Batched with the failing request or not, the others get the same tokens, and every
    block comes back."""
    params = [SamplingParams(max_tokens=12), SamplingParams(max_tokens=12, temperature=1.0,
                                                            seed=FAILING_SEED),
              SamplingParams(max_tokens=12, temperature=0.8, seed=5, n=2),
              SamplingParams(max_tokens=7, temperature=1.0, seed=7)]
    prompts = [PROMPT, "x = ", "import ", "class A:"]
    want = LLMEngine(*tiny64, **SETTINGS).generate([prompts[i] for i in (0, 2, 3)],
                                                   [params[i] for i in (0, 2, 3)])
    monkeypatch.setattr(sampler_module, "sample_token", fail_on_seed(sampler_module.sample_token))
    engine = LLMEngine(*tiny64, **SETTINGS)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    final = run_all(engine)
    bad = final[ids[1]]
    assert [c.finish_reason for c in bad.outputs] == ["error"]
    assert "injected sampling failure" in bad.error
    for i, w in zip((0, 2, 3), want):
        assert final[ids[i]].error is None
        assert [c.token_ids for c in final[ids[i]].outputs] == [c.token_ids for c in w.outputs]
    assert_drained(engine)
    after = engine.generate("y = ", SamplingParams(max_tokens=3))[0]       # still serving
    assert after.outputs[0].finish_reason == "length"


def test_a_failed_forward_fails_that_step_and_the_engine_goes_on(tiny):
    engine = LLMEngine(*tiny, **SETTINGS)
    forward, calls = engine.runner.forward, []

    def failing_forward(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected forward failure")
        return forward(*args)

    engine.runner.forward = failing_forward
    ids = [engine.add_request(p, SamplingParams(max_tokens=10)) for p in ("a", "bc", "def")]
    final = run_all(engine)
    assert {final[i].outputs[0].finish_reason for i in ids} == {"error"}
    assert all("injected forward failure" in final[i].error for i in ids)
    assert_drained(engine)
    late = engine.generate("ghi", SamplingParams(max_tokens=4))[0].outputs[0]
    assert late.finish_reason == "length" and len(late.token_ids) == 4


# ------------------------------------------------------------------- §2 stop strings
def test_stop_rule_units(gen):
    """Worked cases, then ``held_back`` against its definition (the longest end of the text
    that begins a stop string) on random texts and stops over a two-letter alphabet."""
    assert stop_at("the set", ["e ", "t"]) == 0 and stop_at("the", ["e "]) is None
    assert stop_at("abcbc", ["cb", "bc"]) == 1
    assert held_back("the", ["e "]) == 1 and held_back("th", ["e "]) == 0
    assert held_back("xab", ["abc", "b!"]) == 2 and held_back("", ["ab"]) == 0

    def word(lo, hi):
        n = int(torch.randint(lo, hi + 1, (), generator=gen))
        return "".join("ab"[int(i)] for i in torch.randint(0, 2, (n,), generator=gen))

    for _ in range(2000):
        text, stops = word(0, 8), [word(1, 6) for _ in range(3)]
        want = max((k for s in stops for k in range(len(s)) if text.endswith(s[:k])),
                   default=0)
        assert held_back(text, stops) == want, (text, stops)


def snapshots(engine, prompt, params) -> list:
    """Every output of one request, step by step."""
    rid = engine.add_request(prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == rid]
    return outs


@pytest.mark.parametrize("n", [1, 2])
def test_stop_strings_one_rule_for_every_snapshot(tiny, n):
    """Stop strings of 2 to 4 characters (2 to 4 tokens), one that never completes: each
    snapshot's text extends the previous one (what a stream sends), and the last is the text
    before the first stop string — or all of it when none completes."""
    engine = LLMEngine(*tiny, **SETTINGS)
    sample = dict(max_tokens=24, temperature=0.9, seed=11, n=n, ignore_eos=True)
    free = snapshots(engine, PROMPT, SamplingParams(**sample))[-1].outputs
    for k, c in enumerate(free):
        text = c.text
        assert len(text) == 24 and text.isascii(), text      # one character per token
        for stop in (text[4:6], text[7:11], [text[9:11], text[5:8]], text[3] + "\x07"):
            outs = snapshots(engine, PROMPT, SamplingParams(**sample, stop=stop))
            seen = [o.outputs[k].text for o in outs]
            assert all(b.startswith(a) for a, b in zip(seen, seen[1:])), (stop, seen)
            end = stop_at(text, [stop] if isinstance(stop, str) else stop)
            assert seen[-1] == (text if end is None else text[:end]), (stop, seen[-1])
            assert outs[-1].outputs[k].finish_reason == ("length" if end is None else "stop")
    assert_drained(engine)


# ---------------------------------------------------------- §2 max_num_seqs with forks
@pytest.mark.parametrize("policy", ["continuous", "static", "dynamic"])
def test_max_num_seqs_bounds_forked_sequences(tiny, policy):
    engine = LLMEngine(*tiny, num_blocks=96, max_num_seqs=3, policy=policy,
                       dynamic_window_s=0.0)
    for i, n in enumerate((2, 3, 1, 2, 3)):
        engine.add_request(f"{i}: {PROMPT}", SamplingParams(max_tokens=6, n=n, temperature=1.0,
                                                            seed=i))
    most = 0
    while engine.has_unfinished_requests():
        engine.step()
        most = max(most, len(engine.scheduler.running))
    assert most == 3
    assert_drained(engine)
    with pytest.raises(InvalidParameter, match="max_num_seqs = 3") as err:
        engine.add_request("a", SamplingParams(n=4))
    assert err.value.param == "n"


# ==================================================================== the server
def gated_failing_engine(gate: str):
    """The tiny-model engine of the test servers (module-level: the engine process builds it
    too): requests seeded :data:`FAILING_SEED` fail in sampling, and while the file ``gate``
    exists every step waits (after touching ``gate + ".entered"``)."""
    sampler_module.sample_token = fail_on_seed(sampler_module.sample_token)
    engine = build_engine(num_threads=1, **SETTINGS)
    step = engine.step

    def gated_step():
        if os.path.exists(gate):
            Path(gate + ".entered").touch()
            while os.path.exists(gate):
                time.sleep(0.005)
        return step()

    engine.step = gated_step
    return engine


def make_app(where: str, gate: str):
    limits = dict(model_name=MODEL, max_body_bytes=BODY_LIMIT, body_timeout_s=1.0,
                  stall_timeout_s=STALL_S)
    if where == "thread":
        engine = gated_failing_engine(gate)
        return create_app(engine, engine.tokenizer, **limits)
    from llminfra.serving.engine_process import EngineProcess
    return create_app(EngineProcess(partial(gated_failing_engine, gate)), ByteTokenizer(),
                      max_model_len=256, **limits)


@pytest.fixture(scope="module", params=["thread", pytest.param("process",
                                                               marks=pytest.mark.slow)])
def server(request, tmp_path_factory):
    gate = str(tmp_path_factory.mktemp(request.param) / "gate")
    sample_token = sampler_module.sample_token
    try:
        with ServerThread(make_app(request.param, gate)) as srv:
            srv.gate, srv.where = Path(gate), request.param
            srv.loop = srv.server.config.app.state.service.loop
            yield srv
    finally:
        sampler_module.sample_token = sample_token     # the thread engine patched it here


def wait_until(condition, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not {what} after {timeout_s} s")


def wait_idle(server) -> dict:
    def idle():
        m = metrics(server)
        return m if (m["llminfra_kv_blocks_used"] == 0
                     and m["llminfra_num_requests_running"] == 0
                     and m["llminfra_num_requests_waiting"] == 0) else None
    return wait_until(idle, "idle")


def health(server) -> int:
    return httpx.get(f"{server.base_url}/health", timeout=10).status_code


def raw_http(server, head: str, body: bytes = b"", timeout_s: float = 30.0):
    """Send ``head`` (request line + headers, without the blank line) and ``body`` over a
    plain socket, read until the server closes; ``(status, json body)``."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s) as s:
        try:
            s.sendall(head.encode() + b"\r\nConnection: close\r\n\r\n" + body)
        except OSError:
            pass                         # the server refused before reading it all
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head_bytes, _, payload = data.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), json.loads(payload)


def post_head(path: str, length: int | None) -> str:
    framing = (f"Content-Length: {length}" if length is not None
               else "Transfer-Encoding: chunked")
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{framing}")


# ----------------------------------------------- §1 a failing request, through the server
def test_a_failing_request_gets_an_error_and_the_others_are_served(server, client):
    good = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    with pytest.raises(openai.InternalServerError, match="injected sampling failure"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0,
                                  seed=FAILING_SEED)
    with pytest.raises(openai.APIError, match="injected sampling failure"):
        for _ in client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                temperature=1.0, seed=FAILING_SEED, stream=True):
            pass
    assert health(server) == 200
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert again.choices[0].text == good.choices[0].text
    assert wait_idle(server)['llminfra_request_success_total{finish_reason="error"}'] >= 2


def test_tiny_temperature_and_top_p_through_the_server(server, client):
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    for t, p in ((1e-39, 1.0), (5e-324, 1.0), (1.0, 1e-46), (1.0, 1e-300)):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=t,
                                      top_p=p)
        assert r.choices[0].text == greedy.choices[0].text, (t, p)
    assert health(server) == 200


@pytest.mark.parametrize("body,param", [
    ({"seed": 2**64}, "seed"), ({"seed": 2**64 - 1, "n": 2, "temperature": 1.0}, None),
    ({"n": 5}, "n"), ({"seed": -1}, "seed"), ({"stop": ["s" * 257]}, "stop"),
    ({"stop": ["s" * 256]}, None)])
def test_request_values_are_checked_at_the_boundary(server, body, param):
    """``n`` above ``max_num_seqs`` (4) could never run; a stop string over 256 characters
    would cost every step of the batch."""
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=30,
                   json={"model": MODEL, "prompt": "ab", "max_tokens": 3, **body})
    if param is None:
        assert r.status_code == 200 and len(r.json()["choices"]) == body.get("n", 1)
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# ------------------------------------------------------------------- §1 /health
def test_health_is_503_while_the_engine_is_wedged(server, client):
    """A step that does not end (the gate holds it): 503 once it has lasted the stall
    timeout, and the request held in it fails then with a 503 saying why (issue 43: it used to
    wait as long as the client did); a new one is refused while the engine is stalled; 200 again
    when the step ends, and requests are served."""
    assert health(server) == 200
    Path(f"{server.gate}.entered").unlink(missing_ok=True)
    server.gate.touch()
    try:
        with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                           max_retries=0, timeout=60) as c:
            done, t0 = [], time.monotonic()

            def held():
                try:
                    done.append(c.completions.create(model=MODEL, prompt="a", max_tokens=3,
                                                     temperature=0))
                except openai.APIStatusError as e:
                    done.append(e)
            t = threading.Thread(target=held)
            t.start()
            try:
                wait_until(lambda: Path(f"{server.gate}.entered").exists(), "in a step")
                wait_until(lambda: health(server) == 503, "503", timeout_s=STALL_S + 20)
                body = httpx.get(f"{server.base_url}/health", timeout=10).json()
                assert "no progress" in body["error"]["message"]
                t.join(STALL_S + 20)
                assert not t.is_alive(), "the held request was not failed"
                assert time.monotonic() - t0 < STALL_S + 20
                refused = httpx.post(f"{server.base_url}/v1/completions", timeout=30, json={
                    "model": MODEL, "prompt": "a", "max_tokens": 1})
                assert refused.status_code == 503 and "no progress" in refused.text
            finally:
                server.gate.unlink()
                t.join(60)
    finally:
        server.gate.unlink(missing_ok=True)
    assert done and isinstance(done[0], openai.APIStatusError), done
    assert done[0].status_code == 503 and "no progress" in str(done[0])
    wait_until(lambda: health(server) == 200, "200 again")
    again = client.completions.create(model=MODEL, prompt="a", max_tokens=3, temperature=0)
    assert again.usage.completion_tokens == 3


@pytest.mark.slow
@pytest.mark.parametrize("server", ["process"], indirect=True)
def test_health_is_503_while_the_engine_process_is_stopped(server):
    """An idle engine process says it is alive every second; stopped (SIGSTOP), it says
    nothing: 503 after the stall timeout, 200 once it runs again (SIGCONT)."""
    wait_idle(server)
    pid = server.loop._proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = httpx.post(f"{server.base_url}/v1/completions", timeout=STALL_S + 30, json={
            "model": MODEL, "prompt": "a", "max_tokens": 50, "ignore_eos": True})
        assert r.status_code == 503 and "no progress" in r.text      # failed, not left hanging
        assert time.monotonic() - t0 < STALL_S + 10
        wait_until(lambda: health(server) == 503, "503", timeout_s=STALL_S + 20)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: health(server) == 200, "200 again")
    assert not server.loop._streams and not server.loop._pending


# --------------------------------------------------- §2 a non-streaming client leaves
def test_a_non_streaming_client_that_leaves_aborts_its_request(server):
    """The engine is held in the request's first step while the client closes its socket;
    once the server has noticed (its disconnect counter), the step is let go: the request
    ends "abort" after one token, and every block comes back."""
    before = wait_idle(server)
    server.gate.touch()
    entered = Path(f"{server.gate}.entered")
    entered.unlink(missing_ok=True)
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 200,
                       "ignore_eos": True}).encode()
    try:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(post_head("/v1/completions", len(body)).encode() + b"\r\n\r\n" + body)
        wait_until(entered.exists, "in a step")
        s.close()
        wait_until(lambda: metrics(server)["llminfra_client_disconnects_total"]
                   == before["llminfra_client_disconnects_total"] + 1, "disconnect noticed")
    finally:
        server.gate.unlink()
    key = 'llminfra_request_success_total{finish_reason="abort"}'
    wait_until(lambda: metrics(server).get(key, 0) == before.get(key, 0) + 1, "aborted")
    after = wait_idle(server)
    assert after["llminfra_generation_tokens_total"] - before[
        "llminfra_generation_tokens_total"] == 1             # the one step it was held in


# ------------------------------------------------------------ §2 lone surrogates
@pytest.mark.parametrize("path,body,param", [
    ("completions", '{"prompt": "a\\ud800b"}', "prompt"),
    ("completions", '{"prompt": "ab", "stop": ["\\udfff"]}', "stop"),
    ("chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages"),
    ("chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", '
                         '"text": "x\\udc00"}]}]}', "messages")])
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, body, param):
    content = body.replace("{", '{"model": "%s", ' % MODEL, 1)
    r = httpx.post(f"{server.base_url}/v1/{path}", content=content, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "valid Unicode" in err["message"]
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=30,
                   content='{"model": "\\ud800", "prompt": "a"}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


# ------------------------------------------------------------------ §2 body limits
def test_a_body_over_the_limit_is_refused_before_it_is_read(server):
    """Content-Length over the limit: 413 with no body sent at all; a chunked body: 413 as
    soon as it passes the limit. The server goes on serving."""
    status, body = raw_http(server, post_head("/v1/completions", 10**9))
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert str(BODY_LIMIT) in body["error"]["message"]
    chunk = b"x" * (BODY_LIMIT + 1)
    status, body = raw_http(server, post_head("/v1/completions", None),
                            b"%x\r\n" % len(chunk) + chunk + b"\r\n0\r\n\r\n")
    assert status == 413
    assert health(server) == 200


def test_a_body_that_stops_arriving_gets_408(server):
    status, body = raw_http(server, post_head("/v1/completions", 100), b'{"model": ')
    assert status == 408 and "did not arrive within 1 s" in body["error"]["message"]
    assert health(server) == 200


def test_the_default_body_limit_is_1_mib(tiny):
    """In process (no server, no engine loop started): 1 MiB passes the limit (and fails
    later, as JSON), 1 MiB + 1 byte does not."""
    from fastapi.testclient import TestClient
    engine = LLMEngine(*tiny, num_blocks=8, max_num_seqs=2)
    app = TestClient(create_app(engine, engine.tokenizer))
    assert MAX_BODY_BYTES == 2**20
    for size, status in ((MAX_BODY_BYTES, 400), (MAX_BODY_BYTES + 1, 413)):
        r = app.post("/v1/completions", content=b" " * size,
                     headers={"content-type": "application/json"})
        assert r.status_code == status, r.text


class ThreadNotingTokenizer(ByteTokenizer):
    """The byte tokenizer, noting the thread each ``encode`` runs in."""

    def __init__(self):
        super().__init__()
        self.threads = []

    def encode(self, text):
        self.threads.append(threading.current_thread().name)
        return super().encode(text)


def test_a_long_prompt_is_tokenized_off_the_event_loop(tiny):
    """A text prompt over THREAD_TOKENIZE_CHARS is tokenized in a worker thread (asyncio's
    default executor), a short one in the handler's; both are then refused for their length
    (the engine loop is not started here: no server)."""
    from fastapi.testclient import TestClient

    from llminfra.serving.relay import THREAD_TOKENIZE_CHARS
    engine = LLMEngine(*tiny, num_blocks=8, max_num_seqs=2)
    tok = ThreadNotingTokenizer()
    app = TestClient(create_app(engine, tok, model_name=MODEL))
    for n in (THREAD_TOKENIZE_CHARS + 1, 300):
        r = app.post("/v1/completions", json={"model": MODEL, "prompt": "x" * n})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert tok.threads[0].startswith("asyncio_") and not tok.threads[1].startswith("asyncio_")


# --------------------------------------------------------------- §2 echoes are capped
@pytest.mark.parametrize("url,body,status", [
    ("/v1/completions", {"model": MODEL, "prompt": {"x": "y" * 50_000}}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": [1.5] * 5_000}, 400),
    ("/v1/completions", {"model": "m" * 50_000, "prompt": "a"}, 404),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "stop": ["s" * 10_000] * 2}, 400),
    ("/v1/models/" + "n" * 8_000, None, 404),
    ("/" + "p" * 8_000, None, 404)])
def test_error_bodies_quote_at_most_200_characters(server, url, body, status):
    r = (httpx.get(f"{server.base_url}{url}", timeout=30) if body is None else
         httpx.post(f"{server.base_url}{url}", json=body, timeout=30))
    assert r.status_code == status, r.text[:300]
    message = r.json()["error"]["message"]
    assert len(message) < 400 and "…" in message, message


# ------------------------------------------------------------- §2 stop strings, served
@pytest.mark.parametrize("stop", ["e ", ["t t", "se"], "e\x07"])
def test_stream_equals_non_stream_with_stop_strings(server, client, stop):
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=stop)
    whole = client.completions.create(**kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
    end = stop_at(free.choices[0].text, [stop] if isinstance(stop, str) else stop)
    assert whole == streamed == free.choices[0].text[:end]


def test_each_choice_streams_its_own_text(server, client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=1.0, seed=3, n=2,
              stop="e ")
    whole = {c.index: c.text for c in client.completions.create(**kw).choices}
    streamed = {0: "", 1: ""}
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == whole and whole[0] != whole[1]


# ------------------------------------------------------ §2 connections are bounded
def test_connections_beyond_the_limit_get_503(tiny):
    """Two idle connections (a slow client's) fill a limit of 3 with the request's own: the
    request gets 503; once they close, 200."""
    engine = LLMEngine(*tiny, num_blocks=16, max_num_seqs=2)
    with ServerThread(create_app(engine, engine.tokenizer, model_name=MODEL),
                      limit_concurrency=3) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(2)]
        for s in idle:
            s.sendall(b"GET /health HTTP/1.1\r\n")        # a head that never ends
        try:
            wait_until(lambda: health(srv) == 503, "503 beyond the limit")
        finally:
            for s in idle:
                s.close()
        wait_until(lambda: health(srv) == 200, "200 again")
