"""Static batching keeps its batch's shape: a member that finishes stays as a padding row —
computed, one discarded token a step, blocks held — until the batch's longest member is done,
as HF ``generate`` on a batch and the request-level baselines of Orca (OSDI '22, §2.2) and vLLM
(arXiv:2309.06180) do. Outputs do not change; every block comes back; admission reserves for
the padding; an abort frees at once; forks pad too; the simulator pays for the padding."""

import itertools

import pytest
import torch

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.kvcache.blocks import blocks_needed
from llminfra.model import ByteTokenizer, DenseKVCache, ModelConfig, Transformer, generate
from llminfra.sim.simulator import Simulator
from llminfra.sim.workload import WorkloadRequest

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=64)
TOK = ByteTokenizer()


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def model64():
    """float64, so that batching cannot flip a near-tie of the argmax by rounding."""
    return Transformer(CFG, generator=torch.Generator().manual_seed(77)).double().eval()


def _engine(model, **kw):
    ticks = itertools.count()
    engine = LLMEngine(model, TOK, clock=lambda: float(next(ticks)), **kw)
    engine.step_log = []
    return engine


def _alone(model, prompt, max_tokens):
    return generate(model, prompt, max_tokens, cache=DenseKVCache(model.config.n_layers))


def _drive(engine):
    """Step until idle; every block must be back the moment the engine reports itself idle."""
    while engine.has_unfinished_requests():
        engine.step()
    alloc = engine.cache.allocator
    alloc.check_invariants()
    assert alloc.num_free == alloc.num_blocks and not engine.cache.tables, "blocks held"
    assert engine.stats()["num_padding"] == 0


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_finished_rows_are_computed_until_the_longest_is_done(model64, policy):
    """Prompts 1, 2, 3, 4 tokens, max_tokens 2, 9, 3, 5, one batch: all 4 rows are in each of
    the 9 steps; a padding row reads one token a step at its next position (``a``: 1 + 1
    computed after its 2 tokens, then 3, 4, ... up to 1 + 8 = 9), gets no token, and its
    request is reported finished at its real last step. Continuous batching shrinks instead."""
    prompts, max_tokens = ["a", "bb", "ccc", "dddd"], [2, 9, 3, 5]
    params = [SamplingParams(max_tokens=k) for k in max_tokens]
    engine = _engine(model64, policy=policy, num_blocks=40, block_size=4, dynamic_window_s=0)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    held, padded = [], []
    while engine.has_unfinished_requests():
        outs = {o.request_id: o for o in engine.step()}
        held.append((len(engine.cache.tables), engine.stats()["num_padding"]))
        padded.append([s.request.request_id for s in engine.last_scheduled.padding])
        assert not set(padded[-1]) & set(outs), "a padding row was reported"
    assert [len(b) for b, _ in engine.step_log] == [4] * 9
    assert [p.count(ids[0]) for p in padded] == [0, 0] + [1] * 7       # 'a' pads steps 3..9
    a_context = [b[len(b) - len(pad) + pad.index(ids[0])][1]
                 for (b, _), pad in zip(engine.step_log, padded) if ids[0] in pad]
    assert a_context == list(range(3, 10))
    assert engine.stats()["generation_tokens_total"] == sum(max_tokens)
    # finished rows keep their tables (and blocks) until the last one is done: 'a' after
    # step 2, 'ccc' after 3, 'dddd' after 5; then everything is freed at once
    assert held == [(4, 0), (4, 1), (4, 2), (4, 2), (4, 3), (4, 3), (4, 3), (4, 3), (0, 0)]
    cont = _engine(model64, policy="continuous", num_blocks=40, block_size=4)
    outs = cont.generate(prompts, params)
    assert [len(b) for b, _ in cont.step_log] == [4, 4, 3, 2, 2, 1, 1, 1, 1]
    for p, k, o in zip(prompts, max_tokens, outs):
        assert o.outputs[0].token_ids == _alone(model64, TOK.encode(p), k)


