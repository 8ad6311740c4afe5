"""Many engines that survive one dying (issue 43): a routed run returns a result for every
request when a replica is SIGKILLed or SIGSTOPped mid-run — the healthy replica's requests
answered, the lost replica's failed with a reason — and the policies take the lost replica out
of rotation (a dead replica fails its requests at once, so by load alone it looked idle)."""

import os
import signal
import threading
import time
from functools import partial

import pytest
import torch

from llminfra.cluster.router import (LeastLoaded, NoReplicaAvailable, PrefixAware, RoundRobin,
                                     RouteRequest, make_policy)
from llminfra.cluster.router_workload import shared_prompt_workload

#: process-heavy (servers, builds, workers): in `make test`, not `make test-fast`
pytestmark = pytest.mark.slow


def req(tokens, rid="x", max_tokens=4):
    return RouteRequest(rid, tuple(tokens), max_tokens)


# ------------------------------------------------------------------ pure policies
def test_round_robin_skips_a_replica_out_of_rotation():
    p = RoundRobin(3)
    p.mark_down(1, "dead")
    assert [p.route(req([1])) for _ in range(4)] == [0, 2, 0, 2]
    p.mark_up(1)
    assert sorted(p.route(req([1])) for _ in range(3)) == [0, 1, 2]


def test_least_loaded_never_picks_a_dead_replica_that_looks_idle():
    p = LeastLoaded(2)
    for _ in range(5):
        p.route(req([1]))
    p.mark_down(1, "its engine is gone")
    while p.outstanding_requests[1]:                 # its requests failed at once: "idle"
        p.on_finish(req([1]), 1)
    assert [p.route(req([1])) for _ in range(12)] == [0] * 12


def test_prefix_aware_does_not_follow_its_cache_to_a_dead_replica():
    prompt = list(range(64))
    p = PrefixAware(2, block_size=16)
    first = p.route(req(prompt))
    p.on_finish(req(prompt), first)
    assert p.route(req(prompt, "again")) == first      # the cache wins while it is up
    p.on_finish(req(prompt), first)
    p.mark_down(first, "stalled")
    assert p.route(req(prompt, "third")) == 1 - first
    assert p.last_match_blocks[first] > p.last_match_blocks[1 - first]


@pytest.mark.parametrize("name", ["round_robin", "least_loaded", "prefix_aware"])
def test_no_replica_in_rotation_is_said_not_guessed(name):
    p = make_policy(name, 2)
    p.mark_down(0, "killed")
    p.mark_down(1, "stopped")
    with pytest.raises(NoReplicaAvailable, match="replica 0: killed; replica 1: stopped"):
        p.route(req([1, 2, 3]))
    with pytest.raises(ValueError, match="replica must be"):
        p.mark_down(2, "no such replica")


# ------------------------------------------------------------------ real processes
ENGINE = dict(num_threads=1, num_blocks=64, block_size=16, max_num_seqs=8,
              max_num_batched_tokens=256)


@pytest.fixture
def replicas():
    from llminfra.cluster.router_run import Replicas, replica_engine
    reps = Replicas(2, partial(replica_engine, "tiny", **ENGINE)).start()
    try:
        yield reps
    finally:
        for loop in reps.loops:                       # a stopped replica must run to be ended
            if loop._proc is not None and loop._proc.is_alive():
                os.kill(loop._proc.pid, signal.SIGCONT)
        reps.stop()


def _workload():
    return shared_prompt_workload(30, torch.Generator().manual_seed(43), num_system_prompts=3,
                                  system_prompt_tokens=32, max_tokens=24, rate_per_s=8.0)


def _run_with(replicas, policy_name, sig, at_s, **run_options):
    from llminfra.cluster.router_run import run_policy
    victim = replicas.loops[1]._proc.pid
    hit = {}

    def strike():
        hit["t"] = time.perf_counter()
        os.kill(victim, sig)
    timer = threading.Timer(at_s, strike)
    t0 = time.perf_counter()
    timer.start()
    try:
        results = run_policy(replicas, make_policy(policy_name, 2), _workload(), **run_options)
    finally:
        timer.cancel()
    return results, hit["t"] - t0, time.perf_counter() - t0


def _check_every_request_ends(results, workload, dead_after_s):
    assert sorted(r.request_id for r in results) == sorted(w.request_id for w in workload)
    for r in results:
        if r.error is None:
            assert r.finish_reason == "length" and len(r.output_token_ids) == 24, r
        else:
            assert r.finish_reason == "error" and r.output_token_ids == () and r.error, r
    answered = [r for r in results if r.error is None]
    assert all(r.replica == 0 for r in answered if r.arrival_s > dead_after_s)
    assert any(r.replica == 0 for r in answered)
    failed = [r for r in results if r.error is not None]
    assert all(r.replica == 1 for r in failed), failed
    return failed


@pytest.mark.parametrize("policy", ["least_loaded", "prefix_aware"])
def test_a_replica_killed_mid_run(replicas, policy):
    """SIGKILL replica 1 one second in: every request gets a result; replica 1's in-flight ones
    fail naming it, and nothing is sent to it after the health check has seen it die."""
    results, killed_at, took = _run_with(replicas, policy, signal.SIGKILL, 1.0,
                                         deadline_s=60.0, stall_timeout_s=5.0)
    _check_every_request_ends(results, _workload(), killed_at + 1.0)
    # a 24-token request takes tens of ms on the tiny model: replica 1 may hold none at the kill
    # (then nothing fails), but it served before it and serves nothing after
    assert any(r.replica == 1 and r.error is None for r in results if r.arrival_s < killed_at)
    assert all("replica 1" in r.error for r in results if r.error)
    late = [r for r in results if r.arrival_s > killed_at + 1.0]
    assert late and all(r.replica == 0 and r.error is None for r in late)
    assert took < 60


def test_a_replica_stopped_mid_run(replicas):
    """SIGSTOP replica 1: the health check sees no progress for ``stall_timeout_s`` and takes
    it out of rotation; its requests fail with that reason; the run returns."""
    stall = 2.0
    results, stopped_at, took = _run_with(replicas, "round_robin", signal.SIGSTOP, 1.0,
                                          deadline_s=60.0, stall_timeout_s=stall)
    assert _check_every_request_ends(results, _workload(), stopped_at + stall + 1.5)
    assert any("no progress" in r.error for r in results if r.error)
    assert took < 30, f"the run took {took:.1f} s"


def test_a_per_request_deadline_ends_a_run_on_a_stopped_replica(replicas):
    """With the health check out of the way (a long stall timeout), the deadline alone ends
    the stopped replica's requests."""
    results, _, took = _run_with(replicas, "round_robin", signal.SIGSTOP, 0.5,
                                 deadline_s=4.0, stall_timeout_s=600.0)
    assert len(results) == 30
    late = [r for r in results if r.error and "within 4 s" in r.error]
    assert late and all(r.replica == 1 for r in late)
    assert took < 40
