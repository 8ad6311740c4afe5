"""One rule on a request's length (:func:`llminfra.engine.sampling_params.max_tokens_for`),
applied alike by ``LLMEngine.add_request`` and by the OpenAI-compatible server: the boundary (a request that
exactly fills the context, or the KV pool, is served; one token more is refused),
``max_tokens = None`` takes the room left, and the engine and the server refuse the same
request naming the same field with the same message.

The server runs in process (FastAPI's ``TestClient``) on the trained tiny model, whose context
is 256 tokens; the engine called directly is a twin of the server's (same model, same pool)."""

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings, strategies as st

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.engine.sampling_params import (CONTEXT_LENGTH_EXCEEDED, KV_CACHE_EXCEEDED,
                                             InvalidParameter, RequestTooLong, max_tokens_for)
from llminfra.model import load_tiny
from llminfra.serving.server import create_app

MODEL = "llminfra-tiny"
CONTEXT = 256                 # the tiny model's max_seq_len
BLOCK = 16


# ------------------------------------------------------------------------ the rule alone
@pytest.mark.parametrize("n_prompt,max_tokens,kv_pool,expected", [
    (250, 6, None, 6),            # 250 + 6 = 256: exactly the context
    (255, 1, None, 1),            # the longest prompt: one token of room
    (250, None, None, 6),         # None: the room of the context
    (100, 28, (8, 16), 28),       # 100 + 28 = 128 = 8 blocks of 16: exactly the pool
    (100, None, (8, 16), 28),     # None: the room of the pool, smaller than the context's
    (250, None, (64, 16), 6),     # None: the context's room, smaller than the pool's
])
def test_exactly_full_is_accepted_and_none_takes_the_room(n_prompt, max_tokens, kv_pool,
                                                          expected):
    assert max_tokens_for(n_prompt, max_tokens, CONTEXT, kv_pool) == expected


@pytest.mark.parametrize("n_prompt,max_tokens,kv_pool,param,code,allowed", [
    (250, 7, None, "max_tokens", CONTEXT_LENGTH_EXCEEDED, "max_tokens may be at most 6"),
    (256, 1, None, "prompt", CONTEXT_LENGTH_EXCEEDED, "a prompt may have at most 255"),
    (256, None, None, "prompt", CONTEXT_LENGTH_EXCEEDED, "a prompt may have at most 255"),
    (100, 29, (8, 16), "max_tokens", KV_CACHE_EXCEEDED, "max_tokens may be at most 28"),
    (128, 1, (8, 16), "prompt", KV_CACHE_EXCEEDED, "at most 127 prompt tokens fit"),
    (128, 200, (8, 16), "prompt", KV_CACHE_EXCEEDED, "at most 127 prompt tokens fit"),
])
def test_one_more_is_refused_naming_the_field_the_value_and_the_limit(
        n_prompt, max_tokens, kv_pool, param, code, allowed):
    with pytest.raises(RequestTooLong) as err:
        max_tokens_for(n_prompt, max_tokens, CONTEXT, kv_pool)
    assert (err.value.param, err.value.code) == (param, code)
    assert allowed in str(err.value) and str(n_prompt) in str(err.value)
    assert isinstance(err.value, InvalidParameter) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("n_prompt,max_tokens,param", [
    (0, 4, "prompt"), (3, 0, "max_tokens"), (3, True, "max_tokens"), (3, 2.0, "max_tokens"),
])
def test_an_empty_prompt_or_a_bad_max_tokens_is_refused(n_prompt, max_tokens, param):
    with pytest.raises(InvalidParameter) as err:
        max_tokens_for(n_prompt, max_tokens, CONTEXT, (8, 16), prompt_param="prompt")
    assert err.value.param == param and getattr(err.value, "code", None) is None


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 80), m=st.none() | st.integers(1, 80), context=st.integers(2, 64),
       pool=st.none() | st.tuples(st.integers(1, 10), st.integers(1, 8)))
def test_random_requests_follow_the_formula(n, m, context, pool):
    """Accepted iff 1 <= n and n + max_tokens <= min(C, B * b), max_tokens None meaning the
    whole room; a refusal names the prompt iff the prompt alone leaves no room."""
    cap = context if pool is None else min(context, pool[0] * pool[1])
    try:
        got = max_tokens_for(n, m, context, pool)
    except InvalidParameter as e:
        prompt_at_fault = n < 1 or n >= cap
        assert prompt_at_fault or n + m > cap, (n, m, context, pool)
        assert e.param == ("prompt" if prompt_at_fault else "max_tokens"), (n, m, context, pool)
        return
    assert 1 <= n < cap and got == (cap - n if m is None else m), (n, m, context, pool)


