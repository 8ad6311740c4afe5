"""Tests of llminfra.model: shapes, parameter counts, attention, rotary, cache, generation."""

import dataclasses
import math

import pytest
import torch
from torch.testing import assert_close

from llminfra.calc.params import param_count
from llminfra.model import (ByteTokenizer, DenseKVCache, ModelConfig, RMSNorm, Transformer,
                            apply_rotary, causal_mask, generate, mean_nll, perplexity,
                            reference_attention, rotary_angles, sample_next_token,
                            sdpa_attention)
from llminfra.attention.reference import repeat_kv

# awkward sizes: odd vocab, 6 query heads over 2 K/V heads, head_dim 4, ffn not a power of 2
SMALL = ModelConfig(vocab_size=37, dim=24, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=40,
                    max_seq_len=64)


pytestmark = pytest.mark.usefixtures("one_thread")


def numel(model):
    return sum(p.numel() for p in model.parameters())


@pytest.fixture
def small_model(gen):
    return Transformer(SMALL, generator=gen).eval()


def loop_attention(q, k, v, causal=True):
    """Attention one query at a time with explicit GQA head mapping (an independent check)."""
    B, H, T, d = q.shape
    S, n_rep = k.shape[2], H // k.shape[1]
    out = torch.zeros_like(q)
    for h in range(H):
        K, V = k[:, h // n_rep], v[:, h // n_rep]  # (B, S, d)
        for i in range(T):
            visible = S - T + i + 1 if causal else S
            s = (q[:, h, i:i + 1] @ K[:, :visible].transpose(1, 2)) / math.sqrt(d)
            out[:, h, i] = (torch.softmax(s, -1) @ V[:, :visible])[:, 0]
    return out


# ---------------------------------------------------------------- config and parameter counts

def test_tiny_param_count_by_hand():
    """2·V·h + L·(2h² + 2h·H_kv·d + 3hI + 2h) + h with V=256, h=256, L=4, H_kv·d=128, I=688:
    131,072 + 4·(131,072 + 65,536 + 528,384 + 512) + 256 = 3,033,344."""
    config = ModelConfig.from_name("tiny")
    assert numel(Transformer(config)) == 3_033_344
    assert param_count(config.to_spec()) == 3_033_344


def test_param_count_matches_calc_small():
    assert numel(Transformer(SMALL)) == param_count(SMALL.to_spec())


def test_param_count_matches_calc_bench_100m():
    """Built with one layer (6.3 M parameters, not 101 M of random weights); every block has
    the same shapes, so the L-layer model has numel(1 layer) + (L - 1)·numel(block)."""
    config = ModelConfig.from_name("bench-100m")
    one = Transformer(dataclasses.replace(config, n_layers=1))
    assert numel(one) == param_count(one.config.to_spec())
    total = numel(one) + (config.n_layers - 1) * numel(one.layers[0])
    assert total == param_count(config.to_spec()) == 101_081_856


def test_bench_preset_is_about_100m():
    spec = ModelConfig.from_name("bench-100m").to_spec()
    assert 90e6 < param_count(spec) < 130e6
    assert spec.attention == "GQA" and spec.tied_embeddings is False


@pytest.mark.parametrize("kwargs, word", [
    (dict(n_kv_heads=4), "multiple"), (dict(n_heads=5), "divisible"),
    (dict(dim=36, n_heads=12, n_kv_heads=2), "even"), (dict(ffn_dim=0), "ffn_dim"),
    (dict(norm_eps=0.0), "norm_eps")])
def test_bad_config_raises(kwargs, word):
    base = dict(vocab_size=37, dim=24, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=40,
                max_seq_len=64)
    with pytest.raises(ValueError, match=word):
        ModelConfig(**{**base, **kwargs})


def test_head_dim_is_derived_once_and_stays_out_of_the_stored_dict():
    """d = h / H (24 / 6 = 4), set in ``__post_init__``; ``replace`` derives it again, the dict
    stored in checkpoints leaves it out, and the config built back from that dict is equal."""
    assert SMALL.head_dim == SMALL.dim // SMALL.n_heads == 4
    assert dataclasses.replace(SMALL, dim=48).head_dim == 8
    assert "head_dim" not in SMALL.to_dict() and ModelConfig(**SMALL.to_dict()) == SMALL
    with pytest.raises(TypeError):
        ModelConfig(**SMALL.to_dict(), head_dim=4)


def test_unknown_preset_names_the_choices():
    with pytest.raises(KeyError, match="tiny"):
        ModelConfig.from_name("tiny-llama")


# ---------------------------------------------------------------- attention

def test_causal_mask_worked_example():
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(2, 5), expected)


