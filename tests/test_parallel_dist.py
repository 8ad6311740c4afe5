"""Real processes over gloo: torch.distributed == SimulatedWorld == unsharded, errors surface.

Each launch spawns fresh Python processes (a few seconds each, mostly importing torch), so one
launch per world size serves several checks (module-scoped fixtures).
"""

import multiprocessing
import time

import pytest
import torch

from llminfra.model.cache import DenseKVCache
from llminfra.model.generate import generate
from llminfra.parallel.launch import RankError, launch
from llminfra.parallel.workers import (distributed_selfcheck, exit_on_rank, fail_on_rank, mlp_case,
                                       pipeline_logits, selfcheck, sleep_for, tiny_model)
from llminfra.parallel.world import run_simulated

pytestmark = pytest.mark.slow   # each test starts torch.distributed ranks

SEED = 1234
PROMPT = list(b"def main(")
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def reference():
    """Single-process results: plain MLP, tiny-model logits and greedy tokens, pipeline input."""
    mlp, x, w = mlp_case(SEED)
    x = x.requires_grad_()
    y = mlp(x)
    (y * w).sum().backward()
    model = tiny_model()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT]))
    tokens = generate(model, PROMPT, NEW_TOKENS, cache=DenseKVCache(model.config.n_layers))
    pipe = run_simulated(pipeline_logits, 1, SEED, 2)[0]["logits"]
    return {"y": y.detach(), "dx": x.grad, "dw1": mlp.w1.weight.grad, "dw2": mlp.w2.weight.grad,
            "logits": logits, "tokens": tokens, "pipeline": pipe}


@pytest.fixture(scope="module")
def launched():
    """``get(n)``: (n, results of gloo ranks, results of simulated ranks), one launch per n."""
    done = {}

    def get(n):
        if n not in done:
            # the ranks on this process's CPU kernels, as the simulated ranks (make test gives
            # the processes it starts ATen's plainest: conftest.py's split_cpu_capability)
            with pytest.MonkeyPatch.context() as mp:
                mp.delenv("ATEN_CPU_CAPABILITY", raising=False)
                dist = launch(distributed_selfcheck, n, SEED, PROMPT, NEW_TOKENS, timeout_s=150,
                              dtensor=n == 2)  # the DTensor import costs ~1 s of CPU per rank
            sim = run_simulated(selfcheck, n, SEED, PROMPT, NEW_TOKENS)
            assert not multiprocessing.active_children()  # every rank reaped
            done[n] = (n, dist, sim)
        return done[n]
    return get


@pytest.fixture(params=[2, 4], ids=["2-ranks", "4-ranks"])
def runs(request, launched):
    return launched(request.param)


def test_gloo_equals_simulated_world(runs):
    n, dist, sim = runs
    for d, s in zip(dist, sim):
        assert d["backend"] == "gloo"
        for key in ("y", "dx", "dw1", "dw2"):
            torch.testing.assert_close(d["mlp"][key], s["mlp"][key], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(d["generate"]["logits"], s["generate"]["logits"])
        assert d["generate"]["tokens"] == s["generate"]["tokens"]


def test_sharded_equals_unsharded_forward_and_backward(runs, reference):
    n, dist, _ = runs
    for d in dist:
        torch.testing.assert_close(d["mlp"]["y"], reference["y"])
        torch.testing.assert_close(d["mlp"]["dx"], reference["dx"])
    torch.testing.assert_close(torch.cat([d["mlp"]["dw1"] for d in dist]), reference["dw1"])
    torch.testing.assert_close(torch.cat([d["mlp"]["dw2"] for d in dist], 1), reference["dw2"])


def test_torch_tensor_parallel_api_agrees(launched, reference):
    _, dist, _ = launched(2)
    for d in dist:
        torch.testing.assert_close(d["dtensor_y"], reference["y"])
        torch.testing.assert_close(d["dtensor_y"], d["mlp"]["y"])


def test_greedy_generation_equals_single_process(runs, reference):
    _, dist, _ = runs
    for d in dist:
        torch.testing.assert_close(d["generate"]["logits"], reference["logits"],
                                   rtol=1e-4, atol=1e-4)
        assert d["generate"]["tokens"] == reference["tokens"]


def test_pipeline_over_gloo_equals_plain(runs, reference):
    _, dist, _ = runs
    torch.testing.assert_close(dist[-1]["pipeline"]["logits"], reference["pipeline"])
    assert all(d["pipeline"]["logits"] is None for d in dist[:-1])


def test_rank_error_reaches_caller_and_nothing_is_left():
    t0 = time.monotonic()
    with pytest.raises(RankError, match="rank 1 fails on purpose") as info:
        launch(fail_on_rank, 2, 1, timeout_s=60)  # rank 0 blocks in an all-reduce meanwhile
    assert info.value.rank == 1
    assert time.monotonic() - t0 < 60
    assert not multiprocessing.active_children()


def test_a_hung_rank_hits_the_deadline_and_is_killed():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="not finished after 4"):
        launch(sleep_for, 1, 600.0, timeout_s=4)
    assert time.monotonic() - t0 < 30
    assert not multiprocessing.active_children()


def test_launch_rejects_unpicklable_and_bad_sizes():
    with pytest.raises(ValueError, match="cannot be pickled"):
        launch(lambda world: 0, 2)
    with pytest.raises(ValueError, match="world_size"):
        launch(fail_on_rank, 0, 0)


def test_unpicklable_argument_surfaces_the_pickling_error():
    """spawn pickles the arguments in ``Process.start``; that error (not a secondary one from
    reaping children that never started) must reach the caller."""
    import threading
    with pytest.raises(TypeError, match="pickle"):
        launch(sleep_for, 2, threading.Lock(), timeout_s=20)
    assert not multiprocessing.active_children()


# ---- hardening (issue 13) -------------------------------------------------------------------
def test_a_rank_that_exits_is_named_with_its_exit_code():
    """Rank 1 calls os._exit(7) while rank 0 waits in an all-reduce. Rank 0 then fails with a
    gloo 'connection reset'; the caller must hear about rank 1 and code 7, the cause."""
    with pytest.raises(RankError, match="exited with code 7") as info:
        launch(exit_on_rank, 2, 1, 7, timeout_s=60)
    assert info.value.rank == 1
    assert not multiprocessing.active_children()


def test_launch_accepts_a_partial_of_a_module_function():
    """functools.partial pickles fine under spawn; it used to raise a raw AttributeError
    (a partial has no __qualname__)."""
    import functools
    assert launch(functools.partial(sleep_for, seconds=0.0), 2, timeout_s=60) == [0, 1]
    with pytest.raises(ValueError, match="cannot be pickled"):
        launch(functools.partial(lambda world: 0), 1)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "10", True])
def test_launch_rejects_a_non_positive_timeout(bad):
    with pytest.raises(ValueError, match="timeout_s"):
        launch(sleep_for, 1, 0.0, timeout_s=bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_nccl_without_cuda_says_so():
    """It used to die in the child with ZeroDivisionError (rank % 0 devices)."""
    with pytest.raises(ValueError, match="nccl.*CUDA"):
        launch(sleep_for, 1, 0.0, backend="nccl")
