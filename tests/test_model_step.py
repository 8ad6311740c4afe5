"""The step-metadata seam: one ragged forward pass (prefill chunks of different lengths mixed with
single-token decodes, one flat token dimension) gives the logits of each sequence run alone, on
the dense, contiguous and paged caches; a failed step leaves no partial state."""

import pytest
import torch

from llminfra.attention import StepMetadata, flash_attention, ragged_attention
from llminfra.kvcache import BlockPoolExhausted, ContiguousKVCache, PagedKVCache
from llminfra.model import DenseKVCache, ModelConfig, Transformer

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=64)


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, generator=torch.Generator().manual_seed(4321)).eval()


def test_metadata_worked_example():
    """The module docstring's example: T = [4, 1, 2], S = [4, 8, 5]."""
    m = StepMetadata.build([10, 11, 12], [4, 1, 2], [4, 8, 5])
    assert m.positions.tolist() == [0, 1, 2, 3, 7, 3, 4]
    assert m.query_start_loc.tolist() == [0, 4, 5, 7]
    assert m.is_prefill == (True, False, True)
    assert (m.num_tokens, m.num_prefill_tokens, m.num_decode_tokens) == (7, 6, 1)
    assert m.last_token_indices() == [3, 4, 6]
    assert m.token_is_prefill().tolist() == [True] * 4 + [False, True, True]


@pytest.mark.parametrize("kwargs, match", [
    (dict(seq_ids=[1, 1], query_lens=[1, 1], context_lens=[1, 1]), "twice"),
    (dict(seq_ids=[1], query_lens=[0], context_lens=[0]), "query_len >= 1"),
    (dict(seq_ids=[1], query_lens=[3], context_lens=[2]), "context_len >= query_len"),
    (dict(seq_ids=[1, 2], query_lens=[3], context_lens=[3]), "one of each"),
    (dict(seq_ids=[], query_lens=[], context_lens=[]), "at least one"),
])
def test_metadata_refuses_bad_steps(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StepMetadata.build(**kwargs)


def _alone(model, tokens):
    return model(torch.tensor([tokens]))[0]          # (T, V), no cache


def _caches():
    return {"dense": (DenseKVCache(CFG.n_layers), [7, 3, 5]),
            "contiguous": (ContiguousKVCache(CFG.n_layers, 6, CFG.n_kv_heads, CFG.head_dim, 40),
                           [4, 0, 2]),
            "paged": (PagedKVCache.for_model(CFG, 40, block_size=4), None)}


@pytest.mark.parametrize("name", ["dense", "contiguous", "paged"])
@torch.no_grad()
def test_ragged_steps_match_each_sequence_alone(model, gen, name):
    """Step 1: prefill A (5 tokens) and B (3). Step 2: A decodes 1, B a chunk of 6, C a fresh
    prefill of 9. Step 3: all three decode. Each sequence's logits equal its run alone."""
    cache, ids = _caches()[name]
    if ids is None:
        ids = [cache.add_sequence() for _ in range(3)]
    A, B, C = ids
    full = {s: torch.randint(0, 256, (n,), generator=gen).tolist()
            for s, n in ((A, 7), (B, 10), (C, 10))}
    done = {A: 0, B: 0, C: 0}
    for step in ([(A, 5), (B, 3)], [(A, 1), (B, 6), (C, 9)], [(A, 1), (B, 1), (C, 1)]):
        seqs, lens = [s for s, _ in step], [t for _, t in step]
        meta = cache.prepare_step(seqs, lens)
        flat = torch.tensor([tok for s, t in step for tok in full[s][done[s]:done[s] + t]])
        logits = model(flat, cache, meta=meta)                        # (N, V)
        assert logits.shape == (sum(lens), CFG.vocab_size)
        for i, (s, t) in enumerate(step):
            a, b = meta.query_start_loc[i], meta.query_start_loc[i + 1]
            want = _alone(model, full[s][:done[s] + t])[done[s]:]
            torch.testing.assert_close(logits[a:b], want, atol=1e-5, rtol=1e-4)
            done[s] += t


@torch.no_grad()
def test_ragged_without_cache_and_with_a_plugged_attention(model, gen):
    """No cache (each sequence all new), and ``set_attention(flash_attention)`` used for every
    sequence of the step, give the same logits as the sequences alone."""
    seqs = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (6, 1, 11)]
    meta = StepMetadata.build([0, 1, 2], [6, 1, 11], [6, 1, 11])
    flat = torch.tensor([t for s in seqs for t in s])
    try:
        for fn in (None, lambda q, k, v, causal: flash_attention(q, k, v, causal, block_q=4,
                                                                 block_k=4)):
            model.set_attention(fn)
            out = model(flat, meta=meta)
            model.set_attention(None)
            for i, s in enumerate(seqs):
                a, b = meta.query_start_loc[i], meta.query_start_loc[i + 1]
                torch.testing.assert_close(out[a:b], _alone(model, s), atol=1e-5, rtol=1e-4)
    finally:
        model.set_attention(None)
    last = model(flat, meta=meta.with_logits_indices(meta.last_token_indices()))
    torch.testing.assert_close(last, out[meta.last_token_indices()])


