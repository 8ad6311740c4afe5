"""The OpenAI surface beyond the basics: logprobs, penalties, logit bias and min-p in the engine
(checked against a step-by-step reference on the tiny model) and through the server with the
official ``openai`` client; unknown or unimplemented fields are refused, never ignored."""

import json
import math

import openai
import pytest
import torch

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import ByteTokenizer, ModelConfig, Transformer, load_tiny
from llminfra.model.sampling import apply_penalties
from llminfra.serving.background import ServerThread
from llminfra.serving.serve import build_engine
from llminfra.serving.server import create_app

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=96)
TOK = ByteTokenizer()
MODEL = "m"


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def model64():
    return Transformer(CFG, generator=torch.Generator().manual_seed(3)).double().eval()


def _reference(model, prompt, n, **penalties):
    """Greedy decoding by hand: the whole sequence through the model each step, the penalties
    applied to the last row, argmax."""
    ids, out = list(TOK.encode(prompt)), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids + out]))[0, -1]
            out.append(int(apply_penalties(logits, ids, out, **penalties).argmax()))
    return out


@pytest.mark.parametrize("penalties", [dict(presence_penalty=1.5),
                                       dict(frequency_penalty=0.7),
                                       dict(repetition_penalty=1.8),
                                       dict(logit_bias={ord("z"): 3.0}),
                                       dict(presence_penalty=-1.0, repetition_penalty=0.7)])
def test_penalties_match_a_step_by_step_reference(model64, penalties):
    engine = LLMEngine(model64, TOK)
    prompt = "abcabc abc"
    got = engine.generate(prompt, SamplingParams(max_tokens=24, ignore_eos=True,
                                                 **penalties))[0].outputs[0].token_ids
    assert got == _reference(model64, prompt, 24, **penalties)
    plain = engine.generate(prompt, SamplingParams(max_tokens=24, ignore_eos=True))[0]
    assert plain.outputs[0].token_ids != got, "the penalty was meant to change the output"


def test_logit_bias_forces_a_token_and_min_p_keeps_likely_ones(model64):
    engine = LLMEngine(model64, TOK)
    forced = engine.generate("hello", SamplingParams(max_tokens=10, ignore_eos=True,
                                                     logit_bias={ord("Q"): 100.0}))[0]
    assert forced.outputs[0].text == "Q" * 10
    outs = engine.generate(["hello"] * 40, [SamplingParams(max_tokens=1, temperature=1.5,
                                                           min_p=0.3, seed=s, logprobs=0)
                                            for s in range(40)])
    for o in outs:                       # every drawn token is at least 0.3 x the most likely
        (tok, lp, _), = o.outputs[0].logprobs
        with torch.no_grad():
            best = torch.log_softmax(model64(torch.tensor([TOK.encode("hello")]))[0, -1]
                                     .float() / 1.5, -1).max()
            mine = torch.log_softmax(model64(torch.tensor([TOK.encode("hello")]))[0, -1]
                                     .float() / 1.5, -1)[tok]
        assert float(mine) >= float(best) + math.log(0.3) - 1e-6


def test_logprobs_are_the_models_log_softmax(model64):
    engine = LLMEngine(model64, TOK)
    out = engine.generate("abc", SamplingParams(max_tokens=5, ignore_eos=True,
                                                logprobs=3))[0].outputs[0]
    assert len(out.logprobs) == 5
    ids = TOK.encode("abc")
    with torch.no_grad():
        lp = torch.log_softmax(model64(torch.tensor([ids + out.token_ids]))[0].float(), -1)
    for k, (tok, logprob, top) in enumerate(out.logprobs):
        row = lp[len(ids) - 1 + k]
        assert tok == out.token_ids[k] and abs(logprob - float(row[tok])) < 1e-6
        assert [i for i, _ in top] == torch.topk(row, 3).indices.tolist()
        assert top[0][0] == tok                         # greedy: the chosen one is the best


@pytest.fixture(scope="module")
def server():
    engine = build_engine()
    with ServerThread(create_app(engine, engine.tokenizer, model_name=MODEL)) as srv:
        yield srv


@pytest.fixture
def api(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_chat_logprobs_through_the_client(api):
    msgs = [{"role": "user", "content": "Return the length."}]
    r = api.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0,
                                    logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 12
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].token == item.token          # greedy
        assert bytes(item.bytes).decode("utf-8", "replace") == item.token
    assert "".join(i.token for i in content) == r.choices[0].message.content
    streamed = [c.choices[0].logprobs for c in api.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=12, temperature=0, logprobs=True,
        top_logprobs=3, stream=True) if c.choices and c.choices[0].logprobs]
    tokens = [i.token for lp in streamed for i in lp.content]
    assert tokens == [i.token for i in content]