def test_outputs_and_finish_times_unchanged_and_every_block_returns(model64):
    """Static outputs equal one-at-a-time generation and each request finishes at its own last
    token (not at the batch's end); the pool is whole as soon as the engine is idle."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (int(n),), generator=g).tolist() for n in (3, 17, 9, 25, 6)]
    max_tokens = [12, 2, 7, 4, 1]
    engine = _engine(model64, policy="static", num_blocks=60, block_size=4, max_num_seqs=3)
    ids = [engine.add_request(p, SamplingParams(max_tokens=k))
           for p, k in zip(prompts, max_tokens)]
    got, when = {}, {}
    step = 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                got[o.request_id], when[o.request_id] = o.outputs[0].token_ids, step
        step += 1
        if not engine.has_unfinished_requests():
            assert engine.cache.allocator.num_free == 60 and not engine.cache.tables
    for i, p, k in zip(ids, prompts, max_tokens):
        assert got[i] == _alone(model64, p, k)
    assert when[ids[1]] < when[ids[0]]          # batch 1 = requests 0-2: 1 leaves before 0
    assert [len(b) for b, _ in engine.step_log] == [3] * 12 + [2] * 4   # batches of 3 and 2
    engine.cache.allocator.check_invariants()


def test_admission_reserves_the_padding(model64):
    """Block 4, prompts of 4. A wants 12 tokens, B and C 2. Padded to A's length, each row may
    hold 4 + 12 = 16 tokens = 4 blocks; a pool of 8 takes A and B only (reserving prompt +
    own max_tokens, 4 + 2 + 2 = 8, would take C too). B's padding then grows into exactly its
    4 blocks: no preemption, and the first batch keeps 2 rows for all of A's 12 steps."""
    engine = _engine(model64, policy="static", num_blocks=8, block_size=4, max_num_seqs=3)
    a, b, c = (engine.add_request(p, SamplingParams(max_tokens=k))
               for p, k in (("aaaa", 12), ("bbbb", 2), ("cccc", 2)))
    assert 2 * blocks_needed(4 + 12, 4) == 8
    _drive(engine)
    assert engine.stats()["num_preemptions"] == 0
    assert [len(b) for b, _ in engine.step_log] == [2] * 12 + [1] * 2
    assert max(c for b, _ in engine.step_log for _, c in b) == 4 + 11   # B's padding at 15


def test_padding_stops_at_the_context(model64):
    """A (prompt 60, 2 tokens) holds 61 tokens when done; its padding row reads positions 61,
    62, 63 and then stops, since 64 is the context; B (prompt 3, 12 tokens) goes on alone."""
    engine = _engine(model64, policy="static", num_blocks=40, block_size=4)
    engine.add_request(list(range(60)), SamplingParams(max_tokens=2))
    engine.add_request("xyz", SamplingParams(max_tokens=12))
    _drive(engine)
    assert [len(b) for b, _ in engine.step_log] == [2] * 5 + [1] * 7
    assert max(c for b, _ in engine.step_log for _, c in b) == 64


def test_abort_frees_at_once_and_ends_the_batch(model64):
    """Static batch of A (30 tokens), B (20), C (2). After C finishes it pads. Aborting A frees
    A's blocks at once and the batch goes on with B (and C's padding); aborting B then ends
    the batch: C's padding goes too, before any further step."""
    engine = _engine(model64, policy="static", num_blocks=60, block_size=4)
    a, b, c = (engine.add_request(p, SamplingParams(max_tokens=k))
               for p, k in (("a" * 8, 30), ("b" * 8, 20), ("c" * 8, 2)))
    for _ in range(4):
        engine.step()
    seq_a, seq_b = engine.requests[a].seqs[0], engine.requests[b].seqs[0]
    held_a = len(engine.cache.tables[seq_a.cache_seq].blocks)
    used = engine.stats()["kv_blocks_used"]
    assert engine.stats()["num_padding"] == 1
    assert engine.abort_request(a)
    assert seq_a.cache_seq is None and engine.stats()["kv_blocks_used"] == used - held_a
    assert engine.stats()["num_padding"] == 1 and engine.has_unfinished_requests()
    outs = {o.request_id: o for o in engine.step()}
    assert outs[a].finished and outs[a].outputs[0].finish_reason == "abort"
    assert len(engine.step_log[-1][0]) == 2                     # B and C's padding
    assert engine.abort_request(b)
    assert seq_b.cache_seq is None and engine.scheduler.has_unfinished() is False
    assert engine.stats()["kv_blocks_used"] == 0 and not engine.cache.tables
    assert engine.has_unfinished_requests()             # B's final output is still to be handed over
    outs = {o.request_id: o for o in engine.step()}
    assert outs[b].outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()


def test_forked_completions_pad_too(model64):
    """n = 2 (greedy: both completions equal the one-at-a-time output) of 3 tokens beside a
    request of 10: both forks are padded until the long one is done, outputs unchanged."""
    prompt, other = list(range(40, 52)), list(range(100, 105))
    engine = _engine(model64, policy="static", num_blocks=40, block_size=4)
    r = engine.add_request(prompt, SamplingParams(max_tokens=3, n=2))
    o = engine.add_request(other, SamplingParams(max_tokens=10))
    final = {}
    while engine.has_unfinished_requests():
        final.update({x.request_id: x for x in engine.step() if x.finished})
    assert [c.token_ids for c in final[r].outputs] == [_alone(model64, prompt, 3)] * 2
    assert final[o].outputs[0].token_ids == _alone(model64, other, 10)
    assert [len(b) for b, _ in engine.step_log] == [2] + [3] * 9      # prompt, then 3 rows
    engine.cache.allocator.check_invariants()
    assert engine.cache.allocator.num_free == 40 and not engine.cache.tables


