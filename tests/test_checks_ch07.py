"""Chapter 07 checkers: pass on the package's functions, fail with a precise message on the
usual wrong answers."""

import pytest

from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch07
from llminfra.parallel.pipeline import bubble_fraction
from llminfra.parallel.tensor_parallel import shard_cols, shard_rows


def column_right(A, rank, size):
    return shard_rows(A.T, rank, size).T


def row_right(A, rank, size):
    return shard_cols(A.T, rank, size).T


def test_checkers_pass_on_the_package():
    assert ch07.check_column_shard(column_right) == 6
    assert ch07.check_row_shard(row_right) == 6
    assert ch07.check_bubble(bubble_fraction) == 9


def test_shards_swapped_are_diagnosed():
    with pytest.raises(CheckFailed, match="row-parallel shard: you split the other dimension"):
        ch07.check_column_shard(row_right)
    with pytest.raises(CheckFailed, match="column-parallel shard"):
        ch07.check_row_shard(column_right)


def test_wrong_block_and_stub():
    def last_block(A, rank, size):
        return column_right(A, size - 1 - rank, size)
    with pytest.raises(CheckFailed, match="wrong block"):  # every rank of case 1 is checked
        ch07.check_column_shard(last_block)

    def stub(A, rank, size):
        raise NotImplementedError("your code here")
    with pytest.raises(NotAttempted, match="not implemented yet"):
        ch07.check_row_shard(stub)


@pytest.mark.parametrize("wrong, message", [
    (lambda p, m: (p - 1) / m, "relative to the busy time"),
    (lambda p, m: m / (m + p - 1), "busy share"),
    (lambda p, m: (p - 1) / (m + p), "not m\\+p"),
])
def test_bubble_diagnoses(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ch07.check_bubble(wrong)


def test_checkers_leave_the_global_torch_rng_alone():
    """The checkers draw from their own generators: the notebook's torch RNG is not advanced."""
    import torch
    before = torch.random.get_rng_state()
    ch07.check_column_shard(column_right)
    ch07.check_row_shard(row_right)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_other_value_types_are_accepted():
    """A Fraction, a NumPy float, a 0-d tensor or a float64 shard of a float32 A hold the
    right value (a Fraction was rejected, a float64 shard crashed the checker)."""
    from fractions import Fraction

    import numpy as np
    import torch
    assert ch07.check_bubble(lambda p, m: Fraction(p - 1, m + p - 1)) == 9
    assert ch07.check_bubble(lambda p, m: np.float64((p - 1) / (m + p - 1))) == 9
    assert ch07.check_bubble(lambda p, m: torch.tensor((p - 1) / (m + p - 1), dtype=torch.float64)) == 9
    assert ch07.check_column_shard(lambda A, r, n: column_right(A, r, n).double()) == 6
    with pytest.raises(CheckFailed, match="expected a torch.Tensor .* got ndarray"):
        ch07.check_row_shard(lambda A, r, n: row_right(A, r, n).numpy())


def test_a_lower_precision_shard_is_diagnosed_not_crashed():
    with pytest.raises(CheckFailed, match="float32 but your shard is float16"):
        ch07.check_column_shard(lambda A, r, n: column_right(A, r, n).half())


def test_integer_division_bubble():
    with pytest.raises(CheckFailed, match="integer division"):
        ch07.check_bubble(lambda p, m: (p - 1) // (m + p - 1))


def test_case_count_does_not_depend_on_the_seed():
    """The notebooks print the count; it must not vary with the seed (it once did)."""
    import random
    assert {len(ch07._cases(random.Random(seed))) for seed in range(300)} == {6}


# ---- every branch has a fixed case: a wrong answer that ignores one fails on every seed, there
SEEDS = range(8)


@pytest.mark.parametrize("check, wrong, message", [
    (ch07.check_column_shard, lambda A, r, n: A[:, r::n], "stride"),
    (ch07.check_row_shard, lambda A, r, n: A[r::n, :], "stride"),
    (ch07.check_column_shard, row_right, "row-parallel shard"),
    (ch07.check_row_shard, column_right, "column-parallel shard"),
    (ch07.check_column_shard, lambda A, r, n: A[:, r * (A.shape[0] // n):][:, :A.shape[0] // n],
     r"shape \("),
    (ch07.check_column_shard, lambda A, r, n: column_right(A, n - 1 - r, n), "wrong block"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_shard_slips_fail_every_run_at_case_1(check, wrong, message, seed):
    """Case 1 is rank 0 of 4 of a non-square A whose blocks are at least 2 wide: a stride, the
    other dimension, a block width taken from the other dimension or the ranks counted from
    the end cannot pass it."""
    with pytest.raises(CheckFailed, match=message) as e:
        check(wrong, seed=seed)
    assert "case 1 of 6: A (" in str(e.value) and "rank 0 of 4" in str(e.value)


@pytest.mark.parametrize("wrong, case, message", [
    (lambda p, m: (m - 1) / (m + p - 1), 1, "swapped p and m"),
    (lambda p, m: m / (m + p - 1), 1, "busy share"),
    (lambda p, m: p / (m + p - 1), 1, "p instead of p-1"),
    (lambda p, m: (p - 1) / m, 2, "relative to the busy time"),
    (lambda p, m: (p - 1) / (m + p), 2, "not m\\+p"),
    (lambda p, m: (p - 1) // (m + p - 1), 2, "integer division"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_bubble_slips_fail_every_run_at_their_case(wrong, case, message, seed):
    """Case 1 is one stage (no bubble) of several micro-batches, case 2 one micro-batch
    through several stages; they came last, after random pairs, and now come first."""
    with pytest.raises(CheckFailed, match=message) as e:
        ch07.check_bubble(wrong, seed=seed)
    name = "(one stage: no bubble)" if case == 1 else "(one micro-batch)"
    assert f"case {case} of 9: " in str(e.value) and name in str(e.value)
