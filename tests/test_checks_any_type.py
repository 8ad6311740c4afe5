"""Every checker whose answer is a number, or a tuple / list of numbers, accepts any type that
holds the right value (STYLE.md: "accepts any type holding the right value"): a Python int or
float, NumPy float64 / float32 / int64, a 0-d tensor (float64, float32, int64), a ``Fraction``
and a ``Decimal``.

The right answers are the solutions of ``solutions/NN_*.ipynb`` (their bodies copied here) or
the package functions the checkers compare against; each is wrapped so that it returns its
value in one type. A float32 answer holds the right value rounded to float32 (about 7 digits),
so it passes a check whose own tolerance is tighter (``rel=1e-9``); a count (bytes, parameters,
tokens, GPUs) must be exact, so it passes in any type that holds that whole number, fails with
a fraction however small, and fails (saying why) where float32 cannot hold it (above 2**24).
"""

import math
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from llminfra.calc.memory import inference_memory, kv_bytes_per_token, training_memory, weight_bytes
from llminfra.calc.params import param_count
from llminfra.calc.step import decode_arithmetic_intensity
from llminfra.course.checking import CheckFailed
from llminfra.course.checks import ch01, ch02, ch03, ch04, ch05, ch07, ch08, ch09, ch10, ch11
from llminfra.engine.spec_decode import accept_greedy, expected_tokens_per_step
from llminfra.kvcache.blocks import slot_mapping
from llminfra.kvcache.contiguous import contiguous_waste
from llminfra.parallel.expert_parallel import dispatch_counts
from llminfra.parallel.pipeline import bubble_fraction
from llminfra.planning import gpus_for_memory
from llminfra.quant.rtn import absmax_quantize
from llminfra.sim.goodput import goodput
from llminfra.sim.scheduling_rules import admit_fcfs, chunked_prefill_plan, ttft_tpot
from llminfra.specs import get_gpu, get_model
from llminfra.specs.formats import dtype_bytes


# ---- the solutions' bodies (where no package function has the exercise's signature) ---------
def activation_bytes_per_layer(seq_len, batch, hidden, heads, flash):
    stored = 34 * seq_len * batch * hidden
    return stored if flash else stored + 5 * heads * seq_len * seq_len * batch


def kv_sequence_gib(spec, context, kv_dtype):
    return kv_bytes_per_token(spec, kv_dtype) * context / 2**30


def largest_batch(model, gpu, context, dtype, kv_dtype, reserve_fraction):
    one = inference_memory(model, dtype, kv_dtype, context, batch=1)
    usable = get_gpu(gpu).memory_bytes * (1 - reserve_fraction)
    return max(0, math.floor((usable - one.weight_bytes - one.activation_bytes) / one.kv_bytes))


def layer_point(model, batch, context):
    spec = get_model(model)
    P = param_count(replace(spec, num_layers=2)) - param_count(replace(spec, num_layers=1))
    flops = batch * (2 * P + 4 * spec.num_heads * spec.head_dim * context)
    return flops / (2 * P + batch * context * kv_bytes_per_token(spec) / spec.num_layers)


def decode_bound(model, gpu, batch, context):
    spec, g = get_model(model), get_gpu(gpu)
    flops = batch * (2 * param_count(spec)
                     + 4 * spec.num_layers * spec.num_heads * spec.head_dim * context)
    nbytes = weight_bytes(spec) + batch * context * kv_bytes_per_token(spec)
    return batch / max(flops / (g.tflops("bf16") * 1e12), nbytes / g.hbm_bytes_per_s)


def monthly_api_cost(n, i, o, p_in, p_out, days):
    return n * days * (i * p_in + o * p_out) / 1e6


def selfhost_cost_per_million(gpu_hour_price, tokens_per_s, utilization, n_gpus):
    return n_gpus * gpu_hour_price / (tokens_per_s * 3600 * utilization) * 1e6


def break_even_requests_per_day(price, n_gpus, i, o, p_in, p_out, days):
    return n_gpus * price * 24 / ((i * p_in + o * p_out) / 1e6)


