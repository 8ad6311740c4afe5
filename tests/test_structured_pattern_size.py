"""A pattern is bounded by the size it compiles to, not only by its nested repeats (issue 54):
``^(a{9999}){…}`` was refused, but ``a{9999}`` written 100 times in a row (a 702-byte regex)
passed the repeat check — it multiplies nested counts only — and llguidance then failed the
request mid-answer with "too many expressions constructed", a 500. :func:`pattern_size` adds a
sequence, adds an alternation's branches and multiplies nesting; past
:data:`MAX_PATTERN_SIZE` the schema is refused: a ``ValueError`` at the function, a 400 naming
``response_format`` with the reason at the server."""

import json

import httpx
import pytest

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.engine.sampling_params import InvalidParameter
from llminfra.engine.structured import (MAX_PATTERN_REPEATS, MAX_PATTERN_SIZE, check_json_schema,
                                        check_schema_shape, json_matcher, pattern_repeats,
                                        pattern_size)
from llminfra.model import ByteTokenizer, load_tiny

#: the red team's regex: 702 bytes, each repeat under MAX_PATTERN_REPEATS, 999,900 in all
SEQUENCE_OF_REPEATS = "^" + "a{9999}" * 100 + "$"


def string_schema(pattern: str) -> dict:
    return {"type": "string", "pattern": pattern}


@pytest.mark.parametrize("pattern, size", [
    ("abc", 3), ("^abc$", 3), ("a{3}b", 4), ("(ab|c){10}", 30), ("a|b|c", 3),
    ("(a{10}|b{20}){3}", 90), ("((a{10}){10}){10}", 1000), ("[a-z]{1,64}@x", 66),
    (r"\d{4}-\d{2}", 7), ("[{]{5}", 5), (r"\{1000}", 6), ("(?:ab)+", 2), ("a*b?c+", 3),
    ("(a(b)", 2), ("a{2,}", 2), ("a{" + "9" * 5000 + "}", 10 ** 12),
    (SEQUENCE_OF_REPEATS, 999_900)])
def test_pattern_size(pattern, size):
    assert pattern_size(pattern) == size


def test_the_sequence_passed_the_repeat_check_alone():
    """Why the old rule let it through: its nested product is under the repeat limit."""
    assert len(SEQUENCE_OF_REPEATS) == 702
    assert pattern_repeats(SEQUENCE_OF_REPEATS) == 9999 <= MAX_PATTERN_REPEATS
    assert pattern_size(SEQUENCE_OF_REPEATS) > MAX_PATTERN_SIZE


@pytest.mark.parametrize("pattern", [SEQUENCE_OF_REPEATS, "(a{40}|b{40}|c{40}){200}",
                                     "x" * 20_001, "(a{5000}b{5000}c){2}"])
def test_patterns_past_the_size_are_refused_with_the_reason(pattern):
    with pytest.raises(ValueError, match=f"at most {MAX_PATTERN_SIZE:,} are accepted") as err:
        check_schema_shape(string_schema(pattern))
    assert f"expands to {pattern_size(pattern):,} items" in str(err.value)
    with pytest.raises(InvalidParameter, match="expands to") as err:
        check_json_schema(string_schema(pattern), ByteTokenizer())
    assert err.value.param == "response_format"


def test_the_size_limit_holds_at_its_boundary_and_what_passes_compiles():
    """Exactly MAX_PATTERN_SIZE is accepted and the grammar engine serves it (a matcher that
    walks 50 characters); one more is refused."""
    half = MAX_PATTERN_SIZE // 2
    at = f"^a{{{half}}}b{{{MAX_PATTERN_SIZE - half}}}$"
    check_schema_shape(string_schema(at))
    m = json_matcher(ByteTokenizer(), 256, [], string_schema(at))
    for ch in '"' + "a" * 50:
        m.advance(ord(ch))
    assert not m.finished()
    with pytest.raises(ValueError, match="expands to"):
        check_schema_shape(string_schema(f"^a{{{half}}}b{{{MAX_PATTERN_SIZE - half}}}c$"))


def test_patterns_in_pattern_properties_are_sized_too():
    with pytest.raises(ValueError, match="expands to 999,900"):
        check_schema_shape({"type": "object",
                            "patternProperties": {SEQUENCE_OF_REPEATS: {"type": "integer"}}})


def test_the_engine_refuses_it_when_the_request_comes(one_thread):
    model, tok = load_tiny()
    engine = LLMEngine(model, tok, num_blocks=16)
    with pytest.raises(InvalidParameter, match="expands to") as err:
        engine.add_request("a", SamplingParams(max_tokens=4,
                                               json_schema=string_schema(SEQUENCE_OF_REPEATS)))
    assert err.value.param == "response_format" and not engine.requests


def test_the_server_answers_400_with_the_message(one_thread):
    from llminfra.serving.background import ServerThread
    from llminfra.serving.serve import build_engine
    from llminfra.serving.server import create_app
    engine = build_engine(num_threads=1)
    app = create_app(engine, engine.tokenizer, model_name="m")

    def post(schema):
        body = {"model": "m", "prompt": "a", "max_tokens": 4, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        return httpx.post(f"{srv.base_url}/v1/completions", content=json.dumps(body),
                          headers={"content-type": "application/json"}, timeout=60)
    with ServerThread(app) as srv:
        r = post(string_schema(SEQUENCE_OF_REPEATS))
        assert r.status_code == 400, (r.status_code, r.text[:300])
        err = r.json()["error"]
        assert err["param"] == "response_format"
        assert "expands to 999,900 items" in err["message"], err
        assert post(string_schema("^a{3}$")).status_code == 200       # the server lives on
