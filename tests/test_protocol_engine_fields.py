"""The allow list of engine fields routers forward (``vllm-router``, ``sglang-router``):
each accepted at the value this server honours, an ignored one at any value, a value that would
change the answer refused naming the field, and every other unknown field — a typo of one of
them included — still refused (:data:`llminfra.serving.router_fields.ENGINE_FIELDS`)."""

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from llminfra.serving import openai_protocol as api
from llminfra.serving.api_errors import APIError, validation_error

COMPLETION = {"model": "m", "prompt": "Hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
BOTH = [(api.CompletionRequest, COMPLETION), (api.ChatCompletionRequest, CHAT)]


def refusal(model, body) -> APIError:
    """The 400 the server answers ``body`` with (what FastAPI's handler makes of it)."""
    with pytest.raises(ValidationError) as e:
        model(**body)
    return validation_error(RequestValidationError(e.value.errors()))


@pytest.mark.parametrize("model,body", BOTH)
@pytest.mark.parametrize("name", list(api.ENGINE_FIELDS))
def test_engine_fields_at_the_honoured_value_are_accepted(model, body, name):
    honoured, _ = api.ENGINE_FIELDS[name]
    for value in ([honoured] if honoured is not None else [True, False]):
        assert getattr(model(**body, **{name: value}), name) is value


@pytest.mark.parametrize("name", list(api.CHAT_ENGINE_FIELDS))
def test_chat_fields_on_chat_only(name):
    honoured, _ = api.CHAT_ENGINE_FIELDS[name]
    for value in ([honoured] if honoured is not None else [True, False]):
        assert getattr(api.ChatCompletionRequest(**CHAT, **{name: value}), name) is value
    err = refusal(api.CompletionRequest, dict(COMPLETION, **{name: honoured or False}))
    assert err.status == 400 and err.param == name and "does not support" in str(err)


REFUSABLE = [(model, body, table, name) for model, body in BOTH
             for table in (api.ENGINE_FIELDS, api.CHAT_ENGINE_FIELDS)
             for name, (honoured, _) in table.items()
             if honoured is not None and (table is api.ENGINE_FIELDS or model is
                                          api.ChatCompletionRequest)]


@pytest.mark.parametrize("model,body,table,name", REFUSABLE)
def test_a_value_that_would_change_the_answer_is_refused_naming_it(model, body, table, name):
    honoured, meaning = table[name]
    err = refusal(model, dict(body, **{name: not honoured}))
    assert err.status == 400 and err.param == name
    assert "not supported" in str(err) and meaning[:40] in str(err)


@pytest.mark.parametrize("model,body", BOTH)
def test_the_bodies_routers_send_are_accepted(model, body):
    """What vllm-router 0.1.17 and sglang-router 0.3.2 add, as captured."""
    extra = {"no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
             "return_hidden_states": False}
    if model is api.ChatCompletionRequest:
        extra.update(continue_final_message=False, separate_reasoning=True,
                     stream_reasoning=True, include_reasoning=True)
    model(**body, **extra)


@pytest.mark.parametrize("model,body", BOTH)
@pytest.mark.parametrize("typo", ["no_stop_trimm", "skip_special_token", "ignoreeos", "tools"])
def test_other_unknown_fields_are_still_refused(model, body, typo):
    err = refusal(model, dict(body, **{typo: False}))
    assert err.status == 400 and err.param == typo and "does not support" in str(err)


@pytest.mark.parametrize("model,body", BOTH)
def test_engine_fields_are_strict_booleans(model, body):
    err = refusal(model, dict(body, skip_special_tokens="yes"))
    assert err.status == 400 and err.param == "skip_special_tokens"
