"""Chapter 12 checkers: each passes on right answers (of any type that holds the value) over
many seeds and fails, naming the case, the seed and the usual mistake, on wrong ones; a
blocked product that reads all of W at once, skips the last block or reads a row twice fails
on its blocks; an answer that changes its input is told so; nothing crashes the checker."""

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch12
from llminfra.runner.ladder import blocked_matvec


def floor_by_hand(M, N, K, b, gb_per_s):
    """W read once (N·K), x read once (M·K), y written once (M·N), b bytes each, over
    gb_per_s · 1e9 bytes/s: 2048 × 2048 fp32, one row, 20 GB/s -> 16,793,600 / 2e10 s."""
    return (N * K + M * K + M * N) * b / (gb_per_s * 1e9)


def blocked_by_hand(x, W, block_rows):
    """Each block W[i:i+b] once, every row of x meeting it (F.linear: x · W[i:i+b]ᵀ)."""
    return torch.cat([F.linear(x, W[i:i + block_rows])
                      for i in range(0, W.shape[0], block_rows)], dim=1)


SEEDS = range(12)


def test_hand_example():
    assert floor_by_hand(1, 2048, 2048, 4, 20.0) == pytest.approx(16_793_600 / 2e10)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_references_pass_over_many_seeds(seed):
    assert ch12.check_matvec_floor(floor_by_hand, seed=seed) == 9
    assert ch12.check_blocked_matvec(blocked_by_hand, seed=seed) == 8
    assert ch12.check_blocked_matvec(blocked_matvec, seed=seed) == 8


def test_any_type_holding_the_value_passes():
    ch12.check_matvec_floor(lambda *a: np.float64(floor_by_hand(*a)), seed=4)
    ch12.check_matvec_floor(lambda *a: torch.tensor(floor_by_hand(*a), dtype=torch.float64),
                            seed=4)
    ch12.check_blocked_matvec(lambda *a: blocked_by_hand(*a).double(), seed=4)
    for other in (lambda t: t.numpy(), lambda t: t.tolist()):  # the exercise asks for a tensor
        with pytest.raises(CheckFailed, match="expected a torch.Tensor"):
            ch12.check_blocked_matvec(lambda *a, other=other: other(blocked_by_hand(*a)), seed=4)


def test_the_success_line_does_not_depend_on_the_seed(capsys):
    for seed in (1, 2):
        ch12.check_blocked_matvec(blocked_by_hand, seed=seed)
        ch12.check_matvec_floor(floor_by_hand, seed=seed)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == out[2] == "✓ blocked_matvec: 8 random cases passed"
    assert out[1] == out[3] == "✓ matvec_floor: 9 random cases passed"


WRONG_FLOORS = [
    (lambda M, N, K, b, g: (M * N * K + M * K + M * N) * b / (g * 1e9), "once per row of x"),
    (lambda M, N, K, b, g: N * K * b / (g * 1e9), "left out x and y"),
    (lambda M, N, K, b, g: (N * K + M * K + M * N) * b / (g * 2**30), "not 2**30 (GiB/s)"),
    (lambda M, N, K, b, g: 1e3 * floor_by_hand(M, N, K, b, g), "milliseconds"),
    (lambda M, N, K, b, g: 8 * floor_by_hand(M, N, K, b, g), "bits"),
    (lambda M, N, K, b, g: 2 * M * N * K / (g * 1e9), "FLOPs"),
]


@pytest.mark.parametrize("wrong, told", WRONG_FLOORS, ids=[t for _, t in WRONG_FLOORS])
@pytest.mark.parametrize("seed", [0, 7])
def test_a_wrong_floor_fails_with_its_mistake_named(wrong, told, seed):
    with pytest.raises(CheckFailed) as e:
        ch12.check_matvec_floor(wrong, seed=seed)
    msg = str(e.value)
    assert told in msg and "case " in msg
    assert f"replay: ch12.check_matvec_floor(your_function, seed={seed})" in msg
    assert "got " in msg and "expected " in msg


def test_a_floor_of_the_wrong_kind_says_what_kind_is_due():
    with pytest.raises(CheckFailed, match="one number") as e:
        ch12.check_matvec_floor(lambda *a: f"{floor_by_hand(*a)} s", seed=1)
    assert "Traceback" not in str(e.value)


def _whole(x, W, b):
    return x @ W.T


def _no_tail(x, W, b):
    y = torch.zeros(x.shape[0], W.shape[0])
    for i in range(0, W.shape[0] - b + 1, b):
        y[:, i:i + b] = x @ W[i:i + b].T
    return y


