"""The model on every cache: identical tokens; forks, prefix hits and swaps keep K/V exact."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from llminfra.kvcache import (BlockPoolExhausted, ContiguousKVCache, GrowingKVCache,
                              PagedKVCache, PrefixCachingAllocator, gather_kv, swap_in, swap_out)
from llminfra.model import DenseKVCache, ModelConfig, Transformer, generate

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=64)


def step(model, cache, seqs, tokens):
    """One engine step over rows: row r of ``tokens (B, T)`` is the next T tokens of sequence
    ``seqs[r]`` (the step protocol: prepare_step, then the ragged call) -> logits (B, T, V)."""
    B, T = tokens.shape
    meta = cache.prepare_step(list(seqs), [T] * B)
    return model(tokens.reshape(-1), cache, meta=meta).view(B, T, -1)


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, generator=torch.Generator().manual_seed(1234)).eval()


def _caches(block_size):
    return {"dense": DenseKVCache(CFG.n_layers),
            "paged": PagedKVCache.for_model(CFG, num_blocks=64, block_size=block_size),
            "contiguous": ContiguousKVCache(CFG.n_layers, 1, CFG.n_kv_heads, CFG.head_dim, 64),
            "growing": GrowingKVCache(CFG.n_layers, initial_capacity=3)}


@settings(max_examples=8, deadline=None)
@given(prompt=st.lists(st.integers(0, 255), min_size=1, max_size=20),
       block_size=st.sampled_from([1, 3, 16]), seed=st.integers(0, 2**31))
@torch.no_grad()
def test_generation_identical_on_every_cache(model, prompt, block_size, seed):
    out = {}
    for name, cache in _caches(block_size).items():
        g = torch.Generator().manual_seed(seed)
        out[name] = generate(model, prompt, 12, temperature=1.0, generator=g, cache=cache)
    assert len(set(map(tuple, out.values()))) == 1, out


@torch.no_grad()
def test_paged_logits_equal_dense(model, gen):
    tokens = torch.randint(0, 256, (3, 13), generator=gen)
    dense, paged = DenseKVCache(CFG.n_layers), PagedKVCache.for_model(CFG, 30, block_size=4)
    seqs = [paged.add_sequence() for _ in range(3)]
    a = model(tokens[:, :9], cache=dense)
    b = step(model, paged, seqs, tokens[:, :9])
    torch.testing.assert_close(a, b)
    a = model(tokens[:, 9:], cache=dense, start_pos=9)
    b = step(model, paged, seqs, tokens[:, 9:])
    torch.testing.assert_close(a, b)
    assert paged.allocator.num_used == 3 * 4      # 13 tokens -> 4 blocks of 4, per sequence


@torch.no_grad()
def test_forked_samples_match_independent_runs(model, gen):
    """n = 3 samples forked from one prefill (shared prompt blocks, copy-on-write) produce the
    same logits as three independent dense runs."""
    prompt = torch.randint(0, 256, (1, 10), generator=gen)
    nxt = torch.randint(0, 256, (3, 4), generator=gen)
    paged = PagedKVCache.for_model(CFG, 40, block_size=4)
    s0 = paged.add_sequence()
    step(model, paged, [s0], prompt)
    seqs = [s0, paged.fork(s0), paged.fork(s0)]
    used_before = paged.allocator.num_used
    for t in range(4):
        got = step(model, paged, seqs, nxt[:, t:t + 1])
        if t == 0:                                # 3rd block (2 tokens) copied for 2 children
            assert paged.allocator.num_used == used_before + 2
    for i in range(3):
        dense = DenseKVCache(CFG.n_layers)
        want = model(torch.cat([prompt, nxt[i:i + 1]], dim=1), cache=dense)[:, -1]
        torch.testing.assert_close(got[i:i + 1, -1], want)


@torch.no_grad()
def test_prefix_hit_returns_identical_kv(model, gen):
    B = 4
    cache = PagedKVCache.for_model(CFG, 40, block_size=B,
                                   allocator=PrefixCachingAllocator(40, B))
    system = torch.randint(0, 256, (11,), generator=gen).tolist()
    first = system + [1, 2, 3]
    seq, n = cache.add_prefix_sequence(first)
    assert n == 0
    step(model, cache, [seq], torch.tensor([first]))
    cache.cache_prefix(seq, first)
    k_first = [gather_kv(cache.k[layer], cache.tables[seq].blocks, 8) for layer in range(2)]
    cache.free(seq)
    second = system + [9, 9]
    seq2, n = cache.add_prefix_sequence(second)
    assert n == 8                                 # two full blocks of the system prompt
    logits = step(model, cache, [seq2], torch.tensor([second[n:]]))
    want = model(torch.tensor([second]), cache=DenseKVCache(CFG.n_layers))
    torch.testing.assert_close(logits[:, -1], want[:, -1])
    for layer in range(2):
        torch.testing.assert_close(
            gather_kv(cache.k[layer], cache.tables[seq2].blocks, 8), k_first[layer])


@torch.no_grad()
def test_swap_out_and_in_restores_kv(model, gen):
    cache = PagedKVCache.for_model(CFG, 12, block_size=4)
    step(model, cache, [cache.add_sequence()], torch.randint(0, 256, (1, 10), generator=gen))
    before = [gather_kv(cache.k[i], cache.tables[0].blocks, 10) for i in range(2)]
    blocker = cache.add_sequence()
    cache.tables[blocker].append(4)               # hold block 3 so the swap-in gets new ids
    swapped = swap_out(cache, 0)
    assert cache.allocator.num_free == 11 and swapped.num_tokens == 10
    seq = swap_in(cache, swapped)
    assert cache.tables[seq].blocks != [0, 1, 2]
    for i in range(2):
        torch.testing.assert_close(gather_kv(cache.k[i], cache.tables[seq].blocks, 10), before[i])


@torch.no_grad()
def test_model_on_a_full_pool_raises_a_helpful_error(model, gen):
    cache = PagedKVCache.for_model(CFG, 2, block_size=4)
    with pytest.raises(BlockPoolExhausted, match="preempt.*swap.*wait"):
        step(model, cache, [cache.add_sequence()], torch.randint(0, 256, (1, 9), generator=gen))
    cache.allocator.check_invariants()
    assert cache.allocator.num_free == 2          # nothing leaked


@torch.no_grad()
def test_full_pool_mid_batch_changes_no_row(model, gen):
    """3 blocks of 4, two rows of 6 tokens: row 0 gets its 2 blocks, row 1 finds 1 left. The
    error must leave row 0 as it was (0 tokens, blocks back in the pool), and the same with a
    forked batch whose copy-on-write had already run; a smaller step then succeeds."""
    cache = PagedKVCache.for_model(CFG, 3, block_size=4)
    rows = [cache.add_sequence(), cache.add_sequence()]
    with pytest.raises(BlockPoolExhausted):
        step(model, cache, rows, torch.randint(0, 256, (2, 6), generator=gen))
    assert [cache.seq_len(s) for s in rows] == [0, 0]
    assert cache.allocator.num_free == 3
    cache.allocator.check_invariants()
    step(model, cache, rows, torch.randint(0, 256, (2, 2), generator=gen))   # 1 block each
    forked = PagedKVCache.for_model(CFG, 4, block_size=4)
    s0 = forked.add_sequence()
    step(model, forked, [s0], torch.randint(0, 256, (1, 6), generator=gen))  # blocks 0, 1
    rows = [s0, forked.fork(s0), forked.fork(s0)]                           # block 1 shared by 3
    refs = forked.allocator.ref_counts()
    with pytest.raises(BlockPoolExhausted):     # row 0 takes the 2 free blocks (copy + new)
        step(model, forked, rows, torch.randint(0, 256, (3, 3), generator=gen))
    assert forked.allocator.ref_counts() == refs
    assert [forked.seq_len(s) for s in rows] == [6, 6, 6]
    assert all(forked.tables[s].blocks == [0, 1] for s in rows)
    forked.allocator.check_invariants()


def test_contiguous_cache_refuses_overflow(gen):
    cache = ContiguousKVCache(1, 1, 2, 4, max_seq_len=5)
    k = torch.randn(1, 2, 4, 4, generator=gen)
    cache.update(0, k, k)
    with pytest.raises(ValueError, match="max_seq_len"):
        cache.update(0, k[:, :, :2], k[:, :, :2])
    assert cache.used_bytes * 5 == cache.nbytes * 4


@torch.no_grad()
def test_a_paged_cache_refuses_the_dense_call_by_name(model):
    """No side channel: the dense (B, T) call cannot guess which sequences the rows are."""
    cache = PagedKVCache.for_model(CFG, 8, block_size=4)
    with pytest.raises(ValueError, match="prepare_step"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert not hasattr(cache, "batch") and cache.allocator.num_free == 8
