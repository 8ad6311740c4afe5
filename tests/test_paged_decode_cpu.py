"""The CPU paged decode kernel (``llminfra/kernels/csrc/paged_decode.c``): equal to the gather + SDPA
path of ``fast_step`` and to a plain per-sequence softmax in float64, on awkward shapes (lengths
1, mid-block, at a block's end; groups of 1, 3 and 10 query heads; head dims off 16; blocks of
5, 8, 16 and 32 keys; blocks shared between sequences; padding lanes); the same bits for any
thread count; a ValueError, not a crash, for input it cannot read; and the engine's greedy
tokens unchanged."""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import pytest
import torch

from llminfra.runner.fast_step import decode_attention, decode_step, kv_rows, layer_pools
from llminfra.kernels import w4a8
from llminfra.kernels.paged_decode import c_attend, kernel, paged_attention_c

pytestmark = pytest.mark.skipif(not w4a8.available(), reason="no C compiler for the w4a8 library")


def make_case(n: int, H: int, H_kv: int, d: int, B: int, lens: list[int], seed: int = 0,
              shared: bool = True):
    """A layer's pool as ``layer_pools`` views it (``(2·(P+1), B, H_kv, d)``, the scratch block
    P last of each half), block tables padded with the scratch block, and q as the step's
    ``r[:, :H]`` of ``(n, H + 2·H_kv, d)`` (rows not contiguous)."""
    g = torch.Generator().manual_seed(seed)
    W = max(-(-L // B) for L in lens) + 1                       # one padding column at least
    P = n * W + 3
    blocks = torch.randn(2 * (P + 1), B, H_kv, d, generator=g)
    perm = torch.randperm(P, generator=g).tolist()
    tables = torch.full((n, W), P, dtype=torch.int64)           # the scratch block
    for s, L in enumerate(lens):
        for b in range(-(-L // B)):
            tables[s, b] = perm.pop()
    if shared and n > 1 and lens[1] > B and lens[0] >= B:
        tables[1, 0] = tables[0, 0]                             # a shared first block
    r = torch.randn(n, H + 2 * H_kv, d, generator=g)
    pool = (blocks.flatten(0, 1), blocks, blocks[:P + 1], blocks[P + 1:])
    return r[:, :H], pool, tables, torch.tensor(lens), P


def plain_reference(q, K, V, tables, lens):
    """Per sequence: its keys gathered one by one, softmax(q kᵀ / √d) v in float64."""
    n, H, d = q.shape
    B, H_kv = K.shape[1], K.shape[2]
    out = torch.empty(n, H, d, dtype=torch.float64)
    for s in range(n):
        t = torch.arange(int(lens[s]))
        k = K[tables[s, t // B], t % B].double()                # (L, H_kv, d)
        v = V[tables[s, t // B], t % B].double()
        k = k.repeat_interleave(H // H_kv, dim=1)               # (L, H, d)
        v = v.repeat_interleave(H // H_kv, dim=1)
        w = torch.softmax(torch.einsum("hd,lhd->hl", q[s].double(), k) / d ** 0.5, dim=-1)
        out[s] = torch.einsum("hl,lhd->hd", w, v)
    return out.float()


def gather_sdpa(q, pool, tables, lens, P):
    """``fast_step``'s own path: index_select of the blocks, SDPA under the position mask."""
    n, H, d = q.shape
    B, H_kv = pool[1].shape[1], pool[1].shape[2]
    c = SimpleNamespace(n_heads=H, n_kv_heads=H_kv, head_dim=d)
    keys = torch.arange(tables.shape[1] * B)
    mask = (keys < lens[:, None]).view(n, 1, 1, -1)
    return decode_attention(q, pool, kv_rows(tables, P), mask, n, c).view(n, H, d)


SMOL = dict(H=9, H_kv=3, d=64)                                  # SmolLM2-135M's heads
CASES = [
    dict(n=1, **SMOL, B=16, lens=[1]),
    dict(n=1, H=3, H_kv=3, d=64, B=16, lens=[16]),              # G = 1, exactly one block
    dict(n=3, **SMOL, B=16, lens=[17, 32, 5]),                  # mid-block, a block's end
    dict(n=3, H=3, H_kv=3, d=64, B=16, lens=[48, 33, 1]),
    dict(n=16, **SMOL, B=16, lens=[1, 16, 17, 31, 32, 33, 100, 128, 129, 200, 255, 256, 257,
                                   300, 450, 1]),
    dict(n=4, H=20, H_kv=2, d=40, B=8, lens=[9, 8, 3, 70]),     # G = 10 (two passes), d % 16
    dict(n=3, H=4, H_kv=1, d=24, B=5, lens=[11, 5, 1]),         # a block of 5
    dict(n=2, H=6, H_kv=2, d=128, B=32, lens=[40, 64]),         # two tiles a block
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"n{c['n']}-G{c['H'] // c['H_kv']}"
                         f"-d{c['d']}-B{c['B']}")
def test_the_kernel_equals_gather_sdpa_and_a_plain_softmax(case):
    q, pool, tables, lens, P = make_case(**case)
    want = plain_reference(q, pool[2], pool[3], tables, lens)
    sdpa = gather_sdpa(q, pool, tables, lens, P)
    results = [paged_attention_c(q, pool[2], pool[3], tables, lens, threads=t)
               for t in (1, 2, 3)]
    torch.testing.assert_close(sdpa, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[0], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[0], sdpa, rtol=1e-5, atol=1e-5)
    for other in results[1:]:                                   # any thread count: same bits
        assert torch.equal(other, results[0])


def test_padding_lanes_and_unused_table_entries_change_nothing():
    """A padding lane (scratch block, position 0) reads one key; table entries past a length
    are never read, even ids outside the pool."""
    q, pool, tables, lens, P = make_case(n=4, **SMOL, B=16, lens=[40, 1, 1, 20])
    tables[1:3] = P                                             # lanes 1, 2: padding
    want = paged_attention_c(q, pool[2], pool[3], tables, lens)
    torch.testing.assert_close(want, plain_reference(q, pool[2], pool[3], tables, lens),
                               rtol=1e-5, atol=1e-5)
    tables[3, 2:] = 10**6                                       # past sequence 3's 2 blocks
    tables[0, 3:] = -7
    assert torch.equal(paged_attention_c(q, pool[2], pool[3], tables, lens), want)


def test_a_portable_build_gives_the_native_result(tmp_path):
    """The library compiled without -march (the fallback build) runs the same kernel, NaN
    in, NaN out as well."""
    q, pool, tables, lens, P = make_case(n=3, **SMOL, B=16, lens=[17, 100, 3])
    fn = w4a8.load(w4a8.build(arch="portable", directory=tmp_path)).paged_decode_f32
    out = torch.empty(3, 9 * 64)
    t32, l32 = tables.to(torch.int32), lens.to(torch.int32)
    rc = fn(q.data_ptr(), q.stride(0), pool[2].data_ptr(), pool[3].data_ptr(), t32.data_ptr(),
            l32.data_ptr(), out.data_ptr(), 3, 9, 3, 64, 16, tables.shape[1], P + 1, 0.125, 1,
            None)
    assert rc == 0
    torch.testing.assert_close(out.view(3, 9, 64), plain_reference(q, pool[2], pool[3], tables,
                                                                   lens), rtol=1e-5, atol=1e-5)
    q = q.clone()
    q[1, 4, 0] = float("nan")                                   # NaN in, NaN out: head 4 only
    rc = fn(q.data_ptr(), q.stride(0), pool[2].data_ptr(), pool[3].data_ptr(), t32.data_ptr(),
            l32.data_ptr(), out.data_ptr(), 3, 9, 3, 64, 16, tables.shape[1], P + 1, 0.125, 1,
            None)
    nan = out.view(3, 9, 64).isnan()
    assert rc == 0 and nan[1, 4].all() and nan.sum() == 64


def test_bad_input_is_a_value_error():
    q, pool, tables, lens, P = make_case(n=3, **SMOL, B=16, lens=[17, 32, 5])
    K, V = pool[2], pool[3]
    bad = [
        (q, K, V, tables, torch.tensor([17, 0, 5]), "context length"),          # length 0
        (q, K, V, tables, torch.tensor([17, 10**4, 5]), "context length"),      # past W·B
        (q, K, V, tables.clone().fill_(P + 1), lens, "block id"),               # past the pool
        (q, K, V, tables.clone().fill_(-1), lens, "block id"),
        (q.double(), K, V, tables, lens, "q must be torch.float32"),
        (q, K.bfloat16(), V, tables, lens, "k_cache must be torch.float32"),
        (q, K, V, tables.float(), lens, "integer"),
        (q[:, :8], K, V, tables, lens, "multiple of H_kv"),                     # H = 8, H_kv 3
        (q[:, :, :32], K, V, tables, lens, "need q"),                           # d 32 vs 64
        (q, K, V[:-1], tables, lens, "need q"),
        (q, K, V, tables[:2], lens, "need q"),
        (q, K, V, tables, lens[:2], "need q"),
        (q[0], K, V, tables, lens, "need q"),
    ]
    for args in bad:
        with pytest.raises(ValueError, match=args[-1]):
            paged_attention_c(*args[:-1])
    for threads in (0, 65, True):
        with pytest.raises(ValueError, match="threads"):
            paged_attention_c(q, K, V, tables, lens, threads=threads)


@pytest.fixture(scope="module")
def engine_state():
    """A fast-runner engine of a small random GQA model, three sequences some steps in."""
    from llminfra.engine import LLMEngine, SamplingParams
    from llminfra.model import ByteTokenizer, ModelConfig, Transformer
    from llminfra.runner import fast_runner
    config = ModelConfig(vocab_size=256, dim=96, n_layers=2, n_heads=6, n_kv_heads=2,
                         ffn_dim=128, max_seq_len=256)
    model = Transformer(config, torch.Generator().manual_seed(3)).eval()
    engine = LLMEngine(model, ByteTokenizer(), runner=fast_runner(), max_num_seqs=4, block_size=8)
    for p in ([1, 2, 3], list(range(5, 30)), [7] * 16):
        engine.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True))
    for _ in range(3):
        engine.step()
    return model, engine


def step_inputs(engine, pad: int = 1):
    """decode_step's inputs for the running sequences plus ``pad`` padding lanes."""
    cache = engine.cache
    seqs = [s.cache_seq for s in engine.scheduler.running]
    slots = cache.reserve_slots(seqs, [1] * len(seqs)) + \
        [cache.scratch_block * cache.block_size] * pad
    pos = [cache.seq_len(s) - 1 for s in seqs] + [0] * pad
    rows = [cache.block_table(s) for s in seqs] + [[]] * pad
    width = max(map(len, rows))
    tables = torch.tensor([r + [cache.scratch_block] * (width - len(r)) for r in rows])
    toks = torch.tensor([9, 8, 7] + [0] * pad)
    return (engine.runner.weights, layer_pools(cache), toks, torch.tensor(pos),
            torch.tensor(slots), tables)


def test_decode_step_on_the_kernel_gives_the_gather_sdpa_logits(engine_state):
    _, engine = engine_state
    args = step_inputs(engine)
    weights = args[0]
    assert weights.paged_decode is None            # an engine built without the C kernels
    with torch.no_grad():
        want = decode_step(*args, c_kernel=False)
        assert torch.equal(decode_step(*args), want)
        got = decode_step(*args, c_kernel=kernel())
        weights.paged_decode = kernel(threads=2)
        try:
            auto = decode_step(*args)
        finally:
            weights.paged_decode = None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(auto, got)                  # the weights' own kernel: the same bits
    bad = list(args)
    bad[3] = args[3].clone()
    bad[3][0] = args[5].shape[1] * engine.cache.block_size      # a position past the table
    with pytest.raises(ValueError, match="context length"):
        decode_step(*bad, c_kernel=kernel())


def test_rope_and_the_kv_write_in_c_equal_the_torch_calls(engine_state):
    """``rope_write_f32`` (one call a layer on the C path) turns q and k and writes k and v
    where the torch path's ``rotate`` + ``index_copy_`` do; a position outside the rotation
    table or a slot outside the pool is a ValueError, with nothing written."""
    from llminfra.runner.fast_step import c_place, write_rows
    _, engine = engine_state
    w, pools, _, pos, slots, _ = step_inputs(engine, pad=2)
    c = w.config
    H, H_kv, d = c.n_heads, c.n_kv_heads, c.head_dim
    num_blocks, B = pools[0][1].shape[0] // 2 - 1, pools[0][1].shape[1]
    N = len(pos)
    qkv = torch.randn(N, (H + 2 * H_kv) * d, generator=torch.Generator().manual_seed(8))
    want_pool = pools[0][0].clone()
    r = w.rotate(qkv, w.head_rotation(pos), N)
    want_pool.index_copy_(0, write_rows(slots, num_blocks, B), r[:, H:].reshape(2 * N, H_kv, d))
    pool = tuple(t.clone() for t in pools[0][1:2])
    view = (pool[0].flatten(0, 1), pool[0], *pool[0].chunk(2))
    place = c_place(kernel().rope_write, w, pos, slots, (num_blocks + 1) * B)
    got = qkv.clone()
    assert place(got, view) is got
    torch.testing.assert_close(got.view(N, -1, d), r, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(view[0], want_pool, rtol=1e-6, atol=1e-6)
    for bad_pos, bad_slot in ((len(w.rotation), 0), (0, (num_blocks + 1) * B)):
        p2, s2 = pos.clone(), slots.clone()
        p2[-1], s2[-1] = bad_pos, bad_slot
        before = view[0].clone()
        with pytest.raises(ValueError, match="rope_write_f32 refused"):
            c_place(kernel().rope_write, w, p2, s2, (num_blocks + 1) * B)(qkv.clone(), view)
        assert torch.equal(view[0], before)


@pytest.mark.parametrize("budget", [512, 24])   # 24: prompt chunks beside decodes (mixed steps)
def test_the_engine_s_greedy_tokens_are_unchanged(budget):
    """A short greedy run of the fast runner: the C kernel's tokens (the weights given it, as
    ``serve``'s linears give it) are the gather + SDPA path's."""
    from llminfra.engine import LLMEngine, SamplingParams
    from llminfra.model import ByteTokenizer, ModelConfig, Transformer
    from llminfra.runner import fast_runner
    from llminfra.runner import fast_step
    config = ModelConfig(vocab_size=256, dim=96, n_layers=3, n_heads=6, n_kv_heads=2,
                         ffn_dim=192, max_seq_len=256)
    model = Transformer(config, torch.Generator().manual_seed(4)).eval()
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 256) for _ in range(rng.randrange(1, 50))] for _ in range(6)]
    greedy = SamplingParams(max_tokens=16, ignore_eos=True)

    def run(c_kernel):
        engine = LLMEngine(model, ByteTokenizer(), runner=fast_runner(), max_num_seqs=6,
                           block_size=16, max_num_batched_tokens=budget)
        engine.runner.weights.paged_decode = c_kernel
        return [out.outputs[0].token_ids for out in engine.generate(prompts, greedy)]

    calls, callers = [], []
    real = fast_step.c_attend
    k = kernel()
    try:
        # frame 2: the step that asked _c_decode_attend for its attention
        fast_step.c_attend = lambda *a: (calls.append(a[0]), callers.append(
            sys._getframe(2).f_code.co_name)) and real(*a)
        got = run(k)
    finally:
        fast_step.c_attend = real
    assert calls and all(c is k for c in calls)
    # a small budget: some steps ran decode lanes beside a prompt chunk, on the kernel too
    assert ("mixed_step" in callers) == (budget < 50) and "decode_step" in callers
    assert k.threads == min(torch.get_num_threads(), 64)      # torch's thread count
    assert run(None) == got


def test_serve_s_linears_bring_the_kernel_on_their_own_threads():
    from llminfra.runner.kernel_choice import quantized_kernels, skinny_kernels

    for kernels in (skinny_kernels(threads=2), quantized_kernels("w4a8")):
        assert kernels.attention is not None and kernels.step is not None
        m = kernels.matmul(torch.randn(8, 64))
        owner = m._kernel.owner if kernels.name == "skinny" else m.f.pool
        assert kernels.attention.owner is owner             # one pool, not two


def test_a_kernel_reads_its_pool_from_the_pool_at_each_call():
    """``pool`` and ``threads`` are the pool's own, not copies: once the pool is closed the
    kernel hands C no freed handle — asking for it, or attending, is a ``RuntimeError`` naming
    the closed pool (it used to hand C the freed pool, or start threads behind the caller's
    back)."""
    from llminfra.kernels import f32_skinny
    for k in (kernel(threads=2), f32_skinny.kernel(threads=2)):
        assert k.threads == 2 and k.pool == k.owner.handle and k.pool is not None
        k.owner.close()
        with pytest.raises(RuntimeError, match="ThreadPool of 2 threads was closed"):
            k.pool
        assert k.threads == 2
    k = kernel(threads=2)
    q, pool = torch.randn(2, 4, 16), torch.randn(3, 8, 2, 16)
    tables, lens = torch.tensor([[0, 1], [2, 0]]), torch.tensor([9, 5])
    c_attend(k, tables, lens, pool, (4, 2, 16), 4 * 16)(q, (None, None, pool, pool))
    k.owner.close()
    k.owner.close()                                         # twice: nothing more
    with pytest.raises(RuntimeError, match="closed"):
        c_attend(k, tables, lens, pool, (4, 2, 16), 4 * 16)
