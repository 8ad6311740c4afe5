"""``llminfra serve`` replicas behind the real routers of a fleet: the vLLM project's
``vllm-router`` and SGLang's ``sglang-router`` (PyPI wheels, Rust binaries), each with
``--policy cache_aware`` over two replicas of the tiny model on loopback, every request through
the official ``openai`` client; then one replica killed mid-run and what each router does.

Both routers add engine fields to every request they forward (``no_stop_trim``,
``skip_special_tokens`` … :data:`llminfra.serving.router_fields.ENGINE_FIELDS`); before the
server accepted them every request through either router was a 400.

Needs the ``vllm-router`` and ``sglang-router`` wheels (the ``test`` extra); skipped, saying
which is missing, when one is absent — except under ``LLMINFRA_REQUIRE_ROUTERS=1`` (CI), where a
missing router fails.
"""

from __future__ import annotations

import os
import time

import httpx
import openai
import pytest

from llminfra.bench.router_fleet import ROUTERS, RealRouter, ServeReplicas, router_executable
from llminfra.serving.server import parse_metrics

MODEL = "llminfra-tiny"
REQUIRED = os.environ.get("LLMINFRA_REQUIRE_ROUTERS") == "1"
PROMPTS = ["def json.dumps(obj)\n\nReturn ", "The cache holds ", "A router in front of ",
           "Serving many users means "]


def _require(name: str) -> None:
    if router_executable(name) is None:
        reason = f"{name} not installed: pip install {ROUTERS[name][0]} (the test extra)"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    for name in ROUTERS:
        _require(name)
    with ServeReplicas(2, tmp_path_factory.mktemp("fleet"), engine_in_thread=True) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def routers(replicas):
    started = {}
    try:
        for name in ROUTERS:
            started[name] = RealRouter(name, replicas.urls, replicas.log_dir).start()
        yield started
    finally:
        for r in started.values():
            r.stop()


def client(url: str, timeout: float = 20) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                         timeout=timeout)


def completion(c: openai.OpenAI, prompt: str, **kw) -> str:
    return c.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                **kw).choices[0].text


def chat(c: openai.OpenAI, text: str, **kw) -> str:
    return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                     max_tokens=8, temperature=0, **kw).choices[0].message.content


def finished(url: str) -> float:
    """Requests the replica at ``url`` has finished (its ``/metrics``, every finish reason)."""
    page = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    return sum(v for k, v in page.items() if k.startswith("llminfra_request_success_total"))


@pytest.mark.parametrize("name", list(ROUTERS))
def test_every_request_through_the_router_is_answered(routers, replicas, name):
    """Completions and chat, whole and streamed, through the router give the replica's own
    greedy answer, and each routed request reached a replica exactly once."""
    direct, routed = client(replicas.urls[0]), client(routers[name].url)
    assert MODEL in [m.id for m in routed.models.list().data]
    before = sum(finished(u) for u in replicas.urls)
    for prompt in PROMPTS:
        want = completion(direct, prompt)
        assert completion(routed, prompt) == want
        stream = routed.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                           temperature=0, stream=True)
        assert "".join(ch.choices[0].text for ch in stream) == want
        want = chat(direct, prompt)
        assert chat(routed, prompt) == want
        stream = routed.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=8,
            temperature=0, stream=True, stream_options={"include_usage": True})
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == want
    # 2 direct and 4 routed requests a prompt: none lost, none sent twice
    assert sum(finished(u) for u in replicas.urls) - before == 6 * len(PROMPTS)


def test_the_routers_own_fields_are_what_serve_accepts(replicas):
    """The bodies the routers forward, as captured (vllm-router 0.1.17, sglang-router 0.3.2),
    are answered directly; the same with a value this server cannot honour is a 400 naming it."""
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "stream": False, "echo": False,
            "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
            "return_hidden_states": False}
    url = replicas.urls[1]
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=20).status_code == 200
    r = httpx.post(f"{url}/v1/completions", json=dict(body, no_stop_trim=True), timeout=20)
    assert r.status_code == 400 and r.json()["error"]["param"] == "no_stop_trim"
    chat_body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                 "max_completion_tokens": 2, "logprobs": False, "no_stop_trim": False,
                 "ignore_eos": False, "continue_final_message": False,
                 "skip_special_tokens": True, "separate_reasoning": True,
                 "stream_reasoning": True, "return_hidden_states": False,
                 "include_reasoning": True}
    assert httpx.post(f"{url}/v1/chat/completions", json=chat_body,
                      timeout=20).status_code == 200
    render = httpx.post(f"{url}/v1/completions/render", json=body, timeout=20).json()
    assert render[0]["token_ids"] == list(b"Hi")


