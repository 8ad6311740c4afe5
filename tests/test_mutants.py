"""Tests written against hand-made mutants of core rules (issue 25, §4): each fails when its rule
is broken the way named in its docstring, a way the rest of the suite let through.

Two blind spots recur. A rule with an off-by-one neighbour (``<`` / ``<=``, ``>`` / ``>=``) is
only caught by a test AT the boundary, on both sides of it. A transformation followed by a
renormalisation (temperature after the softmax, when ``torch.multinomial`` normalises anyway)
is invisible to any check of "the result is a distribution": only the drawn frequencies tell.
Every test here is deterministic: fixed seeds, a fake clock, exact boundaries."""

import json
import math

import httpx
import pytest
import torch

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.engine.sampler import sample_tokens
from llminfra.model import ByteTokenizer, ModelConfig, Transformer

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=64)
TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def model(one_thread):
    return Transformer(CFG, generator=torch.Generator().manual_seed(25)).eval()


def _drain(engine, check=None) -> list:
    """Step until idle (bounded), calling ``check(engine)`` after every step; final outputs."""
    final = {}
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        if check:
            check(engine)
    assert not engine.has_unfinished_requests(), "the engine did not drain in 2000 steps"
    alloc = engine.cache.allocator
    alloc.check_invariants()
    assert alloc.num_free == alloc.num_blocks, "blocks leaked"
    return list(final.values())


# ---- mutant 1: the admission bound, ``len(running) < max_num_seqs`` ----------------------------
@pytest.mark.parametrize("policy", ["continuous", "static", "dynamic"])
@pytest.mark.parametrize("num_blocks, preemption", [(8, "recompute"), (8, "swap"),
                                                    (64, "recompute")])
def test_running_batch_reaches_max_num_seqs_and_never_passes_it(model, policy, num_blocks,
                                                                preemption):
    """Mutant: ``len(self.running) <= max_num_seqs`` (admission, or forming a static batch):
    3 sequences run with ``max_num_seqs = 2``. Five one-sequence requests, in a pool tight
    enough to preempt (8 blocks of 4) or roomy enough that only ``max_num_seqs`` bounds a static
    batch (64): the running batch is exactly 2 at its fullest (not 1: the other neighbour).
    (The same bound on swap-in never binds: running + swapped <= max_num_seqs already, as
    nothing is admitted while a sequence is swapped out.)"""
    engine = LLMEngine(model, TOK, num_blocks=num_blocks, block_size=4, max_num_seqs=2,
                       policy=policy, preemption=preemption, dynamic_window_s=0.0)
    for i in range(5):
        engine.add_request([65 + i] * (5 + 3 * i), SamplingParams(max_tokens=6, ignore_eos=True))
    sizes = []
    _drain(engine, lambda e: sizes.append(len(e.scheduler.running)))
    assert max(sizes) == 2


def test_admit_fcfs_stops_at_max_num_seqs():
    """The closed form of the same bound: 3 running of at most 4, plenty of blocks and budget:
    exactly one more is admitted (``>=`` → ``>`` would admit 2)."""
    from llminfra.sim.scheduling_rules import admit_fcfs
    kw = dict(free_blocks=100, block_size=16, max_num_seqs=4, max_num_batched_tokens=10_000)
    assert admit_fcfs([5, 5, 5], num_running=3, **kw) == 1
    assert admit_fcfs([5, 5, 5], num_running=4, **kw) == 0
    assert admit_fcfs([5, 5, 5], num_running=0, **kw) == 3


def test_dynamic_batch_starts_exactly_at_its_window_or_its_size(model):
    """Mutants: ``>`` for ``>=`` in either trigger of dynamic batching. Window 1 s on a fake
    clock: a request that arrived at t = 0 waits at t = 0.5 and starts at t = 1.0 exactly;
    with ``max_num_seqs = 3``, three waiting requests start at once, two wait."""
    t = [0.0]
    engine = LLMEngine(model, TOK, policy="dynamic", max_num_seqs=3, dynamic_window_s=1.0,
                       clock=lambda: t[0])
    engine.add_request("x", SamplingParams(max_tokens=1))
    t[0] = 0.5
    assert engine.step() == []
    t[0] = 1.0
    assert [o.finished for o in engine.step()] == [True]
    for p in "ab":
        engine.add_request(p, SamplingParams(max_tokens=1))
    assert engine.step() == []                         # 2 of 3, window not over
    engine.add_request("c", SamplingParams(max_tokens=1))
    assert len(engine.step()) == 3                     # 3 of 3: at once


