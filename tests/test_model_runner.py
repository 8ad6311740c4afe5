"""The engine's model runners: the fast fused step gives the readable model's tokens, its CUDA
graph path (emulated on the CPU: the same buffers, the same padded call) gives the eager step's
tokens on every bucket, and a decode step of bench-100m stays within its torch-call budget."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from llminfra.bench.roofline import count_torch_calls
from llminfra.engine import LLMEngine, SamplingParams, SpeculativeConfig
from llminfra.engine.model_runner import make_runner
from llminfra.model import ByteTokenizer, ModelConfig, Transformer, tiny_moe_model
from llminfra.runner import FastRunner, KernelSet, fast_runner, graph_buckets, runner_for
from llminfra.runner.fast_step import decode_step, layer_pools

#: the issue's budget: 25 torch calls a layer and 40 for the rest of the step
CALLS_PER_LAYER, CALLS_PER_STEP = 25, 40


@pytest.fixture(scope="module")
def small():
    """A 3-layer model with grouped-query heads and random weights, and the byte tokenizer."""
    config = ModelConfig(vocab_size=256, dim=64, n_layers=3, n_heads=4, n_kv_heads=2,
                         ffn_dim=128, max_seq_len=256)
    return Transformer(config, torch.Generator().manual_seed(1)).eval(), ByteTokenizer()


def prompts(rng: random.Random, n: int) -> list[list[int]]:
    return [[rng.randrange(1, 256) for _ in range(rng.randrange(1, 60))] for _ in range(n)]


def tokens(engine: LLMEngine, ps, params) -> list[list[list[int]]]:
    return [[c.token_ids for c in out.outputs] for out in engine.generate(ps, params)]


SETTINGS = [
    dict(max_num_seqs=4, max_num_batched_tokens=64),                 # chunked prefill, mixing
    dict(max_num_seqs=8, max_num_batched_tokens=512, enable_prefix_caching=True),
    dict(max_num_seqs=3, max_num_batched_tokens=32, policy="static"),  # padding rows
    dict(max_num_seqs=6, max_num_batched_tokens=128, num_blocks=12, block_size=8),  # preemption
]


@pytest.mark.parametrize("settings", SETTINGS, ids=["chunked", "prefix", "static", "preempt"])
def test_fast_runner_gives_the_readable_tokens(small, settings):
    rng = random.Random()
    seed = rng.randrange(2**31)
    ps = prompts(random.Random(seed), 9)
    ps.append(ps[0][:5] + ps[1])                                 # a shared beginning
    greedy = SamplingParams(max_tokens=12, ignore_eos=True)
    want = tokens(LLMEngine(*small, **settings), ps, greedy)
    got = tokens(LLMEngine(*small, runner=fast_runner(), **settings), ps, greedy)
    assert got == want, f"seed {seed}"


def test_fast_runner_sampling_forks_and_speculation(small):
    """Seeded sampling, n = 3 siblings that fork after the prompt, and n-gram drafts verified
    by multi-token steps: the same tokens on both runners."""
    ps = ["abcabcabcabc", "hello hello hello", "xyz"]
    sampled = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=3, n=3,
                             ignore_eos=True)
    spec = SpeculativeConfig("ngram", 3)
    for kw in (dict(), dict(speculative=spec)):
        want = tokens(LLMEngine(*small, **kw), ps, sampled)
        got = tokens(LLMEngine(*small, runner=fast_runner(), **kw), ps, sampled)
        assert got == want, kw


@pytest.mark.parametrize("batch", [1, 5] + [pytest.param(b, marks=pytest.mark.slow)
                                           for b in (2, 3, 8, 13, 16, 20)])
def test_graph_path_matches_the_eager_step_on_every_bucket(small, batch):
    """The graph path pads the batch to its bucket (padding lanes on the scratch block) and
    gathers every sequence's blocks up to the model's context; its tokens are the eager
    step's, and a replay ran for every decode step."""
    ps = prompts(random.Random(batch), batch)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    kw = dict(max_num_seqs=20, max_num_batched_tokens=2048)
    eager = LLMEngine(*small, runner=fast_runner(cuda_graphs=False), **kw)
    graphs = LLMEngine(*small, runner=fast_runner(cuda_graphs="emulate"), **kw)
    assert tokens(graphs, ps, params) == tokens(eager, ps, params)
    assert graphs.runner.graph_replays >= 7                       # 7 decode steps at least
    assert graphs.runner.buckets == [1, 2, 4, 8, 16, 20]


