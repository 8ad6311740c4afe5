"""Structured output cannot be turned into a 500 or a stall (issue 43): every schema the engine
could not serve is refused before the request is accepted, with the reason, quickly, and a
refused request leaves no bookkeeping behind. The cases are the red team's: a schema nested
300–470 deep, ``{"$ref": "#"}`` and two ``$defs`` that point at each other, a 900,000-character
``const``, ``^a{1000000}$``, an ``anyOf`` of 3,000 objects and the 17-character pattern
``^(a{1000}){1000}$`` (a million lexer states).

Schemas are refused by the rules of :mod:`llminfra.engine.structured`: at most
``MAX_SCHEMA_DEPTH`` nested objects/arrays, ``MAX_SCHEMA_CHARS`` characters,
``MAX_PATTERN_REPEATS`` repeats in a pattern, and llguidance's parser limits."""

import json
import sys
import time
from functools import partial

import httpx
import pytest

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.engine.sampling_params import InvalidParameter
from llminfra.engine.structured import (MAX_PATTERN_REPEATS, MAX_SCHEMA_CHARS, MAX_SCHEMA_DEPTH,
                                        check_json_schema, check_schema_shape, pattern_repeats)
from llminfra.model import ByteTokenizer
from llminfra.serving.async_engine import AsyncEngine
from llminfra.serving.background import ServerThread
from llminfra.serving.serve import build_engine
from llminfra.serving.server import create_app

MODEL = "m"


def nested(levels: int) -> dict:
    s = {"type": "string"}
    for _ in range(levels):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


#: name -> (schema, what the refusal says)
BAD = {
    "nested 300": (nested(300), "nested more than"),
    "nested 470": (nested(470), "nested more than"),
    "self $ref": ({"$ref": "#"}, "admits no JSON value"),
    "mutual $defs": ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                      "$ref": "#/$defs/a"}, "admits no JSON value"),
    "900k const": ({"const": "x" * 900_000}, "characters long"),
    "a{1000000}": ({"type": "string", "pattern": "^a{1000000}$"}, "repeats 1,000,000"),
    "anyOf 3000": ({"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                               "required": [f"k{i}"]} for i in range(3000)]},
                   "characters long"),
    "(a{1000}){1000}": ({"type": "string", "pattern": "^(a{1000}){1000}$"},
                        "repeats 1,000,000"),
    "patternProperties": ({"type": "object", "patternProperties": {"^(b{200}){200}$": {}}},
                          "repeats 40,000"),
    "not compilable": ({"type": "nonsense"}, "cannot compile"),
}