def test_memory_context_limit_is_inclusive():
    """Mutant: ``context >= max_positions`` refuses the model's own context. GPT-2 lists 1,024
    positions: 1,024 tokens are allowed, 1,025 are not."""
    from llminfra.calc.memory import inference_memory
    assert inference_memory("gpt2", context=1024).context == 1024
    with pytest.raises(ValueError, match="allowed: 1..1024"):
        inference_memory("gpt2", context=1025)


# ---- mutant 2: temperature divides the logits, before the softmax -----------------------------
def _draws(logits: list[float], n: int = 400, seed: int = 2025, **params) -> list[int]:
    """``n`` tokens drawn by the engine's sampler from one row of ``logits``."""
    p = SamplingParams(**params)
    g = torch.Generator().manual_seed(seed)
    rows = torch.tensor([logits] * n)
    return sample_tokens(rows, [p] * n, [g] * n)


def test_temperature_divides_the_logits_not_the_probabilities():
    """Mutant: ``softmax(z) / T``. ``torch.multinomial`` renormalises, so that is the same as
    T = 1: only the frequencies show it. Logits [0, 2]:
    T = 0.25 → z / T = [0, 8], p(0) = 1 / (1 + e^8) = 3.4e-4 (0.13 of 400 draws; the mutant's
    p(0) = 1 / (1 + e^2) = 0.119, 48 of 400);
    T = 4 → [0, 0.5], p(0) = 1 / (1 + e^0.5) = 0.378 (151 ± 10 of 400; the mutant's 48)."""
    assert _draws([0.0, 2.0], temperature=0.25).count(0) <= 3
    assert 110 <= _draws([0.0, 2.0], temperature=4.0).count(0) <= 190


def test_nucleus_is_taken_after_temperature():
    """Mutant: top-p on the untempered probabilities. Logits [2, 1, 0], top_p 0.8:
    at T = 0.5 the probabilities are softmax([4, 2, 0]) = [0.867, 0.117, 0.016], so the
    nucleus is {0} alone (0.867 >= 0.8) and every draw is token 0; at T = 1 they are
    [0.665, 0.245, 0.090], the nucleus is {0, 1}, and token 1 comes ~27% of the time."""
    assert set(_draws([2.0, 1.0, 0.0], temperature=0.5, top_p=0.8)) == {0}
    assert set(_draws([2.0, 1.0, 0.0], temperature=1.0, top_p=0.8)) == {0, 1}


def test_nucleus_boundary_is_exact():
    """Mutant: a token kept while the mass before it is ``<= p`` (``>`` for ``>=``). Four equal
    logits give probabilities of exactly 0.25 (and exact sums) in float32: the masses before the
    sorted tokens are [0, 0.25, 0.5, 0.75], so p = 0.5 keeps two tokens and p = 0.75 three."""
    assert len(set(_draws([0.0] * 4, temperature=1.0, top_p=0.5))) == 2
    assert len(set(_draws([0.0] * 4, temperature=1.0, top_p=0.75))) == 3
    assert len(set(_draws([0.0] * 4, temperature=1.0, top_p=0.7499))) == 3


def test_top_k_keeps_exactly_k():
    """Mutant: ``z <= kth`` masks the k-th largest too (keeps k - 1). Logits [3, 2, 1, 0],
    top_k 2, T = 1: tokens 0 and 1 only, both drawn (p = 0.73 / 0.27 of the two)."""
    assert set(_draws([3.0, 2.0, 1.0, 0.0], temperature=1.0, top_k=2)) == {0, 1}
    assert set(_draws([3.0, 2.0, 1.0, 0.0], temperature=1.0, top_k=1)) == {0}


# ---- mutant 3: copy-on-write of a shared last block needs a block -----------------------------
@pytest.mark.parametrize("num_blocks, prompt_len, max_tokens",
                         [(2, 6, 2), (3, 6, 3), (3, 9, 3), (4, 10, 4), (5, 13, 4)])