def test_ragged_attention_decode_path_equals_reference(gen):
    """Decodes (T_i = 1) go through the batched decode path; each equals plain attention of
    that query over its own keys."""
    H, H_kv, d = 4, 2, 8
    ctx = [5, 1, 9]
    k = torch.randn(3, H_kv, 9, d, generator=gen)
    v = torch.randn(3, H_kv, 9, d, generator=gen)
    q = torch.randn(3, H, d, generator=gen)
    meta = StepMetadata.build([0, 1, 2], [1, 1, 1], ctx, kv_layout="padded")
    got = ragged_attention(q, k, v, meta)
    for i, S in enumerate(ctx):
        K = k[i, :, :S].repeat_interleave(2, 0)
        V = v[i, :, :S].repeat_interleave(2, 0)
        p = torch.softmax((q[i][:, None] * K).sum(-1) / d ** 0.5, -1)       # (H, S)
        torch.testing.assert_close(got[i], (p[..., None] * V).sum(1))


@torch.no_grad()
def test_failed_step_leaves_no_stale_slots(model, gen):
    """Regression (hardening issue): after BlockPoolExhausted, a layer update with the previous
    step's metadata must be refused, not overwrite that step's K/V."""
    cache = PagedKVCache.for_model(CFG, 3, block_size=4)
    s = cache.add_sequence()
    meta1 = cache.prepare_step([s], [6])
    model(torch.randint(0, 256, (6,), generator=gen), cache, meta=meta1)
    k_before = cache.k.clone()
    t = cache.add_sequence()
    with pytest.raises(BlockPoolExhausted):
        cache.prepare_step([s, t], [1, 9])                         # needs 3 more, 1 free
    assert cache.seq_len(s) == 6 and cache.seq_len(t) == 0
    assert cache.allocator.num_free == 1
    k = torch.zeros(6, CFG.n_kv_heads, CFG.head_dim)
    with pytest.raises(ValueError, match="stale"):
        cache.update(1, k, k, meta1)
    torch.testing.assert_close(cache.k, k_before)
    with pytest.raises(ValueError, match="needs the step's metadata"):
        cache.update(1, k, k)
    cache.allocator.check_invariants()


@pytest.mark.parametrize("name", ["dense", "contiguous", "paged"])
@torch.no_grad()
def test_forward_failing_mid_step_rolls_the_cache_back(model, gen, name):
    cache, ids = _caches()[name]
    s = ids[0] if ids else cache.add_sequence()
    prompt = torch.randint(0, 256, (5,), generator=gen)
    model(prompt, cache, meta=cache.prepare_step([s], [5]))
    free = cache.allocator.num_free if name == "paged" else None
    calls = []

    def boom(q, k, v, causal):
        calls.append(1)
        if len(calls) == 2:                                         # layer 1
            raise RuntimeError("boom")
        return flash_attention(q, k, v, causal)

    model.set_attention(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            model(torch.randint(0, 256, (3,), generator=gen), cache,
                  meta=cache.prepare_step([s], [3]))
    finally:
        model.set_attention(None)
    if name == "paged":
        assert cache.seq_len(s) == 5 and cache.allocator.num_free == free
    nxt = torch.randint(0, 256, (2,), generator=gen)
    got = model(nxt, cache, meta=cache.prepare_step([s], [2]))
    want = _alone(model, torch.cat([prompt, nxt]).tolist())[5:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_ragged_cache_argument_errors():
    cont = ContiguousKVCache(CFG.n_layers, 2, CFG.n_kv_heads, CFG.head_dim, 8)
    with pytest.raises(ValueError, match="not rows 0..1"):
        cont.prepare_step([2], [1])
    with pytest.raises(ValueError, match="max_seq_len 8"):
        cont.prepare_step([0], [9])
    assert cont.row_lengths == [0, 0]
    dense = DenseKVCache(CFG.n_layers)
    meta = dense.prepare_step([5], [2])
    k = torch.zeros(3, CFG.n_kv_heads, CFG.head_dim)
    with pytest.raises(ValueError, match=r"\(N=2, H_kv, d\)"):
        dense.update(0, k, k, meta)
    with pytest.raises(ValueError, match="layer_idx"):
        dense.update(CFG.n_layers, k[:2], k[:2], meta)
    paged = PagedKVCache.for_model(CFG, 4, block_size=4)
    with pytest.raises(KeyError, match="no sequence 3"):
        paged.prepare_step([3], [1])
