"""Chapter 11's one launch: expert parallelism and context parallelism equal one process, on
simulated ranks and on 4 real gloo processes (2 and 3 ranks run in test_expert_parallel.py and
test_context_parallel.py)."""

import multiprocessing

import pytest

from llminfra.parallel.beyond_check import distributed_selfcheck

KEYS = ("ep_max_error", "tp_experts_max_error", "ring_attention_max_error", "decode_cp_max_error")


def _assert_equal_to_one_process(r):
    for key in KEYS:
        assert 0 <= r[key] <= 1e-5, (key, r[key])
    assert len(r["cases"]) == 8


@pytest.mark.parametrize("n", [1, 3])
def test_simulated_ranks(n):
    r = distributed_selfcheck(n, seed=n, real_processes=False)
    assert r["backend"] == "simulated" and r["world_size"] == n
    _assert_equal_to_one_process(r)


@pytest.mark.slow
def test_four_gloo_ranks_and_no_stray_process():
    r = distributed_selfcheck(4, seed=1)
    assert r["backend"] == "gloo"
    _assert_equal_to_one_process(r)
    assert multiprocessing.active_children() == []


def test_bad_world_size_named():
    with pytest.raises(ValueError, match="world_size"):
        distributed_selfcheck(0, real_processes=False)
