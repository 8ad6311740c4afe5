"""Routing over data-parallel replicas (:mod:`llminfra.cluster.router`, ``router_run``,
``router_workload``): the policies as pure objects, then 2 real engine processes on the tiny
model (one spawn for the file) — every request finishes, greedy outputs equal one engine's, and
prefix-aware routing hits the cache at least as often as round robin."""

from functools import partial

import pytest
import torch

from llminfra.cluster.router import (POLICIES, LeastLoaded, PrefixAware, RoundRobin,
                                     RouteRequest, make_policy)
from llminfra.cluster.router_workload import shared_prompt_workload, with_cache_salt
from llminfra.kvcache.prefix_cache import prefix_block_hashes


def req(tokens, rid="x", max_tokens=4):
    return RouteRequest(rid, tuple(tokens), max_tokens)


def random_prompt(g, n):
    return torch.randint(32, 127, (n,), generator=g).tolist()


# ------------------------------------------------------------------ pure policies
def test_round_robin_cycles():
    n = 3
    p = RoundRobin(n)
    got = [p.route(req([1, 2, 3], str(k))) for k in range(7)]
    assert got == [0, 1, 2, 0, 1, 2, 0]
    assert p.dispatched == [3, 2, 2] and p.outstanding_requests == [3, 2, 2]


def test_least_loaded_picks_the_minimum():
    g = torch.Generator().manual_seed(1)
    p = LeastLoaded(4)
    live = []
    for k in range(40):                       # random dispatches and finishes
        if live and torch.rand((), generator=g) < 0.4:
            r, i = live.pop(int(torch.randint(0, len(live), (), generator=g)))
            p.on_finish(r, i)
            continue
        r = req(range(int(torch.randint(1, 50, (), generator=g))), str(k))
        before = list(zip(p.outstanding_requests, p.outstanding_tokens))
        i = p.route(r)
        assert before[i] == min(before)                   # fewest requests, then tokens
        live.append((r, i))
    assert p.outstanding_requests == [sum(1 for _, i in live if i == j) for j in range(4)]
    assert p.outstanding_tokens == [sum(r.num_tokens for r, i in live if i == j)
                                    for j in range(4)]


def test_least_loaded_breaks_request_ties_by_tokens():
    p = LeastLoaded(2)
    p.on_dispatch(req(range(100)), 0)
    p.on_dispatch(req(range(5)), 1)
    assert p.choose(req([1])) == 1            # equal requests, fewer tokens on 1
    p.on_dispatch(req(range(5)), 1)
    assert p.choose(req([1])) == 0            # fewer requests wins over tokens


def test_least_loaded_lets_idle_replicas_take_turns():
    p = LeastLoaded(3)
    got = []
    for k in range(6):                        # each request ends before the next arrives
        r = req([1, 2], str(k))
        got.append(p.route(r))
        p.on_finish(r, got[-1])
    assert got == [0, 1, 2, 0, 1, 2]


def test_prefix_aware_sends_a_repeated_prefix_to_one_replica_and_spreads_new_ones():
    g = torch.Generator().manual_seed(7)
    B = 16
    systems = [random_prompt(g, 5 * B) for _ in range(4)]
    p = PrefixAware(2, block_size=B)
    home = {}
    for k in range(40):
        s = k % 4
        r = req(systems[s] + random_prompt(g, int(torch.randint(1, 20, (), generator=g))), str(k))
        i = p.route(r)
        home.setdefault(s, set()).add(i)
        p.on_finish(r, i)                     # done before the next one: load stays even
    assert all(len(v) == 1 for v in home.values())       # each prefix sticks to one replica
    assert sorted(len([s for s in home if i in home[s]]) for i in range(2)) == [2, 2]


def test_prefix_aware_matches_the_engine_hashes_and_the_longest_prefix():
    g = torch.Generator().manual_seed(3)
    B = 4
    base = random_prompt(g, 6 * B)
    p = PrefixAware(3, block_size=B, cache_threshold=0.0)
    p.on_dispatch(req(base[:2 * B] + random_prompt(g, 8)), 0)
    p.on_dispatch(req(base[:5 * B] + random_prompt(g, 3)), 2)
    hashes = prefix_block_hashes(base, B)
    assert [p.match_blocks(hashes, i) for i in range(3)] == [2, 0, 5]
    assert p.choose(req(base)) == 2 and p.last_reason == "prefix"


def test_prefix_aware_guards_overload_and_forgets_old_blocks():
    g = torch.Generator().manual_seed(4)
    B = 8
    hot = random_prompt(g, 4 * B)
    p = PrefixAware(2, block_size=B, balance_abs_threshold=2, balance_rel_threshold=1.5,
                    max_blocks_per_replica=6)
    for k in range(3):
        p.on_dispatch(req(hot + [k]), 0)      # 3 outstanding on 0, none on 1
    assert p.choose(req(hot + [9])) == 1 and p.last_reason == "imbalanced"
    p.on_dispatch(req(random_prompt(g, 5 * B)), 0)        # 5 new blocks push 3 of hot out
    assert p.indexed_blocks()[0] == 6
    assert p.match_blocks(prefix_block_hashes(hot, B), 0) == 0


