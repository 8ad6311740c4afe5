"""The checker framework: type-tolerant comparison with short diagnostics, seeds in messages,
and no checker ever raising anything but CheckFailed, whatever the learner returns."""

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from llminfra.course.checking import (Case, CheckFailed, NotAttempted, compare, first_matching,
                                      run_checks, seeded)
from llminfra.course.checks import ch01, ch02, ch03, ch04, ch06, ch07

FUNCTION_CHECKERS = [
    ch01.check_param_count, ch01.check_training_memory, ch01.check_activation_bytes,
    ch01.check_decode_intensity, ch02.check_kv_bytes_per_token, ch02.check_kv_sequence_gib,
    ch02.check_largest_batch, ch03.check_absmax_int8, ch03.check_quantize_int4,
    ch03.check_gptq_column_step, ch04.check_slot_mapping, ch04.check_contiguous_waste,
    ch06.check_online_softmax, ch06.check_tiled_attention, ch07.check_column_shard,
    ch07.check_row_shard, ch07.check_bubble]

GARBAGE = {
    "None": lambda *a: None, "a string": lambda *a: "42", "NumPy int32": lambda *a: np.int32(7),
    "NaN": lambda *a: float("nan"), "a wrong-shape tensor": lambda *a: torch.ones(3, 2),
    "a float32 tensor": lambda *a: torch.zeros(1, dtype=torch.float32),
    "a wrong-length tuple": lambda *a: (1, 2, 3), "a tuple of strings": lambda *a: ("q", "s"),
    "a dict": lambda *a: {"x": 1}, "a list of strings": lambda *a: ["a", "b"],
    "raises ValueError": lambda *a: (_ for _ in ()).throw(ValueError("mine")),
    "an int16 tuple": lambda *a: (torch.zeros(2, dtype=torch.int16), np.float32(1)),
    "a complex tensor": lambda *a: torch.zeros(2, dtype=torch.complex64),
}


@pytest.mark.parametrize("check", FUNCTION_CHECKERS, ids=lambda c: c.__name__)
def test_checkers_only_ever_raise_check_failed(check):
    """17 function checkers (+ the allocator below) × every kind of wrong value: a diagnosis,
    never a crash inside the checker (and never a pass)."""
    for what, answer in GARBAGE.items():
        with pytest.raises(CheckFailed) as e:
            check(answer, seed=3)
        assert "seed 3" in str(e.value) or "check_" in str(e.value), (what, str(e.value))
        assert "checker could not judge" not in str(e.value), (what, str(e.value))


def test_allocator_checker_with_a_broken_class():
    class Broken:
        def __init__(self, n, b):
            self.n = n

        def allocate(self):
            return "x"

        def ref_count(self, b):
            return np.int32(1)

        incref = free = ref_count

        def free_list(self):
            return None
    with pytest.raises(CheckFailed):
        ch04.check_block_allocator(Broken)


@pytest.mark.parametrize("expected, got", [
    (3, 3.0), (3, np.int64(3)), (0.25, Fraction(1, 4)), (0.25, torch.tensor(0.25)),
    (0.25, np.float64(0.25)), ([1, 2, 3], (1, 2, 3)), ([1, 2, 3], torch.tensor([1, 2, 3])),
    ([1, 2, 3], np.array([1, 2, 3], dtype=np.int32)),
    (torch.arange(6.).reshape(2, 3), np.arange(6.).reshape(2, 3)),
    (torch.arange(6.).reshape(2, 3), torch.arange(6, dtype=torch.float64).reshape(2, 3)),
    ({"a": 1, "b": [2]}, {"a": 1.0, "b": (2,)}),
])
def test_compare_accepts_any_type_holding_the_value(expected, got):
    assert compare(expected, got) is None


