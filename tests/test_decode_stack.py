"""The decode step in one C call (``llminfra/kernels/csrc/decode_stack.c``), on int4 (w4a8) and fp32
weights: the same logits, bit for bit, as the Python step it replaces (``fast_step.decode_step``
on the same weights), for batches of 1-7 sequences across block boundaries and on 1 and 2
threads; built only for weights it can run; a ValueError naming the refusal, not a crash; and
the weights' copies on huge pages equal to what was packed."""

from __future__ import annotations

import random

import pytest
import torch

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import ByteTokenizer, ModelConfig, Transformer
from llminfra.runner.fast_step import decode_step
from llminfra.kernels import w4a8
from llminfra.kernels.huge_pages import Arena

pytestmark = pytest.mark.skipif(not w4a8.available(), reason="no C compiler for the w4a8 library")


def small(bias: bool = False) -> Transformer:
    """3 layers, grouped-query heads (4 query heads on 2 K/V heads), widths multiples of 64."""
    config = ModelConfig(vocab_size=256, dim=128, n_layers=3, n_heads=4, n_kv_heads=2,
                         ffn_dim=192, max_seq_len=256, qkv_bias=bias)
    return Transformer(config, torch.Generator().manual_seed(3)).eval()


def engine_with(model, threads: int, kind: str = "w4a8", **kw) -> LLMEngine:
    """The engine ``serve --threads threads`` builds on ``model``: ``--quantization w4a8``, or
    (``kind="fp32"``) its fp32 weights on the C kernels (``--matmul skinny``)."""
    from llminfra.runner import fast_runner
    from llminfra.runner.kernel_choice import quantized_kernels, skinny_kernels
    kernels = quantized_kernels("w4a8", threads) if kind == "w4a8" else skinny_kernels(threads)
    return LLMEngine(model, ByteTokenizer(), runner=fast_runner(kernels=kernels), block_size=8,
                     **kw)


def captured_steps(engine: LLMEngine, prompts, tokens: int) -> list[tuple]:
    """The inputs of every step the engine runs on its stack (tokens, positions, slots, block
    tables), the logits it returned and the rows they are of (None: all; a step with prompt
    chunks); prompt i asks for ``tokens + i`` tokens."""
    stack, seen = engine.runner.stack, []

    def spy(*inputs, logits_rows=None):
        logits = stack(*inputs, logits_rows=logits_rows)
        rows = None if logits_rows is None else logits_rows.clone()
        seen.append(([t.clone() for t in inputs], logits.clone(), rows))
        return logits
    spy.max_batch = stack.max_batch
    engine.runner.stack = spy
    engine.generate(prompts, [SamplingParams(max_tokens=tokens + i, ignore_eos=True)
                              for i in range(len(prompts))])     # the batch shrinks to one
    engine.runner.stack = stack
    return seen


@pytest.mark.parametrize("kind", ["w4a8", "fp32"])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_stack_gives_the_python_step_s_logits_bit_for_bit(threads, kind):
    """Every step of 7 prompts of 1-40 tokens (block size 8: lengths cross blocks): the prompts'
    (a row a query, the logits of their last rows), then decode steps, batches shrinking as
    requests finish (fp32: 1-2 rows on f32_skinny.c, more on the panels): the stack's logits
    equal ``decode_step``'s on the same inputs (its K/V write puts the same values in the same
    slots)."""
    engine = engine_with(small(), threads, kind, max_num_seqs=7)
    assert engine.runner.stack is not None
    rng = random.Random(threads)
    prompts = [[rng.randrange(1, 256) for _ in range(rng.randrange(1, 40))] for _ in range(7)]
    steps = captured_steps(engine, prompts, 12)
    assert {len(inputs[0]) for inputs, _, rows in steps if rows is None} >= {7, 2, 1}
    assert sum(rows is not None for _, _, rows in steps) >= 1       # the prompts' step(s)
    for inputs, logits, rows in steps:
        want = decode_step(engine.runner.weights, engine.runner.pools, *inputs, logits_rows=rows)
        assert torch.equal(logits, want)