def test_bad_policy_name_and_bad_arguments():
    with pytest.raises(ValueError) as e:
        make_policy("random", 2)
    for name in POLICIES:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="num_replicas"):
        make_policy("round_robin", 0)
    with pytest.raises(ValueError, match="block_size"):
        make_policy("prefix_aware", 2, block_size=0)
    p = RoundRobin(2)
    with pytest.raises(ValueError, match="replica"):
        p.on_dispatch(req([1]), 2)
    with pytest.raises(ValueError, match="outstanding"):
        p.on_finish(req([1]), 0)


def test_shared_prompt_workload_is_seeded_and_shares_prefixes():
    kw = dict(num_system_prompts=3, system_prompt_tokens=32, rate_per_s=10.0)
    a = shared_prompt_workload(30, torch.Generator().manual_seed(5), **kw)
    b = shared_prompt_workload(30, torch.Generator().manual_seed(5), **kw)
    assert a == b
    assert all(r.prompt_token_ids[:32] == a[[x.system_prompt for x in a].index(
        r.system_prompt)].prompt_token_ids[:32] for r in a)
    assert len({r.prompt_token_ids[:32] for r in a}) == 3
    assert [r.arrival_time_s for r in a] == sorted(r.arrival_time_s for r in a)
    salted = with_cache_salt(a, 7)
    assert all(s.prompt_token_ids == (7,) + r.prompt_token_ids for s, r in zip(salted, a))
    with pytest.raises(ValueError, match="user_tokens"):
        shared_prompt_workload(3, torch.Generator(), user_tokens=(5, 2))


def test_the_engine_counts_cached_prompt_tokens():
    from llminfra.engine import LLMEngine, SamplingParams
    from llminfra.model import load_tiny
    model, tok = load_tiny()
    engine = LLMEngine(model, tok, block_size=16, enable_prefix_caching=True)
    g = torch.Generator().manual_seed(9)
    shared = random_prompt(g, 40)                          # 2 full blocks + 8 tokens
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    cached = []
    for tail in (random_prompt(g, 5), random_prompt(g, 30)):
        rid = engine.add_request(shared + tail, params)
        final = None
        while engine.has_unfinished_requests():
            final = next((o for o in engine.step() if o.request_id == rid and o.finished), final)
        cached.append(final.metrics.num_cached_prompt_tokens)
    assert cached == [0, 32]                               # only full blocks are shared


# ------------------------------------------------------------------ real processes
ENGINE = dict(num_threads=1, num_blocks=32, block_size=16, max_num_seqs=8,
              max_num_batched_tokens=256)


@pytest.fixture(scope="module")
def replicas():
    from llminfra.cluster.router_run import Replicas, replica_engine
    with Replicas(2, partial(replica_engine, "tiny", **ENGINE)) as reps:
        yield reps


@pytest.mark.slow
def test_two_replica_processes_route_finish_and_match_one_engine(replicas):
    from llminfra.engine import LLMEngine, SamplingParams
    from llminfra.model import load_tiny
    from llminfra.cluster.router_run import compare_policies

    # 20 requests/s: a request arrives after the one before it on its replica has cached its
    # prompt, on a loaded CI machine too (at 200/s they overlapped there, and prefix-aware's
    # hit rate fell below round robin's: 0.386 against 0.435; quiet, both rates give 0.58)
    workload = shared_prompt_workload(16, torch.Generator().manual_seed(11),
                                      num_system_prompts=4, system_prompt_tokens=64,
                                      max_tokens=4, rate_per_s=20.0)
    result = compare_policies(replicas, workload, policies=("round_robin", "prefix_aware"),
                              block_size=16, max_blocks_per_replica=32)
    model, tok = load_tiny()
    single = LLMEngine(model, tok, block_size=16, max_num_seqs=8)
    for k, (name, run) in enumerate(result.items()):
        res = run["results"]
        assert len(res) == 16 and all(r["finish_reason"] == "length" for r in res), name
        assert sum(run["requests_per_replica"]) == 16
        want = single.generate([list(r.prompt_token_ids) for r in with_cache_salt(workload, k)],
                               SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        assert [tuple(r["output_token_ids"]) for r in res] == \
            [tuple(w.outputs[0].token_ids) for w in want], name
        assert all(0 <= r["cached_prompt_tokens"] < r["prompt_tokens"] for r in res)
    assert result["prefix_aware"]["prefix_hit_rate"] >= result["round_robin"]["prefix_hit_rate"]
    assert result["prefix_aware"]["prefix_hit_rate"] > 0.3


def test_hit_rate_ceiling_counts_each_prompts_first_request_as_a_miss():
    """The ceiling no router beats: each system prompt's first request computes it, every later
    one finds its whole blocks cached (at least one prompt token is always computed)."""
    from llminfra.cluster.router_workload import prefix_hit_rate_ceiling
    work = with_cache_salt(shared_prompt_workload(
        40, torch.Generator().manual_seed(0), num_system_prompts=3, system_prompt_tokens=47,
        user_tokens=(5, 9)), 7)
    firsts = {r.system_prompt: r.request_id for r in reversed(sorted(
        work, key=lambda r: r.arrival_time_s))}
    shared = (1 + 47) // 16 * 16            # salt + system prompt, in whole blocks of 16
    want = sum(0 if r.request_id in firsts.values() else shared for r in work) / sum(
        len(r.prompt_token_ids) for r in work)
    assert prefix_hit_rate_ceiling(work, 16) == pytest.approx(want)
    with pytest.raises(ValueError, match="block_size"):
        prefix_hit_rate_ceiling(work, 0)