def test_padding_lanes_touch_no_sequence(small):
    """A padded decode step changes nothing outside the batch's own slots and the scratch
    block: the pool of every other block is the same bytes after the step."""
    model, tok = small
    engine = LLMEngine(model, tok, runner=fast_runner(cuda_graphs="emulate"), max_num_seqs=8)
    engine.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()                                                 # prefill both
    cache = engine.cache
    before = cache.k.clone(), cache.v.clone()
    engine.step()                                                 # one decode: bucket 2
    runner = engine.runner
    seqs = [s.cache_seq for s in engine.scheduler.running]
    written = {b * cache.block_size + (cache.seq_len(s) - 1) % cache.block_size
               for s in seqs for b in [cache.block_table(s)[(cache.seq_len(s) - 1)
                                                             // cache.block_size]]}
    flat_k = cache.k.flatten(1, 2)                                # (L, slots, H_kv, d)
    flat_before = before[0].flatten(1, 2)
    changed = set((flat_k != flat_before).any(-1).any(-1).any(0).nonzero().flatten().tolist())
    assert changed <= written and changed, (changed, written)
    assert runner.graph_replays == 1


@pytest.mark.slow
def test_torch_calls_of_a_decode_step_of_bench_100m():
    """One decode step of bench-100m at batch 1 and 16, counted with ``bench roofline``'s
    counter: within 25 calls a layer + 40 on the fast runner (the readable one makes about
    five times as many)."""
    config = ModelConfig.from_name("bench-100m")
    model = Transformer(config).eval()
    budget = CALLS_PER_LAYER * config.n_layers + CALLS_PER_STEP
    counts = {}
    for runner in ("fast", "readable"):
        for batch in (1, 16):
            engine = LLMEngine(model, ByteTokenizer(), runner=runner_for(runner), max_num_seqs=16,
                               max_num_batched_tokens=1024, num_blocks=64)
            for i in range(batch):
                engine.add_request(list(range(1, 30 + i)),
                                   SamplingParams(max_tokens=4, ignore_eos=True))
            engine.step()                                         # the prompts
            counts[runner, batch] = count_torch_calls(engine.step)
    assert counts["fast", 1] <= budget and counts["fast", 16] <= budget, (counts, budget)
    assert counts["readable", 1] > 3 * counts["fast", 1], counts


def test_decode_step_alone_is_the_runner_s_step(small):
    """``decode_step`` on hand-made inputs writes the token's K/V into its slot."""
    model, _ = small
    engine = LLMEngine(model, ByteTokenizer(), runner=fast_runner(), max_num_seqs=2)
    cache = engine.cache
    seq = cache.add_sequence()
    (slot,) = cache.reserve_slots([seq], [1])
    w = engine.runner.weights
    tables = torch.tensor([cache.block_table(seq)])
    logits = decode_step(w, layer_pools(cache), torch.tensor([65]), torch.tensor([0]),
                         torch.tensor([slot]), tables)
    want = model(torch.tensor([[65]]))[0, -1]
    torch.testing.assert_close(logits[0], want, rtol=1e-4, atol=1e-4)
    assert cache.k[:, slot // cache.block_size, slot % cache.block_size].abs().sum() > 0


def test_runner_choices_are_checked(small):
    model, tok = small
    with pytest.raises(ValueError, match="runner 'turbo'"):
        LLMEngine(model, tok, runner="turbo")
    with pytest.raises(ValueError, match="lives outside the engine"):
        LLMEngine(model, tok, runner="fast")                      # the engine names no fast path
    with pytest.raises(ValueError, match="cuda_graphs=True needs the model on CUDA"):
        LLMEngine(model, tok, runner=fast_runner(cuda_graphs=True))
    with pytest.raises(ValueError, match="readable runner runs eagerly"):
        runner_for("readable", cuda_graphs="emulate")
    with pytest.raises(ValueError, match="num_experts"):
        LLMEngine(tiny_moe_model(), tok, runner=fast_runner())
    from llminfra.quant import quantize_model
    with pytest.raises(ValueError, match="QuantLinear"):
        make_runner(fast_runner(), quantize_model(copy.deepcopy(model), "int8-absmax"), None,
                    torch.device("cpu"))
    from llminfra.runner.kernel_choice import resolve_runner
    assert resolve_runner("auto", model) == "fast"
    assert resolve_runner("auto", tiny_moe_model()) == "readable"
    assert resolve_runner("auto", quantize_model(copy.deepcopy(model), "int8-absmax")) \
        == "readable"
    assert graph_buckets(1) == [1] and graph_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert isinstance(LLMEngine(model, tok, runner=fast_runner()).runner, FastRunner)


@pytest.mark.slow
def test_decode_step_through_the_triton_kernel_under_the_interpreter():
    """The CUDA attention of ``decode_step`` (the Triton paged kernel, read in place) gives
    the gather + SDPA logits, run by Triton's interpreter on the CPU in a fresh process."""
    pytest.importorskip("triton")
    import subprocess
    import sys
    code = """
import torch
from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import ByteTokenizer, ModelConfig, Transformer
from llminfra.runner import FastRunner, KernelSet, fast_runner, graph_buckets, runner_for
from llminfra.runner import fast_runner
from llminfra.runner.fast_step import decode_step, layer_pools
config = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                     max_seq_len=128)
model = Transformer(config, torch.Generator().manual_seed(2)).eval()
engine = LLMEngine(model, ByteTokenizer(), runner=fast_runner(), max_num_seqs=3, block_size=8)
for p in ([1, 2, 3], list(range(5, 30)), [7] * 12):
    engine.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True))
for _ in range(3):
    engine.step()
cache, w = engine.cache, engine.runner.weights
seqs = [s.cache_seq for s in engine.scheduler.running]
slots = cache.reserve_slots(seqs, [1] * len(seqs))
pos = torch.tensor([cache.seq_len(s) - 1 for s in seqs])
width = max(len(cache.block_table(s)) for s in seqs)
tables = torch.tensor([cache.block_table(s) + [cache.scratch_block] * (width - len(cache.block_table(s)))
                       for s in seqs])
args = (w, layer_pools(cache), torch.tensor([9, 8, 7]), pos, torch.tensor(slots), tables)
with torch.no_grad():
    want = decode_step(*args, triton_kernel=False)
    got = decode_step(*args, triton_kernel=True)
torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
print("ok", float((got - want).abs().max()))
"""
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_a_mixed_step_gives_the_readable_logits(small):
    """One step of two prompt chunks (5 and 9 tokens, one after a cached beginning) and two
    decodes: the fast runner's logits equal the readable runner's within float tolerance."""
    model, tok = small
    logits = {}
    for runner in ("readable", "fast"):
        engine = LLMEngine(model, tok, runner=runner_for(runner), max_num_seqs=4,
                           max_num_batched_tokens=64)
        for p in ([3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]):
            engine.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True))
        engine.step()                                             # both prompts
        for p in ([1] * 5, list(range(40, 49))):
            engine.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True))
        sched = engine.scheduler.schedule(engine.clock())
        assert sorted(n for _, n in sched.scheduled) == [1, 1, 5, 9]
        logits[runner] = engine.runner.forward(sched.scheduled, sched.padding, sched.caught)
    torch.testing.assert_close(logits["fast"], logits["readable"], rtol=1e-4, atol=1e-4)