# ---- checker -> right answer ------------------------------------------------------------------
#: answers that are real numbers (a float, or a pair of them: TTFT and TPOT, None for one token)
REALS = {
    ch01.check_decode_intensity: decode_arithmetic_intensity,
    ch02.check_kv_sequence_gib: kv_sequence_gib,
    ch04.check_contiguous_waste: contiguous_waste,
    ch05.check_ttft_tpot: ttft_tpot,
    ch05.check_expected_tokens: expected_tokens_per_step,
    ch07.check_bubble: bubble_fraction,
    ch08.check_layer_point: layer_point,
    ch08.check_decode_bound: decode_bound,
    ch09.check_monthly_api_cost: monthly_api_cost,
    ch09.check_selfhost_cost_per_million: selfhost_cost_per_million,
    ch09.check_break_even_requests_per_day: break_even_requests_per_day,
    ch11.check_goodput: goodput,
}
#: answers that are counts (an int, or a list of ints, or a list of lists of ints)
COUNTS = {
    ch01.check_param_count: param_count,
    ch01.check_training_memory: lambda s, b, t: training_memory(s, b, t)["total"],
    ch01.check_activation_bytes: activation_bytes_per_layer,
    ch02.check_kv_bytes_per_token: kv_bytes_per_token,
    ch02.check_largest_batch: largest_batch,
    ch04.check_slot_mapping: slot_mapping,
    ch05.check_admission: admit_fcfs,
    ch05.check_chunked_prefill_plan: chunked_prefill_plan,
    ch05.check_accept_greedy: accept_greedy,
    ch10.check_gpus_for_memory: gpus_for_memory,
    ch11.check_dispatch_counts: dispatch_counts,
}

REAL_TYPES = {
    "float": float, "numpy float64": np.float64, "numpy float32": np.float32,
    "0-d float64 tensor": lambda v: torch.tensor(v, dtype=torch.float64),
    "0-d float32 tensor": lambda v: torch.tensor(v, dtype=torch.float32),
    "Fraction": Fraction, "Decimal": Decimal,
}
COUNT_TYPES = {"int": int, "numpy int64": np.int64,
               "0-d int64 tensor": lambda v: torch.tensor(v, dtype=torch.int64), **REAL_TYPES}
FLOAT32 = {"numpy float32", "0-d float32 tensor"}


def _each_number(value, convert):
    """``value`` with every number in it (nested in tuples and lists) passed to ``convert``."""
    if isinstance(value, (list, tuple)):
        return type(value)(_each_number(v, convert) for v in value)
    return value if value is None else convert(value)


def returning(kind: str, answer, types: dict, lost: list | None = None):
    """``answer`` with its numbers returned as ``types[kind]``; values the type cannot hold
    exactly are appended to ``lost``."""
    def convert(v):
        out = types[kind](v)
        if lost is not None and Fraction(float(out)) != Fraction(v):
            lost.append(v)
        return out
    return lambda *args, **kwargs: _each_number(answer(*args, **kwargs), convert)


def _name(checker) -> str:
    return f"{checker.__module__.rsplit('.', 1)[-1]}.{checker.__name__}"


@pytest.mark.parametrize("kind", REAL_TYPES)
@pytest.mark.parametrize("check", REALS, ids=_name)
def test_a_real_answer_of_any_type_passes(check, kind):
    """float32 included: it holds the right value to float32's precision, and a checker at
    rel=1e-9 (expected_tokens, ttft_tpot, goodput …) judges it at that precision — no more:
    1e-5 off still fails in float32."""
    assert check(returning(kind, REALS[check], REAL_TYPES), seed=11) > 0
    if kind in FLOAT32:
        off = lambda v: REAL_TYPES[kind](v * (1 + 1e-5) + 1e-5)  # noqa: E731
        with pytest.raises(CheckFailed, match="got .*expected"):
            check(lambda *a: _each_number(REALS[check](*a), off), seed=11)


@pytest.mark.parametrize("kind", COUNT_TYPES)
@pytest.mark.parametrize("check", COUNTS, ids=_name)
def test_a_count_of_any_type_that_holds_it_passes(check, kind):
    """A count passes in every type that holds the whole number exactly; float32 holds whole
    numbers only up to 2**24 (parameter and byte counts go above): then it fails, saying so."""
    lost = []
    learner = returning(kind, COUNTS[check], COUNT_TYPES, lost)
    if kind not in FLOAT32:
        assert check(learner, seed=11) > 0 and not lost
        return
    try:
        check(learner, seed=11)
    except CheckFailed as e:
        assert lost and "float32 holds whole numbers exactly only up to 16,777,216" in str(e)
    else:
        assert not lost


FRACTIONS = {
    "float": lambda v: v + 0.5, "numpy float64": lambda v: np.float64(v) + 0.5,
    "numpy float32": lambda v: np.float32(v) + np.float32(0.5),
    "0-d float64 tensor": lambda v: torch.tensor(v + 0.5, dtype=torch.float64),
    "Fraction": lambda v: Fraction(2 * v + 1, 2), "Decimal": lambda v: Decimal(v) + Decimal("0.5"),
}