@pytest.mark.parametrize("B, H, H_kv, T, S, d", [(2, 6, 2, 5, 9, 4), (1, 3, 3, 7, 7, 6),
                                                 (3, 4, 1, 1, 13, 8)])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_functions_agree(gen, B, H, H_kv, T, S, d, causal):
    q = torch.randn(B, H, T, d, generator=gen)
    k, v = torch.randn(2, B, H_kv, S, d, generator=gen)
    expected = loop_attention(q, k, v, causal)
    assert_close(reference_attention(q, k, v, causal), expected, atol=1e-5, rtol=1e-5)
    assert_close(sdpa_attention(q, k, v, causal), expected, atol=1e-5, rtol=1e-5)


def test_repeat_kv_maps_query_head_to_group():
    k = torch.arange(3.0).view(1, 3, 1, 1)  # K/V heads 0, 1, 2
    assert repeat_kv(k, 2).flatten().tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("q_shape, k_shape, word", [
    ((1, 4, 3, 8), (1, 3, 5, 8), "multiple"), ((1, 4, 6, 8), (1, 2, 5, 8), "at least"),
    ((1, 4, 3, 8), (1, 2, 5, 4), "head_dim"), ((4, 3, 8), (1, 2, 5, 8), "4-D")])
def test_attention_bad_shapes(q_shape, k_shape, word):
    q, k = torch.zeros(q_shape), torch.zeros(k_shape)
    with pytest.raises(ValueError, match=word):
        reference_attention(q, k, k, causal=True)


# ---------------------------------------------------------------- RMSNorm and rotary

def test_rmsnorm_worked_example():
    norm = RMSNorm(2, eps=0.0)
    assert_close(norm(torch.tensor([3.0, 4.0])), torch.tensor([0.8485, 1.1314]), atol=1e-4,
                 rtol=0)


def test_rotary_keeps_norms_and_depends_on_distance_only(gen):
    d, T = 8, 12
    q, k = torch.randn(2, 1, 1, 1, d, generator=gen)
    cos, sin = rotary_angles(d, 0, T, 10000.0)
    rq = apply_rotary(q.expand(1, 1, T, d), cos, sin)[0, 0]  # (T, d): q at every position
    rk = apply_rotary(k.expand(1, 1, T, d), cos, sin)[0, 0]
    assert_close(rq.norm(dim=-1), q.norm().expand(T))
    scores = rq @ rk.T  # (T, T): score of q at m and k at n
    for m, n in [(3, 1), (7, 5), (11, 9)]:  # same distance 2
        assert_close(scores[m, n], scores[2, 0], atol=1e-5, rtol=1e-5)


def test_rotary_offset_equals_slice():
    cos, sin = rotary_angles(6, 0, 10, 500.0)
    cos5, sin5 = rotary_angles(6, 5, 3, 500.0)
    assert_close(cos5, cos[5:8])
    assert_close(sin5, sin[5:8])


# ---------------------------------------------------------------- model, cache, set_attention

def test_forward_shapes_and_gqa_shapes(small_model, gen):
    seen = []

    def spy(q, k, v, causal=False):
        seen.append((tuple(q.shape), tuple(k.shape), causal))
        return reference_attention(q, k, v, causal)

    small_model.set_attention(spy)
    tokens = torch.randint(0, SMALL.vocab_size, (3, 11), generator=gen)
    assert small_model(tokens).shape == (3, 11, SMALL.vocab_size)
    assert seen == [((3, 6, 11, 4), (3, 2, 11, 4), True)] * SMALL.n_layers