def test_forked_siblings_never_overdraw_the_pool(model, num_blocks, prompt_len, max_tokens):
    """Mutant: the scheduler counts no block for writing into a shared, partly filled last block
    (``BlockTable.blocks_to_append`` without its copy-on-write ``+1``). n = 2 forks the prompt: both siblings
    share its blocks, the last one partly filled (prompt_len not a multiple of 4). With no free
    block left, sibling 0's next token needs one (its private copy); the mutant schedules both
    anyway and ``prepare_step`` finds the pool empty (BlockPoolExhausted in the step). Right:
    one is preempted, both finish with all their tokens, and every block comes back."""
    engine = LLMEngine(model, TOK, num_blocks=num_blocks, block_size=4)
    params = SamplingParams(max_tokens=max_tokens, n=2, temperature=1.0, seed=7,
                            ignore_eos=True)
    engine.add_request([70] * prompt_len, params)
    (out,) = _drain(engine)
    assert [len(c.token_ids) for c in out.outputs] == [max_tokens, max_tokens]
    assert {c.finish_reason for c in out.outputs} == {"length"}


# ---- mutant 4: tensor-parallel KV heads are replicated when H_kv < ranks ----------------------
@pytest.mark.parametrize("model_name, n, heads_per_rank", [
    ("starcoder", 2, 1),        # H_kv = 1 (multi-query): every rank holds the one head
    ("starcoder", 8, 1),
    ("qwen2.5-7b", 8, 1),       # H_kv = 4 < 8 ranks: one head each, not half of one
    ("smollm2-135m", 2, 2),     # H_kv = 3 on 2 ranks: ceil(3 / 2) = 2, not 1.5
    ("llama-2-70b", 4, 2),      # H_kv = 8 on 4 ranks: split evenly, 2 each
])
def test_kv_bytes_per_rank_replicate_heads(model_name, n, heads_per_rank):
    """Mutant: ``heads_per_rank = H_kv / n`` (a fraction of a head). Per rank, a decode step at
    context 4,096 reads weights / n plus the KV of ceil(H_kv / n) heads: for StarCoder
    (40 layers, 1 KV head of 128, bf16) 2 · 40 · 128 · 2 = 20,480 bytes a token, all of it on
    every rank: 20,480 · 4,096 = 83,886,080 bytes, whatever n."""
    from llminfra.calc.memory import kv_bytes_per_token
    from llminfra.calc.roofline import Roofline, step_breakdown
    from llminfra.calc.step import weight_bytes
    from llminfra.specs import get_model
    spec = get_model(model_name)
    roof = Roofline("test", 1e15, 1e12)
    b = step_breakdown(model_name, roof, [(1, 4096)], tensor_parallel=n,
                       interconnect="nvlink-h100" if n > 1 else None)
    kv_all = kv_bytes_per_token(spec, "bf16") * 4096
    expected = weight_bytes(spec, "bf16") / n + kv_all * heads_per_rank / spec.num_kv_heads
    assert b["bytes_per_rank"] == pytest.approx(expected, rel=1e-12)
    if model_name == "starcoder":
        assert kv_all == 83_886_080


# ---- mutant 5: prompt + max_tokens <= max_model_len at the server -----------------------------
@pytest.fixture(scope="module")
def server(one_thread):
    from llminfra.serving.background import ServerThread
    from llminfra.serving.server import create_app
    from llminfra.model import load_tiny
    tiny, tok = load_tiny()
    with ServerThread(create_app(LLMEngine(tiny, tok, num_blocks=64), tok)) as srv:
        yield srv


def _complete(server, prompt_len: int, max_tokens: int) -> httpx.Response:
    body = {"model": "llminfra-tiny", "prompt": [97] * prompt_len, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)