def _first_plus_half(kind: str, answer):
    """``answer`` with half added to its first number (a count that is not a whole number)."""
    def wrong(*args, **kwargs):
        value = answer(*args, **kwargs)
        if isinstance(value, list) and value and isinstance(value[0], list):
            return [[FRACTIONS[kind](value[0][0])] + value[0][1:]] + value[1:]
        if isinstance(value, list):
            return [FRACTIONS[kind](value[0])] + value[1:] if value else value
        return FRACTIONS[kind](value)
    return wrong


#: ch01's counts go above 2**24, where float32 has no halves (x + 0.5 is a whole number)
BIG = (ch01.check_param_count, ch01.check_training_memory, ch01.check_activation_bytes)


@pytest.mark.parametrize("check, kind", [(c, k) for c in COUNTS for k in FRACTIONS
                                         if not (c in BIG and k == "numpy float32")],
                         ids=lambda x: _name(x) if callable(x) else x)
def test_a_count_with_a_fraction_fails_however_close(check, kind):
    """Half a byte on 10**10 bytes is within rel=1e-9, but no count has a fraction (and a
    token id of 6.5 is not token 6)."""
    with pytest.raises(CheckFailed, match="whole number"):
        check(_first_plus_half(kind, COUNTS[check]), seed=11)


@pytest.mark.parametrize("kind", REAL_TYPES)
def test_absmax_scale_of_any_type_passes(kind):
    """check_absmax_int8's answer is (q, scale): the scale may be any type holding it."""
    def absmax_int8(x):
        q, scale = absmax_quantize(x, 8)
        return q, REAL_TYPES[kind](float(scale))
    assert ch03.check_absmax_int8(absmax_int8, seed=11) > 0


# ---- an answer of the wrong kind gets a learner's message, never the checker's own failure ----
def _every_function_checker():
    import importlib
    found = []
    for n in range(1, 13):
        module = importlib.import_module(f"llminfra.course.checks.ch{n:02d}")
        found += [fn for name, fn in sorted(vars(module).items())
                  if name.startswith("check_") and name != "check_block_allocator"
                  and getattr(fn, "__module__", "").startswith(module.__name__)]
    return found


WRONG_KINDS = {
    "a dict": {"bytes": 12}, "a string with units": "12 GB", "a tuple": (1.0, 2.0),
    "a numpy array": np.array([1.5, 2.5, 3.5]), "a 2-d numpy array": np.ones((2, 2)),
    "None": None, "a bool": True, "a set": {1, 2}, "a list of dicts": [{"a": 1}],
}
#: what only a checker's own failure says (a hint that crashed, a comparison that could not run)
CHECKERS_OWN = ("could not judge", "hint failed", "please report", "could not compare",
                "Traceback")


@pytest.mark.parametrize("check", _every_function_checker(), ids=_name)
def test_an_answer_of_the_wrong_kind_gets_a_learners_message(check):
    """A dict, a string with units, a tuple, a NumPy array, None …: the learner is told what to
    return (a hint that did arithmetic on such an answer crashed, and the message showed the
    checker's own TypeError)."""
    assert len(_every_function_checker()) >= 25
    for what, value in WRONG_KINDS.items():
        with pytest.raises(CheckFailed) as e:
            check(lambda *a, value=value, **k: value, seed=7)
        text = str(e.value)
        assert not any(own in text for own in CHECKERS_OWN), (what, text)
        assert any(w in text for w in ("return", "expected", "got", "unknown")), (what, text)


@pytest.mark.parametrize("value, told", [
    ("12 GB", "not the string '12 GB'"), ({"bytes": 12}, "not a dict"),
    ((1.0, 2.0), "not a tuple of 2 values"), (np.array([1.5, 2.5]), "not an ndarray of shape (2,)"),
    (None, "returned None"), ([7], "return its item"), (True, "not True"),
])
def test_the_wrong_kind_is_named(value, told):
    with pytest.raises(CheckFailed) as e:
        ch01.check_activation_bytes(lambda *a: value, seed=3)
    assert told in str(e.value)


def test_a_passing_checker_cell_shows_no_stray_out_n():
    """A checker returns how many cases passed (tests compare it) but a notebook shows nothing
    for it: its ✓ line already says it (four checker cells of solutions/ showed ``Out[n]: 8``
    under that line)."""
    from IPython.core.formatters import DisplayFormatter
    n = ch04.check_slot_mapping(slot_mapping, seed=1)
    assert n == 10 and isinstance(n, int)
    assert DisplayFormatter().format(n) == ({}, {})
    assert DisplayFormatter().format(int(n)) == ({"text/plain": "10"}, {})