@pytest.mark.parametrize("n_kv_heads", [1, 2, 6], ids=["MQA", "GQA", "MHA"])
def test_cached_logits_equal_recompute(gen, n_kv_heads):
    """Prefill 7 tokens, then chunks of 1, 3, 1, 2 through a DenseKVCache: every logit equals
    the full forward pass over the whole sequence."""
    model = Transformer(dataclasses.replace(SMALL, n_kv_heads=n_kv_heads), generator=gen).eval()
    tokens = torch.randint(0, SMALL.vocab_size, (2, 14), generator=gen)
    full = model(tokens)
    cache, pieces, pos = DenseKVCache(SMALL.n_layers), [], 0
    for size in (7, 1, 3, 1, 2):
        pieces.append(model(tokens[:, pos:pos + size], cache=cache, start_pos=pos))
        pos += size
    assert cache.seq_len == 14
    assert cache.k[0].shape == (2, n_kv_heads, 14, SMALL.head_dim)
    assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def test_bfloat16_model_stays_close_to_float32(small_model, gen):
    tokens = torch.randint(0, SMALL.vocab_size, (2, 10), generator=gen)
    ref = small_model(tokens)
    low = Transformer(SMALL).eval()
    low.load_state_dict(small_model.state_dict())
    out = low.to(torch.bfloat16)(tokens)
    assert out.dtype == torch.bfloat16
    assert_close(out.float(), ref, atol=0.05, rtol=0.05)


def test_set_attention_equivalent_function_gives_same_logits(small_model, gen):
    tokens = torch.randint(0, SMALL.vocab_size, (2, 9), generator=gen)
    ref = small_model(tokens)
    small_model.set_attention(sdpa_attention)
    assert_close(small_model(tokens), ref, atol=1e-5, rtol=1e-5)
    small_model.set_attention(loop_attention)
    assert_close(small_model(tokens), ref, atol=1e-5, rtol=1e-5)
    small_model.set_attention(lambda q, k, v, causal=False: torch.zeros_like(q))
    assert not torch.allclose(small_model(tokens), ref)  # the swap really takes effect
    small_model.set_attention(None)
    assert_close(small_model(tokens), ref)
    with pytest.raises(ValueError, match="callable"):
        small_model.set_attention("flash")


def test_same_generator_seed_same_weights():
    a = Transformer(SMALL, generator=torch.Generator().manual_seed(3))
    b = Transformer(SMALL, generator=torch.Generator().manual_seed(3))
    c = Transformer(SMALL, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.output.weight, b.output.weight)
    assert not torch.equal(a.output.weight, c.output.weight)


@pytest.mark.parametrize("tokens, start_pos, word", [
    (torch.zeros(5, dtype=torch.long), 0, "batch"),
    (torch.zeros(1, 5), 0, "dtype"),
    (torch.full((1, 5), 37), 0, "token ids"),
    (torch.full((1, 5), -1), 0, "token ids"),
    (torch.zeros(1, 5, dtype=torch.long), 60, "max_seq_len"),
    (torch.zeros(1, 5, dtype=torch.long), -1, "start_pos"),
    (torch.zeros(1, 0, dtype=torch.long), 0, "at least one")])
def test_bad_model_inputs(small_model, tokens, start_pos, word):
    with pytest.raises(ValueError, match=word):
        small_model(tokens, start_pos=start_pos)


def test_dense_cache_bytes_and_errors():
    """tiny: 2 (K and V) · 4 layers · 4 heads · 32 dims · 4 B · 100 tokens = 409,600 B."""
    cache = DenseKVCache(4)
    for layer in range(4):
        cache.update(layer, torch.zeros(1, 4, 60, 32), torch.zeros(1, 4, 60, 32))
        cache.update(layer, torch.zeros(1, 4, 40, 32), torch.zeros(1, 4, 40, 32))
    assert cache.seq_len == 100 and cache.nbytes == 409_600
    with pytest.raises(ValueError, match="layer_idx"):
        cache.update(4, torch.zeros(1, 4, 1, 32), torch.zeros(1, 4, 1, 32))
    with pytest.raises(ValueError, match="does not match"):
        cache.update(0, torch.zeros(1, 2, 1, 32), torch.zeros(1, 2, 1, 32))
    cache.reset()
    assert cache.seq_len == 0 and cache.nbytes == 0


# ---------------------------------------------------------------- generation and perplexity

def test_greedy_with_cache_equals_without(small_model, gen):
    prompt = torch.randint(0, SMALL.vocab_size, (5,), generator=gen).tolist()
    plain = generate(small_model, prompt, 20)
    cached = generate(small_model, prompt, 20, cache=DenseKVCache(SMALL.n_layers))
    assert cached == plain and len(plain) == 20