def test_completion_logprobs_and_penalties_through_the_client(api):
    prompt = "def json.dumps(obj)\n\nReturn "
    r = api.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                               logprobs=2, echo=True)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 16
    assert lp.text_offset[0] == len(prompt)
    assert prompt + "".join(lp.tokens) == r.choices[0].text
    plain = api.completions.create(model=MODEL, prompt=prompt, max_tokens=40,
                                   temperature=0).choices[0].text
    pen = api.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                 frequency_penalty=1.5, presence_penalty=0.5).choices[0].text
    assert pen != plain
    model, tok = load_tiny()
    want = LLMEngine(model, tok).generate(prompt, SamplingParams(
        max_tokens=40, frequency_penalty=1.5, presence_penalty=0.5))[0].outputs[0].text
    assert pen == want


def test_n_with_seed_is_reproducible_and_text_format_accepted(api):
    kw = dict(model=MODEL, prompt="Return ", max_tokens=12, temperature=1.0, n=3, seed=11,
              extra_body={"response_format": {"type": "text"}})
    a = [c.text for c in api.completions.create(**kw).choices]
    b = [c.text for c in api.completions.create(**kw).choices]
    assert a == b and len(set(a)) > 1


@pytest.mark.parametrize("extra,param", [({"tools": [{"type": "function"}]}, "tools"),
                                         ({"response_format": {"type": "json_schema"}},
                                          "response_format"),
                                         ({"best_of": 2}, "best_of"),
                                         ({"min_p": 1.5}, "min_p")])
def test_what_is_not_implemented_is_refused_by_name(api, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        api.completions.create(model=MODEL, prompt="a", max_tokens=2, extra_body=extra)
    assert e.value.body["param"] == param


SMALL_SCHEMA = {"type": "object",
                "properties": {"ok": {"type": "boolean"},
                               "n": {"type": "integer", "minimum": 0, "maximum": 9},
                               "tag": {"enum": ["a", "bb", "ccc"]}},
                "required": ["ok", "n", "tag"], "additionalProperties": False}


def _matches_small(obj) -> bool:
    return (set(obj) == {"ok", "n", "tag"} and isinstance(obj["ok"], bool)
            and type(obj["n"]) is int and 0 <= obj["n"] <= 9 and obj["tag"] in ("a", "bb", "ccc"))


def test_json_schema_output_always_parses_through_the_client(api):
    """Greedy and 12 seeded samples, streamed and not: every answer is JSON matching the schema
    (the tiny byte model, which knows nothing of JSON: the mask alone makes it so)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL_SCHEMA}}
    msgs = [{"role": "user", "content": "Give me a small JSON object."}]
    answers = []
    for seed in [None] + list(range(12)):
        r = api.chat.completions.create(model=MODEL, messages=msgs, max_tokens=60,
                                        temperature=0 if seed is None else 1.0, seed=seed,
                                        response_format=fmt)
        assert r.choices[0].finish_reason == "stop"
        answers.append(r.choices[0].message.content)
    streamed = "".join(c.choices[0].delta.content or "" for c in api.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=60, temperature=0, response_format=fmt,
        stream=True) if c.choices)
    assert streamed == answers[0]
    for text in answers:
        assert _matches_small(json.loads(text)), text
    assert len(set(answers)) > 1                       # sampling still samples


def test_json_object_and_bad_schemas(api):
    r = api.completions.create(model=MODEL, prompt="{", max_tokens=120, temperature=0,
                               extra_body={"response_format": {"type": "json_object"}})
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.text), dict)
    else:                                   # cut by max_tokens: a prefix of an object
        assert c.finish_reason == "length" and c.text.startswith("{")
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}],
                                    response_format={"type": "json_schema", "json_schema": {
                                        "name": "x", "schema": {"type": "nonsense"}}})
    assert e.value.body["param"] == "response_format"


@pytest.mark.slow
def test_json_schema_on_the_real_model(smollm2):
    """SmolLM2 asked for a person: the engine's output parses and matches the schema, greedy
    and sampled; the unconstrained answer to the same question is not JSON."""
    model, tok = smollm2
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    prompt = tok.apply_chat_template([{"role": "user", "content": "Describe a person."}],
                                     add_generation_prompt=True)
    engine = LLMEngine(model, tok)
    outs = engine.generate([prompt] * 3, [SamplingParams(max_tokens=48, json_schema=schema),
                                          SamplingParams(max_tokens=48, json_schema=schema,
                                                         temperature=0.8, seed=1),
                                          SamplingParams(max_tokens=48)])
    for o in outs[:2]:
        assert o.outputs[0].finish_reason == "stop"
        obj = json.loads(o.outputs[0].text)
        assert set(obj) == {"name", "age"} and isinstance(obj["name"], str) \
            and type(obj["age"]) is int
    with pytest.raises(json.JSONDecodeError):
        json.loads(outs[2].outputs[0].text)