def test_the_prefix_cache_counters_count_a_repeated_prompt(replicas):
    """``/metrics``' prefix-cache counters (what ``make compare-routers`` reads): a 40-byte
    prompt sent twice is 80 tokens queried, and the second finds its 2 whole blocks of 16."""
    url = replicas.urls[0]

    def counters():
        page = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
        return (page["llminfra_prefix_cache_queries_total"],
                page["llminfra_prefix_cache_hits_total"])
    q0, h0 = counters()
    prompt = "".join(chr(33 + (7 * i) % 90) for i in range(40))
    for _ in range(2):
        completion(client(url), prompt)
    q1, h1 = counters()
    assert (q1 - q0, h1 - h0) == (80, 32)


def send_all(url: str, prompts: list[str]) -> list[tuple]:
    """``(status, seconds)`` of each prompt sent in turn through ``url``: ``"ok"`` or the HTTP
    status of the failure."""
    c, rows = client(url, timeout=15), []
    for prompt in prompts:
        t0 = time.perf_counter()
        try:
            completion(c, prompt)
            rows.append(("ok", round(time.perf_counter() - t0, 3)))
        except openai.APIStatusError as e:
            rows.append((e.status_code, round(time.perf_counter() - t0, 3)))
    return rows


def failures_seen(router: RealRouter, worker_url: str) -> float:
    """Calls to ``worker_url`` that failed, by the router's own circuit-breaker counter on its
    Prometheus page (``vllm_router_cb_outcomes_total`` / ``smg_worker_cb_outcomes_total``)."""
    page = parse_metrics(httpx.get(f"http://127.0.0.1:{router.prometheus_port}/metrics",
                                   timeout=10).text)
    key = f'cb_outcomes_total{{worker="{worker_url}",outcome="failure"}}'
    return sum(v for k, v in page.items() if k.endswith(key))


def test_a_replica_killed_mid_run(routers, replicas, record_property):
    """Replica 1 is killed (SIGKILL, a crash) mid-run while each router still holds it healthy
    (their health check runs every 60 s by default). Under round robin the dead replica is
    surely chosen: each router's call to it fails (its own counter says so), it retries on the
    survivor, and every request is answered within seconds. Under cache_aware a request whose
    prefix points at the dead replica is retried there and may fail (a 5xx) until the circuit
    breaker opens. Recorded per router and policy: each request's status and time."""
    rr = {name: RealRouter(name, replicas.urls, replicas.log_dir, policy="round_robin").start()
          for name in ROUTERS}
    try:
        for r in list(rr.values()) + list(routers.values()):  # both replicas in use before
            send_all(r.url, [f"before {i} " for i in range(4)])
        replicas.kill(1)
        outcomes = {}
        for name in ROUTERS:
            outcomes[f"{name} round_robin"] = send_all(rr[name].url,
                                                       [f"after {i} " for i in range(8)])
            outcomes[f"{name} cache_aware"] = send_all(routers[name].url,
                                                       [f"before {i} again" for i in range(4)]
                                                       + [f"after {i} " for i in range(4)])
        dead_calls = {name: failures_seen(r, replicas.urls[1]) for name, r in rr.items()}
    finally:
        for r in rr.values():
            r.stop()
    record_property("after_kill", outcomes)
    print("replica 1 killed; each request's status and seconds:", outcomes,
          "; failed calls to it counted by the round-robin routers:", dead_calls)
    for name in ROUTERS:
        assert dead_calls[name] >= 1, f"{name} never tried the dead replica"
        assert all(s == "ok" and t < 10 for s, t in outcomes[f"{name} round_robin"]), outcomes
        rows = outcomes[f"{name} cache_aware"]
        assert all(s == "ok" or 500 <= s < 600 for s, _ in rows), rows
        assert all(t < 10 for _, t in rows) and all(s == "ok" for s, _ in rows[-4:]), rows