# ------------------------------------------------------------- the engine and the server
@pytest.fixture(scope="module")
def tiny(one_thread):
    return load_tiny()


def _twins(tiny, num_blocks: int, **app_settings):
    """An engine to call directly, and a server (TestClient) on a twin engine."""
    model, tok = tiny
    direct, served = (LLMEngine(model, tok, num_blocks=num_blocks, block_size=BLOCK,
                                max_num_seqs=4) for _ in range(2))
    return direct, TestClient(create_app(served, tok, model_name=MODEL, **app_settings))


@pytest.fixture(scope="module")
def roomy(tiny):
    """A pool of 32 blocks of 16 = 512 tokens: the context (256) is the limit."""
    direct, client = _twins(tiny, 32)
    with client:                         # starts the server's engine loop
        yield direct, client


@pytest.fixture(scope="module")
def small_pool(tiny):
    """A pool of 8 blocks of 16 = 128 tokens, below the context: the pool is the limit."""
    direct, client = _twins(tiny, 8)
    with client:
        yield direct, client


def _engine_answer(engine, n_prompt, max_tokens):
    """``(param, message)`` of the engine's refusal, or None (the request is then aborted)."""
    try:
        rid = engine.add_request([97] * n_prompt, SamplingParams(max_tokens=max_tokens))
    except InvalidParameter as e:
        return e.param, str(e)
    engine.abort_request(rid)
    engine.step()
    return None


def _server_answer(client, n_prompt, max_tokens):
    body = {"model": MODEL, "prompt": [97] * n_prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    return client.post("/v1/completions", json=body)


@pytest.mark.parametrize("setup,n_prompt,max_tokens,code", [
    ("roomy", 250, 7, CONTEXT_LENGTH_EXCEEDED),
    ("roomy", 256, 1, CONTEXT_LENGTH_EXCEEDED),
    ("roomy", 300, None, CONTEXT_LENGTH_EXCEEDED),
    ("small_pool", 100, 29, KV_CACHE_EXCEEDED),
    ("small_pool", 128, None, KV_CACHE_EXCEEDED),
    ("small_pool", 200, 1, KV_CACHE_EXCEEDED),
])
def test_engine_and_server_refuse_the_same_request_for_the_same_reason(
        request, setup, n_prompt, max_tokens, code):
    engine, client = request.getfixturevalue(setup)
    refusal = _engine_answer(engine, n_prompt, max_tokens)
    assert refusal is not None, "the engine accepted it"
    r = _server_answer(client, n_prompt, max_tokens)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["message"]) == refusal
    assert err["code"] == code


@pytest.mark.parametrize("setup,n_prompt,max_tokens,expected", [
    ("roomy", 250, 6, 6),            # exactly the context
    ("roomy", 255, None, 1),         # the room of the context
    ("small_pool", 100, 28, 28),     # exactly the pool
    ("small_pool", 100, None, 28),   # the room of the pool
])
def test_engine_and_server_serve_what_exactly_fits(request, setup, n_prompt, max_tokens,
                                                   expected):
    engine, client = request.getfixturevalue(setup)
    out = engine.generate([[97] * n_prompt], SamplingParams(max_tokens=max_tokens,
                                                            ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == expected and out.finish_reason == "length"
    r = _server_answer(client, n_prompt, max_tokens)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == expected
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_a_server_may_serve_a_shorter_context_than_the_model(tiny):
    """``max_model_len = 64`` below the model's 256: the server applies the same rule with its
    own context (60 + 5 refused, None takes 4), while the engine alone serves 60 + 5."""
    engine, app = _twins(tiny, 32, max_model_len=64)
    assert _engine_answer(engine, 60, 5) is None
    with app as client:
        r = _server_answer(client, 60, 5)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "max_tokens"
        assert err["code"] == CONTEXT_LENGTH_EXCEEDED
        assert "maximum context length is 64" in err["message"] and "at most 4" in err["message"]
        r = _server_answer(client, 60, None)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_a_chat_prompt_too_long_names_messages(roomy):
    _, client = roomy
    r = client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "x" * 300}], "max_tokens": 4})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages"
    assert err["code"] == CONTEXT_LENGTH_EXCEEDED and err["message"].startswith("messages: ")
