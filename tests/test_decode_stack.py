"""The int4 decode step in one C call (``llminfra/quant/decode_stack.c``): the same logits, bit
for bit, as the Python step it replaces (``fast_step.decode_step`` on the same w4a8 weights),
for batches of 1-7 sequences across block boundaries and on 1 and 2 threads; built only for
weights it can run; a ValueError naming the refusal, not a crash; and the weights' copies on
huge pages equal to what was packed."""

from __future__ import annotations

import random

import pytest
import torch

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import ByteTokenizer, ModelConfig, Transformer
from llminfra.model.fast_step import decode_step
from llminfra.quant import w4a8
from llminfra.quant.huge_pages import Arena

pytestmark = pytest.mark.skipif(not w4a8.available(), reason="no C compiler for the w4a8 library")


def small(bias: bool = False) -> Transformer:
    """3 layers, grouped-query heads (4 query heads on 2 K/V heads), widths multiples of 64."""
    config = ModelConfig(vocab_size=256, dim=128, n_layers=3, n_heads=4, n_kv_heads=2,
                         ffn_dim=192, max_seq_len=256, qkv_bias=bias)
    return Transformer(config, torch.Generator().manual_seed(3)).eval()


def engine_with(model, threads: int, **kw) -> LLMEngine:
    """The engine ``serve --quantization w4a8 --threads threads`` builds, on ``model``."""
    from llminfra.serving.serve import quantized_linear
    return LLMEngine(model, ByteTokenizer(), runner="fast",
                     linear=quantized_linear("w4a8", threads), block_size=8, **kw)


def captured_steps(engine: LLMEngine, prompts, tokens: int) -> list[tuple]:
    """The inputs of every decode step the engine runs on its stack (tokens, positions, slots,
    block tables) and the logits it returned."""
    stack, seen = engine.runner.stack, []

    def spy(*inputs):
        logits = stack(*inputs)
        seen.append(([t.clone() for t in inputs], logits.clone()))
        return logits
    engine.runner.stack = spy
    engine.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
    engine.runner.stack = stack
    return seen


@pytest.mark.parametrize("threads", [1, 2])
def test_the_stack_gives_the_python_step_s_logits_bit_for_bit(threads):
    """Every decode step of 7 prompts of 1-40 tokens (block size 8: lengths cross blocks),
    batches shrinking as requests finish: the stack's logits equal ``decode_step``'s on the same
    inputs (its K/V write puts the same values in the same slots)."""
    engine = engine_with(small(), threads, max_num_seqs=7)
    assert engine.runner.stack is not None
    rng = random.Random(threads)
    prompts = [[rng.randrange(1, 256) for _ in range(rng.randrange(1, 40))] for _ in range(7)]
    steps = captured_steps(engine, prompts, 12)
    assert {len(inputs[0]) for inputs, _ in steps} >= {7}
    for inputs, logits in steps:
        want = decode_step(engine.runner.weights, engine.runner.pools, *inputs)
        assert torch.equal(logits, want)


def test_engine_tokens_are_the_same_with_and_without_the_stack():
    model = small()
    prompts = [[5, 6, 7], list(range(1, 30)), [200] * 17]
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    runs = []
    for use_stack in (True, False):
        engine = engine_with(model, 2, max_num_seqs=3)
        if not use_stack:
            engine.runner.stack = None
        runs.append([o.outputs[0].token_ids for o in engine.generate(prompts, greedy)])
    assert runs[0] == runs[1]


def test_only_weights_it_can_run_get_a_stack():
    """A biased q/k/v (Qwen's) or another int4 linear: no stack, the Python step runs."""
    from llminfra.quant import int4_linear
    assert engine_with(small(bias=True), 1).runner.stack is None
    engine = LLMEngine(small(), ByteTokenizer(), runner="fast", linear=int4_linear(64))
    assert engine.runner.stack is None


def test_bad_input_is_a_value_error_and_writes_nothing():
    engine = engine_with(small(), 2)
    inputs, _ = captured_steps(engine, [[1, 2, 3]], 2)[0]
    tokens, positions, slots, tables = inputs
    pools = [p[0].clone() for p in engine.runner.pools]
    cases = [(torch.tensor([256]), positions, slots, tables, "outside the vocabulary"),
             (tokens, torch.tensor([256]), slots, tables, "outside the rotation table"),
             (tokens, positions, torch.tensor([10 ** 6]), tables, "outside the pool"),
             (tokens, positions, slots, tables + 10 ** 6, "outside the pool")]
    for t, p, s, bt, message in cases:
        with pytest.raises(ValueError, match=message):
            engine.runner.stack(t, p, s, bt)
    for before, p in zip(pools[:1], engine.runner.pools):
        assert torch.equal(before, p[0])          # the first layer: refused before a write


def test_the_arena_holds_equal_copies():
    arena = Arena()
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randint(0, 255, (300, 7), dtype=torch.uint8, generator=g),
               torch.randn(5, 3, generator=g).half(), torch.randn(20 << 18, generator=g),
               torch.empty(0, dtype=torch.int16)]
    copies = [arena.copy(t) for t in tensors]
    for t, c in zip(tensors, copies):
        assert torch.equal(t, c) and c.dtype == t.dtype and c.data_ptr() % 64 == 0
    empty = arena.empty(10)
    assert empty.shape == (10,) and empty.dtype == torch.float32 and empty.data_ptr() % 64 == 0
    assert arena.empty(0, torch.int8).numel() == 0
    with pytest.raises(ValueError, match="CPU tensors"):
        arena.copy(torch.empty(1, device="meta"))