def test_sampling_is_reproducible_with_a_seeded_generator(small_model, gen):
    prompt = torch.randint(0, SMALL.vocab_size, (4,), generator=gen).tolist()
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))

    def run(s, cache=None):
        return generate(small_model, prompt, 30, temperature=1.0, top_k=20,
                        generator=torch.Generator().manual_seed(s), cache=cache)

    first = run(seed)
    assert run(seed) == first
    assert run(seed, DenseKVCache(SMALL.n_layers)) == first
    assert run(seed + 1) != first  # 30 draws over ~20 choices: equal with prob. ~0


def test_top_k_one_is_greedy(gen):
    logits = torch.randn(50, generator=gen)
    assert sample_next_token(logits, 2.0, 1, gen) == int(logits.argmax())
    assert sample_next_token(logits) == int(logits.argmax())


def test_top_k_never_samples_outside_the_top(gen):
    logits = torch.randn(30, generator=gen)
    allowed = set(torch.topk(logits, 3).indices.tolist())
    draws = {sample_next_token(logits, 5.0, 3, gen) for _ in range(200)}
    assert draws <= allowed and len(draws) > 1


@pytest.mark.parametrize("kwargs, word", [
    (dict(max_new_tokens=60), "max_seq_len"), (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_k=38), "top_k"), (dict(max_new_tokens=-2), ">= 0")])
def test_bad_generate_args(small_model, kwargs, word):
    args = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=word):
        generate(small_model, [1] * 10, **args)
    with pytest.raises(ValueError, match="empty"):
        generate(small_model, [], 3)
    with pytest.raises(ValueError, match="flat sequence"):
        generate(small_model, torch.zeros(2, 3, dtype=torch.long), 3)


def test_sampling_without_a_generator_is_refused(small_model, gen):
    """Sampling must draw from an explicit generator, never torch's global one."""
    with pytest.raises(ValueError, match="generator"):
        generate(small_model, [1, 2], 3, temperature=0.7)
    with pytest.raises(ValueError, match="generator"):
        sample_next_token(torch.randn(9, generator=gen), temperature=1.0)
    assert len(generate(small_model, [1, 2], 3)) == 3    # greedy needs none


def test_mean_nll_matches_direct_cross_entropy(small_model, gen):
    """Windows of seq_len=8 over 20 tokens: predictions 1..8 | 9..16 | 17..19, context reset
    at each window, so the sum is three separate cross-entropies."""
    tokens = torch.randint(0, SMALL.vocab_size, (20,), generator=gen)
    total = 0.0
    for a, b in [(0, 9), (8, 17), (16, 20)]:
        w = tokens[a:b].unsqueeze(0)
        with torch.no_grad():
            total += float(torch.nn.functional.cross_entropy(
                small_model(w[:, :-1])[0], w[0, 1:], reduction="sum"))
    assert mean_nll(small_model, tokens, seq_len=8, batch_size=2) == pytest.approx(total / 19)
    assert perplexity(small_model, tokens, seq_len=8) == pytest.approx(math.exp(total / 19))


@pytest.mark.parametrize("seq_len", [0, -3, 65])
def test_mean_nll_rejects_a_bad_window(small_model, seq_len):
    """0 is not "the default": every window length outside 1..max_seq_len is an error."""
    with pytest.raises(ValueError, match="seq_len"):
        mean_nll(small_model, torch.arange(20) % SMALL.vocab_size, seq_len=seq_len)


def test_untrained_model_is_near_uniform(small_model, gen):
    tokens = torch.randint(0, SMALL.vocab_size, (200,), generator=gen)
    assert perplexity(small_model, tokens) == pytest.approx(SMALL.vocab_size, rel=0.1)


# ---------------------------------------------------------------- tokenizer

def test_tokenizer_worked_example_and_round_trip():
    tok = ByteTokenizer()
    assert tok.encode("hé") == [104, 195, 169]
    text = "def f(x):\n    return x ** 2  # ünïcödé ✓"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([0xFF]) == "\ufffd"
    with pytest.raises(ValueError, match="256"):
        tok.decode([256])
    with pytest.raises(ValueError, match="str"):
        tok.encode(b"bytes")