def test_compare_names_first_mismatch_and_largest_difference_without_a_dump():
    e = torch.zeros(50, 60, dtype=torch.float64)
    g = e.clone()
    g[3, 7], g[20, 1] = 0.5, -2.0
    msg = compare(e, g, 1e-9, 0.0)
    assert "first mismatch at index (3, 7): got 0.5, expected 0" in msg
    assert "largest difference 2 at index (20, 1)" in msg and "2 of 3000 values differ" in msg
    assert "tensor(" not in msg and len(msg) < 300
    assert "shape (2,), expected (50, 60)" in compare(e, torch.zeros(2))
    assert "returned None" in compare(e, None)
    assert "first mismatch at index 1" in compare([1, 2, 3], np.array([1, 5, 3]))


def test_lower_precision_tensor_gets_its_dtype_tolerance_only_in_tolerant_checks():
    e = torch.randn(20, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert compare(e, e.float(), 1e-9, 1e-12) is None
    assert compare(e, e.float(), 0.0, 0.0) is not None


def test_a_float32_number_is_judged_at_float32_precision_in_tolerant_checks():
    """float32 holds ~7 digits: the right value rounded to float32 passes a rel=1e-9 check
    (as a NumPy scalar, a 0-d tensor or the items of a 1-D array); 1e-5 off does not; an exact
    check stays exact."""
    x = 1 / 3
    for got in (np.float32(x), torch.tensor(x, dtype=torch.float32),
                np.array([x], dtype=np.float32)):
        assert compare(x, got, 1e-9, 1e-12) is None, type(got)
    assert compare([x, 2 * x], np.array([x, 2 * x], dtype=np.float32), 1e-9) is None
    assert compare((x, 0.5), (torch.tensor(x), np.float32(0.5)), 1e-9) is None
    assert "difference" in compare(x, np.float32(x * (1 + 1e-5)), 1e-9)
    assert compare(x, np.float32(x), 0.0, 0.0) is not None


def test_decimal_holds_a_number():
    assert compare(0.1, Decimal("0.1")) is None and compare(1 / 3, Decimal(1 / 3)) is None
    assert compare([0.25, 3], [Decimal("0.25"), Decimal(3)]) is None
    assert "got 0.3, expected 0.1" in compare(0.1, Decimal("0.3"))
    assert "expected a number" in compare(0.1, Decimal("sNaN"))


def test_a_count_is_exact_whatever_type_holds_it():
    """An int expected value is a count: any type holding that whole number passes; a fraction
    fails however close (half a byte of 10**10 is within rel=1e-9), so does a count off by one;
    float32 above 2**24 cannot hold every count, and the message says so."""
    n = 10**10
    for got in (n, float(n), np.float64(n), np.int64(n), Decimal(n), Fraction(2 * n, 2),
                torch.tensor(n), torch.tensor(float(n), dtype=torch.float64)):
        assert compare(n, got, 1e-9) is None, type(got)
    for got in (n + 0.5, np.float64(n) + 0.5, Decimal(n) + Decimal("0.5"), Fraction(2 * n + 1, 2)):
        assert compare(n, got, 1e-9) == \
            "got 10000000000.5, expected the whole number 10000000000: a count has no fraction"
    assert compare(n, n + 1, 1e-6) == "got 10000000001, expected 10000000000 (difference 1)"
    assert compare(12, np.float32(12)) is None and compare(2**24, np.float32(2**24)) is None
    assert "float32 holds whole numbers exactly only up to 16,777,216" in \
        compare(2**24 + 1, np.float32(2**24 + 1), 1e-9)
    assert "index 1: got 2.5, expected the whole number 2" in compare([1, 2, 3], [1, 2.5, 3])


def test_first_matching_ignores_variants_equal_to_the_right_answer():
    assert first_matching(4, {"doubled": 4, "same": 2}, 2) == "doubled"
    assert first_matching(2, {"same": 2}, 2) == ""


def test_run_checks_message_and_replay():
    seed, rng = seeded(123)
    assert seed == 123 and seeded(123)[1].random() == rng.random()
    cases = [Case("a named case", (2,)), Case("the failing case", (3,))]
    with pytest.raises(CheckFailed) as e:
        run_checks("double", lambda x: 2 * x if x < 3 else 0, lambda x: 2 * x, cases, seed=123,
                   replay="chXX.check_double", hint=lambda a, k, exp, got: f"hint for {got}")
    msg = str(e.value)
    assert "double: got 0, expected 6" in msg
    assert "case 2 of 2: the failing case (seed 123; replay: chXX.check_double(your_function, seed=123))" in msg
    assert "hint: hint for 0" in msg


def test_a_broken_hint_or_reference_is_reported_not_raised():
    with pytest.raises(CheckFailed, match="the checker's hint failed with ZeroDivisionError"):
        run_checks("f", lambda x: 1, lambda x: 2, [Case("c", (1,))], hint=lambda *a: 1 / 0)
    with pytest.raises(CheckFailed, match="reference failed"):
        run_checks("f", lambda x: 1, lambda x: 1 / 0, [Case("c", (1,))])


def test_stub_of_the_learner_vs_a_stub_it_calls():
    def stub(x):
        raise NotImplementedError("your code here")

    def calls_stub(x):
        return stub(x) + 1

    with pytest.raises(NotAttempted):
        run_checks("stub", stub, lambda x: x, [Case("c", (1,))])
    with pytest.raises(CheckFailed, match="`stub`, which your calls_stub calls") as e:
        run_checks("calls_stub", calls_stub, lambda x: x, [Case("c", (1,))])
    assert not isinstance(e.value, NotAttempted)


def test_pure_detects_in_place_changes():
    def in_place(t):
        t.add_(1)
        return t
    with pytest.raises(CheckFailed, match="your function changed its input `t` in place"):
        run_checks("inc", in_place, lambda t: t + 1, [Case("c", (torch.zeros(3),))], pure=True)
    assert run_checks("inc", lambda t: t + 1, lambda t: t + 1, [Case("c", (torch.zeros(3),))],
                      pure=True) == 1


def test_old_style_cases_still_work(capsys):
    """Checkers written against the first API ((args, kwargs) pairs, no seed) keep working."""
    assert run_checks("sq", lambda x: x * x, lambda x: x ** 2, [((3,), {}), ((4,), {})]) == 2
    assert "✓ sq: 2 random cases passed" in capsys.readouterr().out


def test_a_wrapped_stub_still_reads_as_not_attempted():
    """A checker that wraps the learner's function without passing owner= (as a new chapter's
    checker might) still reports the learner's stub as not attempted."""
    def stub(x):
        raise NotImplementedError("your code here")

    from llminfra.course.checks import ch07 as module  # any function defined in the package
    wrapper = module._shard_hint("row")  # a closure whose code lives in llminfra
    assert wrapper.__code__.co_filename.endswith("ch07.py")
    with pytest.raises(NotAttempted):
        run_checks("stub", lambda x: stub(x), lambda x: x, [Case("c", (1,))], owner=wrapper)


def test_jupyter_shows_the_verdict_not_a_traceback_through_the_checker(tmp_path):
    """IPython prints ``_render_traceback_()`` instead of the traceback: the message alone for a
    wrong answer; for an answer whose own code raised, the frames of that code (the learner's
    file), none of the package's or torch's."""
    with pytest.raises(CheckFailed) as wrong:
        run_checks("f", lambda n: n + 1, lambda n: n, [((1,), {})], seed=3, replay="ch00.check_f")
    lines = wrong.value._render_traceback_()
    assert len(lines) == 1 and "CheckFailed" in lines[0] and "seed=3" in lines[0]

    learner = tmp_path / "learner_cell.py"
    learner.write_text("import torch\n\ndef answer(n):\n    return torch.ones(3) @ torch.ones(4)\n")
    namespace = {}
    exec(compile(learner.read_text(), str(learner), "exec"), namespace)
    with pytest.raises(CheckFailed) as raised:
        run_checks("f", namespace["answer"], lambda n: n, [((1,), {})])
    text = "\n".join(raised.value._render_traceback_())
    assert "raised RuntimeError" in text and "where your code raised it" in text
    assert str(learner) in text and "torch.ones(3) @ torch.ones(4)" in text
    assert "checking.py" not in text and "site-packages" not in text