def test_simulator_pays_for_padding_and_returns_every_block(monkeypatch):
    """Step time = rows in the batch. A (prompt 4, 1 token) and B (prompt 4, 3 tokens), budget
    8: step 1 reads both prompts (2 rows, 2 s); steps 2 and 3 decode B and pad A (2 rows each),
    so B finishes at 6 s, not at 4 s as a shrinking batch would. Every block comes back."""
    import llminfra.sim.simulator as simulator
    caches = []

    class Recorded(simulator.PagedKVCache):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            caches.append(self)

    monkeypatch.setattr(simulator, "PagedKVCache", Recorded)
    sim = Simulator(lambda batch: float(len(batch)), num_blocks=8, block_size=4, max_seq_len=64,
                    max_num_batched_tokens=8, policy="static")
    res = sim.run([WorkloadRequest(0.0, 4, 1), WorkloadRequest(0.0, 4, 3)])
    assert [b for _, b, _ in res.steps] == [[(4, 4), (4, 4)], [(1, 5), (1, 5)], [(1, 6), (1, 6)]]
    assert [m.finished_time for m in res.metrics] == [2.0, 6.0]
    alloc = caches[0].allocator
    assert alloc.num_free == alloc.num_blocks and not caches[0].tables
    g = torch.Generator().manual_seed(3)
    work = [WorkloadRequest(0.1 * i, int(p), int(o)) for i, (p, o) in
            enumerate(zip(torch.randint(1, 40, (30,), generator=g),
                          torch.randint(1, 20, (30,), generator=g)))]
    for policy in ("static", "dynamic"):
        res = Simulator(lambda batch: 1.0, num_blocks=24, block_size=4, max_seq_len=64,
                        max_num_seqs=4, max_num_batched_tokens=16, policy=policy).run(work)
        assert all(m.finished_time is not None for m in res.metrics)
        alloc = caches[-1].allocator
        assert alloc.num_free == alloc.num_blocks and not caches[-1].tables


def test_padding_never_takes_a_block_a_member_needs(model64):
    """Chunked prefill can start members' decodes at different steps, so a row can outgrow
    ``p + M``. B (prompt 2, 1 token) is done in step 1; A (prompt 32, 4 tokens, chunks of 4)
    reads its prompt until step 8 and decodes until step 11. B's padding would reach 12 tokens
    = 3 blocks, but the pool (blocks_needed(36) + blocks_needed(6) = 9 + 2 = 11, as reserved)
    leaves it 2: its padding stops at 8 tokens instead of preempting A."""
    engine = _engine(model64, policy="static", num_blocks=11, block_size=4,
                     max_num_batched_tokens=16, max_prefill_chunk_tokens=4)
    b = engine.add_request([7, 8], SamplingParams(max_tokens=1))
    a = engine.add_request(list(range(32)), SamplingParams(max_tokens=4))
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.stats()["num_preemptions"] == 0
    assert outs[a].outputs[0].token_ids == _alone(model64, list(range(32)), 4)
    assert outs[b].outputs[0].token_ids == _alone(model64, [7, 8], 1)
    assert [len(s) for s, _ in engine.step_log] == [2] * 7 + [1] * 4   # B pads 2..7: 8 tokens
    assert engine.cache.allocator.num_free == 11


def test_padding_gives_way_when_a_request_outgrows_the_pool(model64):
    """n = 2 of prompt 19 and 11 tokens may take 2 × blocks_needed(30) = 16 blocks of 4; a pool
    of 11 runs it alone and swaps one completion out. The other finishes first and would pad;
    its blocks go back instead, so the swapped one can return (no deadlock), and both
    completions equal one-at-a-time generation."""
    prompt = [0] * 19
    engine = _engine(model64, policy="static", num_blocks=11, block_size=4,
                     max_num_batched_tokens=8, enable_chunked_prefill=False,
                     preemption="swap")
    r = engine.add_request(prompt, SamplingParams(max_tokens=11, n=2))
    final = {}
    for _ in range(200):
        final.update({o.request_id: o for o in engine.step() if o.finished})
        if not engine.has_unfinished_requests():
            break
    assert engine.stats()["num_preemptions"] > 0
    assert [c.token_ids for c in final[r].outputs] == [_alone(model64, prompt, 11)] * 2
    assert engine.cache.allocator.num_free == 11 and not engine.cache.tables


def test_padding_counts_against_the_token_budget(model64):
    """Budget 8, chunked. Step 1: B's prompt (2, done) + 6 of A's 24; steps 2 and 3: 8 more
    each — no room for B's padding; step 4: A's last 2 + B's padding; steps 5-6: A decodes, B
    pads. No step computes more than 8 tokens, padding included."""
    engine = _engine(model64, policy="static", num_blocks=40, block_size=4,
                     max_num_batched_tokens=8)
    engine.add_request([7, 8], SamplingParams(max_tokens=1))
    engine.add_request(list(range(24)), SamplingParams(max_tokens=3))
    _drive(engine)
    assert [len(b) for b, _ in engine.step_log] == [2, 1, 1, 2, 2, 2]
    assert max(sum(n for n, _ in b) for b, _ in engine.step_log) == 8
