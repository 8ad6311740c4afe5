"""Expert parallelism: all_to_all with uneven sizes, expert-parallel and tensor-parallel experts
== the single-process MoE layer (simulated ranks, then real gloo processes in one launch), and
the per-rank / per-expert reports."""

import multiprocessing

import pytest
import torch

from llminfra.parallel.expert_parallel import (ExpertParallelMoE, MoECase, all_to_all_mismatch,
                                               all_to_all_pattern, compare_to_single,
                                               expert_load_report,
                                               expert_parallel_check, expert_parallel_report,
                                               expert_parallel_selfcheck, moe_rank_check,
                                               tensor_parallel_experts)
from llminfra.parallel.launch import launch
from llminfra.parallel.world import SimulatedWorld, run_simulated

TOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


def _check_pattern(received, rank):
    """What :func:`all_to_all_pattern` must deliver to ``rank``: from source s,
    (s + 2·rank) mod 3 rows of 100·s + rank."""
    for s, got in enumerate(received):
        assert got.shape == ((s + 2 * rank) % 3, 3)
        assert (got == 100 * s + rank).all()


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_all_to_all_uneven_simulated(size):
    for rank, received in enumerate(run_simulated(all_to_all_pattern, size)):
        assert len(received) == size
        _check_pattern(received, rank)


def test_all_to_all_bad_input():
    w = SimulatedWorld.group(2)[0]
    with pytest.raises(ValueError, match="list of 2 tensors"):
        w.all_to_all([torch.zeros(2)])
    with pytest.raises(ValueError, match="every dimension but the first"):
        w.all_to_all([torch.zeros(2, 3), torch.zeros(2, 4)])
    for message in run_simulated(all_to_all_mismatch, 3):  # every rank raises, none hangs
        assert "trailing shape and dtype on every rank" in message


CASES = [MoECase(), MoECase(num_experts=4, top_k=1, tokens=5, gating="sigmoid", seed=3),
         MoECase(tokens=41, shared_expert=True, capacity_factor=0.6, seed=4),
         MoECase(num_experts=8, top_k=3, tokens=2, capacity_factor=1.0, gating="sigmoid",
                 seed=5)]


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"E{c.num_experts}k{c.top_k}"
                         f"N{c.tokens}-{c.gating}-cf{c.capacity_factor}-sh{c.shared_expert}")
def test_sharded_equals_single_simulated(size, case):
    """Expert parallel == the layer on each rank's tokens; TP experts == the layer on all."""
    results = run_simulated(moe_rank_check, size, case)
    diffs = compare_to_single(case, results)
    assert diffs["max_abs_diff_ep"] <= TOL and diffs["max_abs_diff_tp"] <= TOL
    layer, x = case.build()
    with torch.no_grad():
        assert layer(x).abs().max() > 1e-4  # the comparison is not between zeros
        if case.capacity_factor is None:  # no capacity: per-rank == the whole batch at once
            y_ep = torch.cat([r["y_ep"] for r in results])
            torch.testing.assert_close(y_ep, layer(x), rtol=1e-5, atol=1e-7)


def test_stats_add_up():
    case = MoECase(tokens=50, capacity_factor=0.8, seed=9)
    stats = [r["stats"] for r in run_simulated(moe_rank_check, 4, case)]
    sent = torch.tensor([s["rows_sent"] for s in stats])  # (src, dest)
    received = torch.tensor([s["rows_received"] for s in stats])  # (dest, src)
    assert torch.equal(sent, received.t())
    kept = sum(sum(s["kept_per_expert"]) for s in stats)
    dropped = sum(s["dropped_assignments"] for s in stats)
    assert int(sent.sum()) == kept and kept + dropped == 50 * case.top_k and dropped > 0
    row_bytes = case.dim * 4
    for r, s in enumerate(stats):
        assert s["dispatch_bytes_sent"] == (int(sent[r].sum()) - int(sent[r, r])) * row_bytes
        assert s["bytes_sent"] == s["bytes_received"]
    assert sum(s["dispatch_bytes_sent"] for s in stats) == \
        sum(s["dispatch_bytes_received"] for s in stats)


def test_reports():
    df = expert_parallel_report(4, 8, 2, 64, capacity_factor=1.0, seed=1)
    assert list(df["rank"]) == [0, 1, 2, 3] and list(df["experts"])[1] == "2..3"
    assert int(df["tokens"].sum()) == 64
    assert int(df["expert_load_tokens"].sum()) + int(df["dropped_assignments"].sum()) == 128
    assert df["load_vs_mean"].mean() == pytest.approx(1.0)
    assert (df["capacity_per_expert"] == 4).all()  # ceil(1.0 · 16 · 2 / 8)
    assert (df["tp_ring_allreduce_bytes_sent"] == 2 * 3 / 4 * 64 * 32 * 4).all()  # 12,288 B
    per_expert = expert_load_report(4, 8, 2, 64, capacity_factor=1.0, seed=1)
    assert int(per_expert["tokens_routed"].sum()) == 128
    assert list(per_expert["rank"]) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert int(per_expert["tokens_dropped"].sum()) == int(df["dropped_assignments"].sum())
    assert per_expert["load_vs_mean"].max() >= 1.0
    free = expert_parallel_check(2, real_processes=False, seed=2)
    assert free["backend"] == "simulated" and free["max_abs_diff_ep"] <= TOL


def test_bad_sizes():
    layer, _ = MoECase(num_experts=6).build()
    with pytest.raises(ValueError, match="number of experts of 6"):
        ExpertParallelMoE(layer, SimulatedWorld.group(4)[0])
    with pytest.raises(ValueError, match="expert inner size"):
        tensor_parallel_experts(layer, SimulatedWorld.group(5)[0])
    with pytest.raises(ValueError, match="tokens"):
        expert_parallel_report(tokens=0)


@pytest.fixture(scope="module")
def launched():
    """One launch of 2 gloo ranks for the whole file (a spawn costs several seconds), on the
    CPU kernels of this process, as the simulated ranks they are compared with (``make test``
    gives the processes it starts ATen's plainest: conftest.py's split_cpu_capability)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ATEN_CPU_CAPABILITY", raising=False)
        results = launch(expert_parallel_selfcheck, 2, CASES, timeout_s=150)
    assert not multiprocessing.active_children()  # every rank reaped
    return results


@pytest.mark.slow
def test_gloo_all_to_all_uneven(launched):
    for rank, r in enumerate(launched):
        _check_pattern(r["a2a"], rank)
        assert "trailing shape and dtype" in r["a2a_error"]  # raised on every rank, no hang


@pytest.mark.slow
def test_gloo_sharded_equals_single_and_simulated(launched):
    for i, case in enumerate(CASES):
        real = [r["moe"][i] for r in launched]
        diffs = compare_to_single(case, real)
        assert diffs["max_abs_diff_ep"] <= TOL and diffs["max_abs_diff_tp"] <= TOL, case
        sim = run_simulated(moe_rank_check, 2, case)
        for d, s in zip(real, sim):
            torch.testing.assert_close(d["y_ep"], s["y_ep"], rtol=1e-6, atol=1e-9)
            assert d["stats"] == s["stats"]