GOOD = [{"type": "object"},
        {"type": "object", "properties": {"name": {"type": "string"},
                                          "age": {"type": "integer"}}, "required": ["name"]},
        nested(MAX_SCHEMA_DEPTH // 2 - 1),
        {"type": "string", "pattern": "^a{1000}$"},
        {"type": "string", "pattern": "^(a{100}){100}$"},
        {"anyOf": [{"const": f"v{i}"} for i in range(400)]},
        {"$defs": {"node": {"type": "object", "properties": {
            "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}},
         "$ref": "#/$defs/node"}]        # recursive, but it admits {"next": null}


@pytest.fixture(scope="module")
def smollm2_tok():
    from llminfra.model.pretrained import load_tokenizer
    return load_tokenizer("smollm2-135m")[0]


@pytest.mark.parametrize("name", list(BAD))
@pytest.mark.parametrize("which", ["byte", "smollm2"])
def test_bad_schemas_are_refused_quickly_with_the_reason(name, which, smollm2_tok):
    tok = ByteTokenizer() if which == "byte" else smollm2_tok
    schema, reason = BAD[name]
    t0 = time.perf_counter()
    with pytest.raises(InvalidParameter, match=reason) as err:
        check_json_schema(schema, tok)
    assert err.value.param == "response_format"
    assert time.perf_counter() - t0 < 5.0, "the refusal took too long"


@pytest.mark.parametrize("k", range(len(GOOD)))
def test_reasonable_schemas_still_compile(k, smollm2_tok):
    check_json_schema(GOOD[k], smollm2_tok)
    check_json_schema(GOOD[k], ByteTokenizer())


def test_the_limits_hold_at_their_boundaries():
    depth_ok = {"a": [1]}
    for _ in range(MAX_SCHEMA_DEPTH - 2):
        depth_ok = {"a": depth_ok}
    check_schema_shape(depth_ok)                           # exactly MAX_SCHEMA_DEPTH deep
    with pytest.raises(ValueError, match="nested more than"):
        check_schema_shape({"a": depth_ok})
    pad = MAX_SCHEMA_CHARS - len(json.dumps({"const": ""}, separators=(",", ":")))
    check_schema_shape({"const": "x" * pad})
    with pytest.raises(ValueError, match="characters long"):
        check_schema_shape({"const": "x" * (pad + 1)})
    check_schema_shape({"pattern": f"^a{{{MAX_PATTERN_REPEATS}}}$"})
    with pytest.raises(ValueError, match="repeats"):
        check_schema_shape({"pattern": f"^a{{{MAX_PATTERN_REPEATS + 1}}}$"})


def test_a_python_schema_that_contains_itself_is_refused_not_a_recursion_error():
    s = {"type": "object"}
    s["properties"] = {"self": s}
    with pytest.raises(ValueError, match="nested more than"):
        check_schema_shape(s)
    with pytest.raises(ValueError, match="JSON values only"):
        check_schema_shape({"const": object()})
    with pytest.raises(ValueError, match="must be an object"):
        check_schema_shape([{"type": "object"}])


@pytest.mark.parametrize("pattern, repeats", [
    ("abc", 1), ("a{3}", 3), ("(a{2}b){5}", 10), ("(x{4}){5}y{30}", 30),
    ("^(a{1000}){1000}$", 1_000_000), ("[{]{5}", 5), (r"\{1000}", 1), ("a{2,7}", 7),
    ("((a{10}){10}){10}", 1000), ("(a{10}|b{20}){3}", 60), ("[a-z]{1,64}@x", 64),
    ("a{" + "9" * 5000 + "}", 10 ** 12)])
def test_pattern_repeats(pattern, repeats):
    assert pattern_repeats(pattern) == repeats


def test_the_engine_refuses_them_too(one_thread):
    """The engine's own ``add_request`` (no server in front) refuses with the same reasons."""
    engine = build_engine(num_threads=1)
    for name in ("self $ref", "nested 470", "(a{1000}){1000}"):
        schema, reason = BAD[name]
        with pytest.raises(InvalidParameter, match=reason):
            engine.add_request("a", SamplingParams(max_tokens=4, json_schema=schema))
    assert not engine.has_unfinished_requests()


class _Unpicklable:
    def __reduce__(self):
        raise RecursionError("maximum recursion depth exceeded while pickling an object")


def test_a_request_that_cannot_be_sent_leaves_no_bookkeeping(one_thread):
    """A command the transport refuses (the engine process pickles it) fails that request
    with a ValueError and registers nothing in ``_streams`` / ``_pending``."""
    import asyncio
    loop = AsyncEngine(build_engine(num_threads=1)).start()
    sent = loop._send

    def pickling_send(msg):
        if msg is not None and msg[0] == "add":
            import pickle
            pickle.dumps(msg)
        sent(msg)
    loop._send = pickling_send

    async def go():
        for i in range(50):
            with pytest.raises(ValueError, match="cannot be sent"):
                await loop.generate([1, 2], _Unpicklable(), f"r{i}")
        stream = await loop.generate([1, 2], SamplingParams(max_tokens=2), "ok")
        return [o async for o in stream]
    try:
        outs = asyncio.run(go())
    finally:
        loop.stop()
    assert outs[-1].finished and not loop._streams and not loop._pending


def _post(srv, schema, timeout=60.0):
    body = {"model": MODEL, "prompt": "a", "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                       "schema": schema}}}
    # the client's own json.dumps recurses once per level: a 470-deep schema needs more than
    # the default limit where the test already runs deep in a stack (a pytest-xdist worker)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        content = json.dumps(body)
    finally:
        sys.setrecursionlimit(limit)
    return httpx.post(f"{srv.base_url}/v1/completions", timeout=timeout, content=content,
                      headers={"content-type": "application/json"})


def _engine():
    return build_engine(num_threads=1)


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request, one_thread):
    if request.param == "thread":
        engine = _engine()
        app = create_app(engine, engine.tokenizer, model_name=MODEL)
    else:
        from llminfra.serving.engine_process import EngineProcess
        app = create_app(EngineProcess(partial(_engine)), ByteTokenizer(), model_name=MODEL,
                         max_model_len=256)
    with ServerThread(app) as srv:
        srv.loop = app.state.service.loop
        yield srv


@pytest.mark.slow
def test_the_server_answers_400_with_the_reason_and_stays_alive(server):
    for name, (schema, reason) in BAD.items():
        t0 = time.perf_counter()
        r = _post(server, schema)
        assert r.status_code == 400, (name, r.status_code, r.text[:300])
        err = r.json()["error"]
        assert err["param"] == "response_format" and reason in err["message"], (name, err)
        assert time.perf_counter() - t0 < 10.0, name
    ok = _post(server, {"type": "object"})
    assert ok.status_code == 200, ok.text
    choice = ok.json()["choices"][0]
    if choice["finish_reason"] == "stop":                # complete: it parses as an object
        assert isinstance(json.loads(choice["text"]), dict)
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


@pytest.mark.slow
def test_refused_requests_leave_no_bookkeeping(server):
    for _ in range(100):
        assert _post(server, BAD["nested 470"][0]).status_code == 400
        assert _post(server, BAD["self $ref"][0]).status_code == 400
    assert not server.loop._streams and not server.loop._pending