@pytest.mark.parametrize("kind", ["w4a8", "fp32"])
def test_engine_tokens_are_the_same_with_and_without_the_stack(kind):
    model = small()
    prompts = [[5, 6, 7], list(range(1, 30)), [200] * 17]
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    runs = []
    for use_stack in (True, False):
        engine = engine_with(model, 2, kind, max_num_seqs=3)
        if not use_stack:
            engine.runner.stack = None
        runs.append([o.outputs[0].token_ids for o in engine.generate(prompts, greedy)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("kind", ["w4a8", "fp32"])
def test_prompts_as_rows_give_the_padded_sdpa_step_s_logits(kind):
    """A step with prompt chunks (and decode lanes) as rows on the C kernels gives the logits of
    ``mixed_step`` (prompts padded to the longest, torch's SDPA) on the same weights, to fp32
    rounding (w4a8: to the int8 rounding of the activations it feeds), and the same greedy
    tokens: 5 prompts of 3-40 tokens, chunked (16 tokens a step)
    beside running sequences."""
    model = small()
    prompts = [[(7 * i + j) % 255 + 1 for j in range(n)] for i, n in enumerate((3, 40, 17, 9, 31))]
    params = [SamplingParams(max_tokens=8 + i, ignore_eos=True) for i in range(5)]
    runs, logits = [], []
    for rows in (True, False):
        engine = engine_with(model, 2, kind, max_num_seqs=5, max_num_batched_tokens=16)
        assert engine.runner.c_rows
        engine.runner.c_rows = rows
        seen, forward = [], engine.runner.forward

        def spy(scheduled, padding, caught, forward=forward, seen=seen):
            out = forward(scheduled, padding, caught)
            if any(n > 1 for _, n in scheduled):
                seen.append(out.clone())
            return out
        engine.runner.forward = spy
        runs.append([o.outputs[0].token_ids for o in engine.generate(prompts, params)])
        logits.append(seen)
    assert runs[0] == runs[1]
    assert len(logits[0]) == len(logits[1]) >= 4
    tol = 1e-4 if kind == "fp32" else 2e-2   # int8 activations: a last-bit change may flip one
    for a, b in zip(*logits):                # rounding step of 1/127 of a group's largest
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["w4a8", "fp32"])
@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_steps_that_want_no_logits_and_padding_rows(kind, policy):
    """A prompt longer than a step's token budget alone (its first chunks want no logits: the
    stack once wrote a whole step's logits through a null pointer there), and static batches
    (finished members' padding rows): the tokens of the padded SDPA step, and the stack asked
    for no rows gives none."""
    model = small()
    prompts = [list(range(1, 30)), [5, 6, 7], [200] * 17, [9] * 5]
    params = [SamplingParams(max_tokens=4 + 3 * i, ignore_eos=True) for i in range(4)]
    runs = []
    for rows in (True, False):
        engine = engine_with(model, 2, kind, max_num_seqs=2, policy=policy,
                             max_num_batched_tokens=8)
        engine.runner.c_rows = rows
        runs.append([o.outputs[0].token_ids for o in engine.generate(prompts, params)])
    assert runs[0] == runs[1]
    inputs, _, _ = captured_steps(engine, [[1, 2, 3]], 2)[-1]
    none = engine.runner.stack(*inputs, logits_rows=torch.empty(0, dtype=torch.int64))
    assert none.shape == (0, 256)


def test_only_weights_it_can_run_get_a_stack():
    """A biased q/k/v (Qwen's) or another int4 linear: no stack, the Python step runs. fp32
    panels that take fewer rows than a step has: the Python step for that step."""
    from llminfra.quant import int4_linear
    from llminfra.runner import KernelSet, fast_runner
    from llminfra.runner.kernel_set import skinny_kernels
    for kind in ("w4a8", "fp32"):
        assert engine_with(small(bias=True), 1, kind).runner.stack is None
    engine = LLMEngine(small(), ByteTokenizer(), runner=fast_runner(kernels=KernelSet.of(int4_linear(64))))
    assert engine.runner.stack is None
    engine = LLMEngine(small(), ByteTokenizer(), block_size=8,
                       runner=fast_runner(kernels=skinny_kernels(2, panel_max_rows=3)))
    assert engine.runner.stack.max_batch == 3
    used, stack = [], engine.runner.stack

    def spy(*inputs, logits_rows=None):
        used.append(len(inputs[0]))
        return stack(*inputs, logits_rows=logits_rows)
    spy.max_batch = stack.max_batch
    engine.runner.stack = spy
    engine.generate([[1, 2]] * 4, [SamplingParams(max_tokens=3 + 2 * i, ignore_eos=True)
                                   for i in range(4)])   # steps of 4, 3, 2, 1 sequences
    assert sorted(set(used)) == [1, 2, 3]


@pytest.mark.parametrize("kind", ["w4a8", "fp32"])
def test_bad_input_is_a_value_error_and_writes_nothing(kind):
    engine = engine_with(small(), 2, kind)
    inputs, _, _ = captured_steps(engine, [[1, 2, 3]], 2)[-1]
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