def _overlap(x, W, b):
    y = torch.zeros(x.shape[0], W.shape[0])
    for i in range(0, W.shape[0], max(b - 1, 1)):
        y[:, i:i + b] = x @ W[i:i + b].T
    return y


def _in_numpy(x, W, b):
    return x.numpy() @ W.numpy().T


def _changes_x(x, W, b):
    x.mul_(2)
    return blocked_by_hand(x, W, b) / 2


def _not_transposed(x, W, b):
    return blocked_by_hand(x, W, b).T


def _blocks_of_columns(x, W, b):      # blocks of K: every weight read, but W[:, k:k+b] views
    return sum(x[:, k:k + b] @ W[:, k:k + b].T for k in range(0, W.shape[1], b))


def _off_by_bias(x, W, b):
    return blocked_by_hand(x, W, b) + 1e-2


WRONG_BLOCKS = [(_whole, "read rows 0.."), (_no_tail, "was never read"),
                (_overlap, "was read 2 times"), (_in_numpy, "W went through numpy"),
                (_changes_x, "changed its input `x` in place"),
                (_not_transposed, "you returned (N, M)"),
                (_blocks_of_columns, "no torch product read W's rows"),
                (_off_by_bias, "expected")]


@pytest.mark.parametrize("wrong, told", WRONG_BLOCKS, ids=[f.__name__ for f, _ in WRONG_BLOCKS])
@pytest.mark.parametrize("seed", [0, 5])
def test_a_wrong_blocked_product_fails_naming_case_seed_and_mistake(wrong, told, seed):
    with pytest.raises(CheckFailed) as e:
        ch12.check_blocked_matvec(wrong, seed=seed)
    msg = str(e.value)
    assert told in msg, msg
    assert "case " in msg and f"seed={seed}" in msg
    assert not isinstance(e.value, NotAttempted)


def test_a_value_mismatch_names_the_first_difference():
    with pytest.raises(CheckFailed) as e:
        ch12.check_blocked_matvec(_off_by_bias, seed=2)
    assert "[0, 0]" in str(e.value) or "first" in str(e.value), str(e.value)


def test_the_stub_is_not_attempted_and_odd_answers_do_not_crash():
    def stub(x, W, b):
        raise NotImplementedError("your code here")
    with pytest.raises(NotAttempted):
        ch12.check_blocked_matvec(stub, seed=0)
    def floor_stub(M, N, K, b, gb_per_s):
        raise NotImplementedError("your code here")
    with pytest.raises(NotAttempted):
        ch12.check_matvec_floor(floor_stub, seed=0)
    for odd in (lambda x, W, b: None, lambda x, W, b: {"y": 1}, lambda x, W, b: 1 / 0,
                lambda x, W, b: (x @ W[:b].T, "extra")):
        with pytest.raises(CheckFailed):
            ch12.check_blocked_matvec(odd, seed=0)
    with pytest.raises(CheckFailed, match="expected a function"):
        ch12.check_blocked_matvec("not a function", seed=0)


WRONG_KINDS = {"a dict": {"bytes": 12}, "a string with units": "12 GB", "a tuple": (1.0, 2.0),
               "a numpy array": np.array([1.5, 2.5, 3.5]), "a 2-d numpy array": np.ones((2, 2)),
               "None": None, "a bool": True, "a set": {1, 2}, "a list of dicts": [{"a": 1}]}


@pytest.mark.parametrize("check", [ch12.check_matvec_floor, ch12.check_blocked_matvec],
                         ids=["matvec_floor", "blocked_matvec"])
def test_an_answer_of_the_wrong_kind_is_told_what_to_return(check):
    """As tests/test_checks_any_type.py asks of every checker: the learner's message, never
    the checker's own failure."""
    for what, value in WRONG_KINDS.items():
        with pytest.raises(CheckFailed) as e:
            check(lambda *a, value=value, **k: value, seed=7)
        text = str(e.value)
        assert not any(own in text for own in ("could not judge", "hint failed",
                                               "please report", "could not compare",
                                               "Traceback")), (what, text)
        assert any(w in text for w in ("return", "expected", "got", "unknown")), (what, text)


def test_a_generously_slow_answer_fails_on_the_timed_case(monkeypatch):
    """A product that takes more than SLOW_X_FLOOR × its floor and SLOW_X_TORCH × torch's own
    fails (faked here: every call of the answer sleeps a while on the timed shape only)."""
    def slow(x, W, b):
        if W.shape == (2048, 2048):
            time.sleep(0.25)
        return blocked_by_hand(x, W, b)
    with pytest.raises(CheckFailed, match="the timed case") as e:
        ch12.check_blocked_matvec(slow, seed=3)
    assert "its floor" in str(e.value) and "torch's x @ W.T" in str(e.value)