def test_w4a8_serving_for_any_batch(small):
    """``kernels=w4a8_kernels()`` (``serve --quantization w4a8``): the fast runner on int4
    weights and the w4a8 kernel. A request alone gives FastDecoder's w4a8 tokens (the same
    codes and kernel), and a batch of requests gives each one's tokens alone (the kernel
    quantizes each row's activations by itself)."""
    from llminfra.kernels import w4a8
    if not w4a8.available():
        pytest.skip(f"the w4a8 kernel cannot be built here: {w4a8.unavailable_reason()}")
    from llminfra.runner import FastDecoder
    from llminfra.runner.kernel_choice import quantized_kernels
    model, tok = small
    ps = prompts(random.Random(7), 6)
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    served = fast_runner(kernels=quantized_kernels("w4a8"))
    alone = [tokens(LLMEngine(model, tok, runner=served), [p], greedy)[0] for p in ps]
    batched = tokens(LLMEngine(model, tok, max_num_seqs=6, runner=fast_runner(
        kernels=KernelSet.of(w4a8.w4a8_linear()))), ps, greedy)
    assert batched == alone
    decoder = FastDecoder(model, linear=w4a8.w4a8_linear())
    assert [[decoder.generate(p, 10)] for p in ps[:3]] == alone[:3]
    with pytest.raises(ValueError, match="kernels need runner='fast'"):
        runner_for("readable", kernels=quantized_kernels("w4a8"))
    with pytest.raises(ValueError, match="quantization 'int3'"):
        quantized_kernels("int3")