def test_server_context_boundary_is_exact(server):
    """Mutant: the server allows prompt + max_tokens = max_model_len + 1. The tiny model's
    context is 256 tokens (``/v1/models``): 250 + 6 = 256 is served, all 6 tokens;
    250 + 7 = 257 is a 400 naming max_tokens; a 255-token prompt takes 1 token, a 256-token
    prompt none (400 naming the prompt)."""
    name = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"][0]
    assert name["max_model_len"] == 256
    ok = _complete(server, 250, 6)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 6
    over = _complete(server, 250, 7)
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
    # refused by the server's own check (an off-by-one there leaves it to the engine, whose
    # refusal from another process carries no code)
    assert over.json()["error"]["code"] == "context_length_exceeded"
    assert _complete(server, 255, 1).status_code == 200
    too_long = _complete(server, 256, 1)
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt"
    assert too_long.json()["error"]["code"] == "context_length_exceeded"


def test_server_n_limit_is_inclusive(server):
    """Mutant: ``n >= max_n`` refuses the largest allowed n. The server allows 8 completions a
    request: n = 8 gives 8 choices, n = 9 is a 400 naming n."""
    body = {"model": "llminfra-tiny", "prompt": "ab", "max_tokens": 1, "temperature": 1.0}
    ok = httpx.post(f"{server.base_url}/v1/completions", json={**body, "n": 8}, timeout=60)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 8
    over = httpx.post(f"{server.base_url}/v1/completions", json={**body, "n": 9}, timeout=60)
    assert over.status_code == 400 and over.json()["error"]["param"] == "n"


# ---- mutant 6: the load generator's TTFT runs from the request's send -------------------------
class FakeServer:
    """An OpenAI-compatible endpoint on a fake clock (``httpx.MockTransport``): each completion
    streams ``max_tokens`` one-character chunks, the first ``first_token_s`` after the request
    arrives, the next ones ``per_token_s`` apart, then its usage. Exact binary fractions, so
    every time is exact."""

    first_token_s, per_token_s = 0.25, 0.125

    def __init__(self):
        self.now = 0.0
        self.transport = httpx.MockTransport(self.handle)

    def clock(self) -> float:
        return self.now

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake", "max_model_len": 256}]})
        n = json.loads(request.content)["max_tokens"]

        async def stream():
            for i in range(n):
                self.now += self.first_token_s if i == 0 else self.per_token_s
                chunk = {"choices": [{"index": 0, "text": "x"}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            usage = {"choices": [], "usage": {"completion_tokens": n}}
            yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()
        return httpx.Response(200, content=stream(),
                              headers={"content-type": "text/event-stream"})


def test_loadtest_ttft_is_from_the_send_exactly():
    """Mutant: TTFT measured from the start of the run (``first_token_s`` alone, or a send time
    of 0). One client sends 6 requests one after another on a fake clock, so request k leaves
    at the end of request k - 1: its TTFT is 0.25 s for every k (the mutant's grows with k),
    its time per output token 0.125 s, its end-to-end 0.25 + 0.125 · (tokens − 1)."""
    from llminfra.serving.loadtest import loadtest_requests, run_loadtest
    fake = FakeServer()
    r = run_loadtest("http://fake", concurrency=1, num_requests=6, max_output_tokens=5,
                     progress=False, clock=fake.clock, transport=fake.transport)
    lengths = [q.output_len for q in loadtest_requests(6, 0, 256, max_output_tokens=5)]
    recs = r["requests"]
    assert r["num_ok"] == 6 and [q["output_tokens"] for q in recs] == lengths
    sent = [q["sent_s"] for q in recs]
    assert sent[0] == 0.0 and all(b > a for a, b in zip(sent, sent[1:]))   # staggered sends
    assert [q["first_token_s"] - q["sent_s"] for q in recs] == [0.25] * 6
    assert [q["done_s"] - q["sent_s"] for q in recs] == [0.25 + 0.125 * (n - 1) for n in lengths]
    assert r["ttft_s"] == {"mean": 0.25, "std": 0.0, "p50": 0.25, "p90": 0.25, "p95": 0.25,
                           "p99": 0.25}
    assert r["e2e_s"]["mean"] == pytest.approx(sum(0.25 + 0.125 * (n - 1) for n in lengths) / 6)
    tpot = dict(r["tpot_s"])                                               # every request > 1 token
    assert math.isclose(tpot.pop("std"), 0.0, abs_tol=1e-12)
    assert all(math.isclose(v, 0.125) for v in tpot.values())
    assert r["wall_s"] == fake.now == sum(0.25 + 0.125 * (n - 1) for n in lengths)
