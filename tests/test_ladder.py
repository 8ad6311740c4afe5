"""llminfra.runner.ladder (chapter 12): the floor by hand, the blocked product equal to
x @ W.T with each row of W read once, the reads it sees, and C functions found by name."""

import pytest
import torch

from llminfra.runner import ladder


def test_floor_by_hand():
    """2048 × 2048 fp32, one row of x, 20 GB/s: (4,194,304 + 2,048 + 2,048) · 4 bytes /
    2e10 bytes/s = 0.83968 ms; 64 rows share one read of W: (4,194,304 + 2 · 131,072) · 4."""
    assert ladder.matvec_floor_s(1, 2048, 2048, 4, 20) == pytest.approx(8.3968e-4)
    assert ladder.matvec_bytes(64, 2048, 2048, 4) == (4_194_304 + 2 * 131_072) * 4
    for bad in ((0, 1, 1, 4, 1), (1, 1, 1, 0, 1), (1, 1, 1, 4, float("inf")), (1.5, 1, 1, 4, 1)):
        with pytest.raises(ValueError):
            ladder.matvec_floor_s(*bad)


def test_row_blocks_cover_each_row_once():
    assert ladder.row_blocks(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert ladder.row_blocks(3, 8) == [(0, 3)]
    with pytest.raises(ValueError, match="block_rows"):
        ladder.row_blocks(3, 0)


@pytest.mark.parametrize("M, N, K, b", [(1, 1823, 781, 128), (7, 33, 5, 1), (3, 16, 64, 16),
                                        (2, 5, 9, 100)])
def test_blocked_matvec_equals_x_at_w_t_and_reads_each_row_once(M, N, K, b):
    g = torch.Generator().manual_seed(M * N + K)
    x, W = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    seen = ladder.weight_reads(ladder.blocked_matvec, x, W, b)
    torch.testing.assert_close(seen.result, x @ W.T, rtol=1e-5, atol=1e-4)
    assert sorted(seen.reads) == ladder.row_blocks(N, b)
    assert ladder.read_problem(seen.reads, N, b) is None


def test_read_problem_names_what_is_wrong():
    assert "more than block_rows" in ladder.read_problem([(0, 10)], 10, 4)
    assert "row 3 of W was read 2 times" in ladder.read_problem([(0, 4), (3, 7), (7, 10)], 10, 4)
    assert "row 8 of W was never read" in ladder.read_problem([(0, 4), (4, 8)], 10, 4)
    assert "no torch product" in ladder.read_problem([], 10, 4)


def test_reads_of_a_transposed_view_and_of_a_copy():
    W, x = torch.randn(8, 4), torch.randn(2, 4)
    Wt = W.T
    assert ladder.weight_reads(lambda x, W: x @ Wt[:, 2:6], x, W).reads == [(2, 6)]
    assert ladder.weight_reads(lambda x, W: x @ W.clone().T, x, W).reads == []
    column_slice = ladder.weight_reads(lambda x, W: x[:, :2] @ W[:, :2].T, x, W)
    assert column_slice.reads == [] and column_slice.other == {"matmul"}


def test_c_function_finds_a_definition_not_a_prototype():
    start, lines = ladder.c_function("thread_pool.c", "pool_for")
    assert "pool_for(" in "\n".join(lines) and lines[-1].rstrip().endswith("}")
    text = (ladder.CSRC / "thread_pool.c").read_text().splitlines()
    assert text[start - 1:start - 1 + len(lines)] == lines
    _, short = ladder.c_function("thread_pool.c", "pool_for", max_lines=3)
    assert len(short) == 4 and short[-1].strip() == "…"
    with pytest.raises(ValueError, match="defines no function"):
        ladder.c_function("thread_pool.c", "no_such_function")
    with pytest.raises(ValueError, match="no C source"):
        ladder.c_function("nope.c", "f")


def test_decode_step_s_refuses_an_engine_out_of_work():
    class Done:
        def has_unfinished_requests(self):
            return False
    with pytest.raises(ValueError, match="finished before"):
        ladder.decode_step_s(Done(), 2)


def test_decode_steps_s_steps_the_engines_in_turn():
    order = []

    class Engine:
        def __init__(self, name):
            self.name = name

        def has_unfinished_requests(self):
            return True

        def step(self):
            order.append(self.name)
    best = ladder.decode_steps_s({"a": Engine("a"), "b": Engine("b")}, 3)
    assert order == ["a", "b"] * 3 and set(best) == {"a", "b"}
    assert all(0 <= s < 1 for s in best.values())
