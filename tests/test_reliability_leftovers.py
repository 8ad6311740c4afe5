"""Issue 43's leftovers: the engine refuses what is not a token id and a lone surrogate with a
clear error, automatic request ids never collide with explicit ones, and the cost and
roofline calculators refuse inputs whose answer would be ``inf`` (the CLI already did)."""

import math

import numpy as np
import pytest
import torch

from llminfra.calc import cost
from llminfra.calc.roofline import Roofline, decode_tokens_per_s, step_time_s
from llminfra.engine import LLMEngine, SamplingParams
from llminfra.engine.sampling_params import InvalidParameter
from llminfra.model import load_tiny
from llminfra.validate import non_negative_finite, positive_finite


@pytest.fixture(scope="module")
def engine(one_thread):
    model, tok = load_tiny()
    return LLMEngine(model, tok, num_blocks=32)


@pytest.mark.parametrize("prompt", [[104.7, 105.2], ["104", "105"], [104.0, 105.0],
                                    [True, 104], [None], [104, b"x"]])
def test_what_is_not_a_token_id_is_refused(engine, prompt):
    with pytest.raises(InvalidParameter, match="token ids must be integers") as err:
        engine.add_request(prompt, SamplingParams(max_tokens=1))
    assert err.value.param == "prompt" and not engine.requests


def test_integer_ids_of_any_integer_type_are_taken(engine):
    ids = [engine.add_request(p, SamplingParams(max_tokens=1))
           for p in ([104, 105], np.array([104, 105]), torch.tensor([104, 105]),
                     (np.int64(104), 105))]
    while engine.has_unfinished_requests():
        engine.step()
    assert len(set(ids)) == 4
    with pytest.raises(InvalidParameter, match="list of token ids"):
        engine.add_request(torch.tensor([1.5, 2.5]), SamplingParams(max_tokens=1))


def test_a_lone_surrogate_is_a_clear_error(engine):
    with pytest.raises(InvalidParameter, match="not valid Unicode text.*surrogates") as err:
        engine.add_request("abc\ud800", SamplingParams(max_tokens=1))
    assert err.value.param == "prompt" and not engine.requests


def test_the_real_tokenizer_names_a_lone_surrogate():
    from llminfra.model.pretrained import load_tokenizer
    tok = load_tokenizer("smollm2-135m")[0]
    with pytest.raises(UnicodeEncodeError):
        tok.encode("abc\ud800")
    with pytest.raises(UnicodeEncodeError):
        tok.encode_chat([{"role": "user", "content": "abc\udfff"}])


def test_explicit_ids_do_not_collide_with_automatic_ones(engine):
    p = SamplingParams(max_tokens=2)
    n = len(engine.requests)
    taken = [engine.add_request([104], p, request_id=str(k)) for k in range(20)]
    auto = [engine.add_request([104], p) for _ in range(5)]
    assert len(set(taken + auto)) == 25 and len(engine.requests) == n + 25
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([104], p, request_id=auto[0])
    while engine.has_unfinished_requests():
        engine.step()


# ---------------------------------------------------------------- calculators
@pytest.mark.parametrize("call", [
    lambda: cost.api_monthly_cost(1e308, 2000, 500, 3, 15),
    lambda: cost.selfhost_cost_per_million_tokens(2, 5e-324),
    lambda: cost.selfhost_monthly_tokens(1e308, days=1e10),
    lambda: cost.gpu_rental_monthly_cost(1e308, n_gpus=8),
    lambda: cost.break_even_tokens_per_month(1e308, 1e-300),
    lambda: cost.power_monthly_cost(1e308, 1.5, 1e10),
    lambda: cost.blended_price_per_million(1e308, 1e308, 10, 10),
    lambda: cost.months_to_pay_back(1e308, 1e-300, 0),
])
def test_cost_refuses_what_would_be_inf(call):
    with pytest.raises(ValueError, match="overflows"):
        call()


@pytest.mark.parametrize("n_gpus", [0.5, 1.5, 0, -1, True, math.inf, math.nan])
def test_gpus_come_whole(n_gpus):
    with pytest.raises(ValueError, match="n_gpus"):
        cost.selfhost_cost_per_million_tokens(2, 1000, n_gpus=n_gpus)
    with pytest.raises(ValueError, match="n_gpus"):
        cost.gpu_rental_monthly_cost(2, n_gpus=n_gpus)


def test_whole_gpus_as_floats_still_work():
    """2.0 GPUs is 2 (the CLI passes ints; a notebook may pass a float): 2 GPUs at 2 USD/h
    serving 1,000 tokens/s: 2 · 2 / 3.6 = 1.111 USD per million tokens."""
    assert cost.selfhost_cost_per_million_tokens(2, 1000, n_gpus=2.0) == pytest.approx(
        2 * 2 / 3.6)


@pytest.mark.parametrize("peak, bw", [(math.inf, 1e12), (1e15, math.inf), (math.nan, 1e12),
                                      (True, 1e12), (1e15, 0), (-1.0, 1e12), ("1e15", 1e12)])
def test_a_roofline_needs_finite_positive_rates(peak, bw):
    with pytest.raises(ValueError, match="finite number > 0"):
        Roofline("x", peak, bw)


def test_roofline_step_refuses_an_infinite_overhead_and_an_overflow():
    roof = Roofline("cpu", 1e11, 1e10)
    with pytest.raises(ValueError, match="overhead_s must be a finite number >= 0"):
        step_time_s("gpt2", roof, [(1, 1)], overhead_s=math.inf)
    with pytest.raises(ValueError, match="latency_s"):
        step_time_s("gpt2", roof, [(1, 1)], latency_s=-1.0)
    tiny = Roofline("slow", 5e-324, 5e-324)
    with pytest.raises(ValueError, match="overflows"):
        decode_tokens_per_s("gpt2", tiny, context=512)


@pytest.mark.parametrize("guard", [positive_finite, non_negative_finite])
@pytest.mark.parametrize("bad", [True, False, math.inf, -math.inf, math.nan, "1", None, -1])
def test_the_finite_number_guards(guard, bad):
    with pytest.raises(ValueError, match="must be a finite number"):
        guard("x", bad)
    assert guard("x", 3) == 3.0 and isinstance(guard("x", 3), float)
