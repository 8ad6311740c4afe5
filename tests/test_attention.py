"""naive_attention and flash_attention against an independent float64 reference.

Fresh random inputs every run (the ``gen`` fixture). Awkward shapes: T != S, N not a multiple of
the block, d in {16, 32, 64, 80, 128}, causal or not, grouped-query and multi-query heads.
"""

import math

import pytest
import torch

from llminfra.attention import flash_attention, naive_attention


def reference(q, k, v, causal=False, scale=None):
    """softmax(QKᵀ·scale + mask) V in float64 (scale 1/√d unless given) with repeated K/V heads
    and an explicit mask; a row with no visible key is zero (the contract of the package)."""
    q, k, v = q.double(), k.double(), v.double()
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    T, S, d = q.shape[2], k.shape[2], q.shape[3]
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(d) if scale is None else scale)
    if causal:
        keep = torch.tensor([[j <= S - T + i for j in range(S)] for i in range(T)])
        scores = scores.masked_fill(~keep, float("-inf"))
        empty = ~keep.any(dim=1)  # rows with no key
        scores[..., empty, :] = 0.0
        out = torch.softmax(scores, dim=-1) @ v
        out[..., empty, :] = 0.0
        return out
    return torch.softmax(scores, dim=-1) @ v


def rand(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


SHAPES = [  # B, H, H_kv, T, S, d
    (1, 1, 1, 1, 1, 16),
    (2, 4, 4, 37, 37, 32),     # plain multi-head, N not a multiple of the block
    (1, 8, 2, 50, 77, 64),     # grouped-query, T < S
    (2, 6, 1, 19, 130, 80),    # multi-query, d = 80 (not a power of two)
    (1, 2, 1, 64, 64, 128),
    (1, 4, 2, 9, 300, 16),     # decode-like: few queries, long cache
]


@pytest.mark.parametrize("fn", [naive_attention, flash_attention])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference(gen, fn, causal, shape):
    B, H, H_kv, T, S, d = shape
    q, k, v = rand(gen, B, H, T, d), rand(gen, B, H_kv, S, d), rand(gen, B, H_kv, S, d)
    kwargs = {"block_q": 16, "block_k": 24} if fn is flash_attention else {}
    out = fn(q, k, v, causal, **kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), reference(q, k, v, causal), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("block_q,block_k", [(1, 1), (7, 5), (16, 64), (64, 16), (512, 512)])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_equals_naive_any_block(gen, block_q, block_k, causal):
    """The tiling is invisible in the result, whatever the block sizes (float64: exact to 1e-12)."""
    q, k, v = (rand(gen, 2, 3, 45, 16, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(flash_attention(q, k, v, causal, block_q=block_q, block_k=block_k),
                               naive_attention(q, k, v, causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fn", [naive_attention, flash_attention])
def test_dtypes(gen, fn, dtype):
    q, k, v = (rand(gen, 1, 2, 33, 32, dtype=dtype) for _ in range(3))
    out = fn(q, k, v, True)
    assert out.dtype == dtype
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}[dtype]
    torch.testing.assert_close(out.double(), reference(q, k, v, True), rtol=tol, atol=tol)


@pytest.mark.parametrize("fn", [naive_attention, flash_attention])
def test_logits_times_1000_do_not_overflow(gen, fn):
    """Scores of order 1e3·√d overflow exp in float32 (> 88) and float64 (> 709) without the
    running max. float64 is compared tightly; float32 loosely, because a near-tie between two
    scores of ~5000 turns fp32 rounding of the scores (~5e-4) into visible weight changes."""
    kw = {"block_k": 8} if fn is flash_attention else {}
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 2e-2)):
        q = rand(gen, 1, 2, 40, 32, dtype=dtype) * 1000
        k, v = rand(gen, 1, 2, 40, 32, dtype=dtype), rand(gen, 1, 2, 40, 32, dtype=dtype)
        for causal in (False, True):
            out = fn(q, k, v, causal, **kw)
            assert torch.isfinite(out).all()
            torch.testing.assert_close(out.double(), reference(q, k, v, causal), rtol=tol, atol=tol)


@pytest.mark.parametrize("fn", [naive_attention, flash_attention])
def test_rows_with_no_key_are_zero(gen, fn):
    """Causal with T > S: the first T - S queries sit before every key; their output is 0."""
    q, k, v = rand(gen, 1, 2, 12, 16), rand(gen, 1, 1, 5, 16), rand(gen, 1, 1, 5, 16)
    out = fn(q, k, v, True, **({"block_q": 4, "block_k": 2} if fn is flash_attention else {}))
    assert torch.isfinite(out).all()
    assert torch.equal(out[:, :, :7], torch.zeros_like(out[:, :, :7]))
    torch.testing.assert_close(out.double(), reference(q, k, v, True), rtol=1e-4, atol=2e-5)


def test_worked_example():
    """q = k = v = I₂, causal, scale 1/√2: row 1 weights softmax([0, 0.7071]) = [0.3302, 0.6698]."""
    x = torch.eye(2).view(1, 1, 2, 2)
    want = torch.tensor([[1.0, 0.0], [0.3302, 0.6698]])
    for fn in (naive_attention, flash_attention):
        torch.testing.assert_close(fn(x, x, x, causal=True)[0, 0], want, atol=1e-4, rtol=0)


def test_decode_row_equals_last_row_of_prefill(gen):
    """T < S causal means the LAST T positions: one query against S keys equals the last row of
    the full S x S causal attention."""
    q, k, v = rand(gen, 1, 4, 20, 32), rand(gen, 1, 2, 20, 32), rand(gen, 1, 2, 20, 32)
    full = naive_attention(q, k, v, True)
    for fn in (naive_attention, flash_attention):
        torch.testing.assert_close(fn(q[:, :, -3:], k, v, True), full[:, :, -3:])


def test_matches_sdpa(gen):
    """Tied to PyTorch's scaled_dot_product_attention too (T == S, where its is_causal agrees)."""
    q, k, v = (rand(gen, 2, 3, 70, 64) for _ in range(3))
    for causal in (False, True):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(flash_attention(q, k, v, causal, block_q=32, block_k=16), want,
                                   rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("fn", [naive_attention, flash_attention])
@pytest.mark.parametrize("q_shape,k_shape,msg", [
    ((1, 2, 4, 8), (1, 2, 4), "4-D"),
    ((1, 3, 4, 8), (1, 2, 4, 8), "multiple"),
    ((1, 2, 4, 8), (1, 2, 4, 16), "head_dim"),
    ((2, 2, 4, 8), (1, 2, 4, 8), "batch"),
    ((1, 2, 0, 8), (1, 2, 4, 8), "empty"),
])
def test_bad_shapes(fn, q_shape, k_shape, msg):
    with pytest.raises(ValueError, match=msg):
        fn(torch.zeros(q_shape), torch.zeros(k_shape), torch.zeros(k_shape))


@pytest.mark.parametrize("fn", [naive_attention, flash_attention])
def test_bad_dtypes(fn):
    x = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="dtype"):
        fn(x.long(), x.long(), x.long())
    with pytest.raises(ValueError, match="share one dtype"):
        fn(x, x.double(), x)
    with pytest.raises(ValueError, match="same shape"):
        fn(x, x, torch.zeros(1, 1, 5, 8))
    with pytest.raises(ValueError, match="torch.Tensor"):
        fn([[1.0]], x, x)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_block(bad):
    x = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="block_q"):
        flash_attention(x, x, x, block_q=bad)


def test_causal_skips_masked_tiles(gen):
    """Causal, T = S = 64, blocks of 16: 4·5/2 = 10 of the 16 tiles lie on or below the diagonal,
    and only those are computed."""
    q, k, v = (rand(gen, 1, 1, 64, 16) for _ in range(3))
    seen = []
    flash_attention(q, k, v, True, block_q=16, block_k=16, on_tile=lambda *a: seen.append(a[:4]))
    assert len(seen) == 10
    assert all(i1 - 1 >= j0 for i0, i1, j0, j1 in seen)
    seen.clear()
    flash_attention(q, k, v, False, block_q=16, block_k=16, on_tile=lambda *a: seen.append(a[:4]))
    assert len(seen) == 16


# ---------------------------------------------------------------- hardening (issue 13)
@pytest.mark.parametrize("fn", [naive_attention, flash_attention])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [0.37, 2.0])
def test_callers_softmax_scale_is_used(gen, fn, causal, scale):
    """A caller's softmax_scale replaces 1/√d (d = 16: 0.25): the output must be softmax(QKᵀ ·
    scale) V with that scale, and differ from the default-scale output."""
    q, k, v = rand(gen, 1, 4, 21, 16), rand(gen, 1, 2, 33, 16), rand(gen, 1, 2, 33, 16)
    kwargs = {"block_q": 8, "block_k": 8} if fn is flash_attention else {}
    out = fn(q, k, v, causal, softmax_scale=scale, **kwargs)
    torch.testing.assert_close(out.double(), reference(q, k, v, causal, scale),
                               rtol=1e-4, atol=2e-5)
    assert not torch.allclose(out, fn(q, k, v, causal, **kwargs), atol=1e-3)


@pytest.mark.parametrize("fn", [naive_attention, flash_attention])
@pytest.mark.parametrize("bad", ["no", 0, 1, None, "False"])
def test_causal_must_be_a_bool(fn, bad):
    """causal="no" used to run as causal (any truthy value did)."""
    x = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="causal must be True or False"):
        fn(x, x, x, bad)


@pytest.mark.parametrize("fn", [naive_attention, flash_attention])
def test_requires_grad_inputs_are_refused_with_a_clear_message(gen, fn):
    """These kernels are forward-only: with inputs that require grad, .backward() used to fail
    deep in autograd ('modified by an inplace operation'). Now the call says so up front; under
    torch.no_grad() the same inputs are fine."""
    q, k, v = (rand(gen, 1, 2, 5, 8).requires_grad_() for _ in range(3))
    with pytest.raises(ValueError, match="forward-only.*no_grad"):
        fn(q, k, v, True)
    with pytest.raises(ValueError, match="forward-only"):
        fn(q.detach(), k.detach(), v, True)          # any one of the three
    with torch.no_grad():
        out = fn(q, k, v, True)
    torch.testing.assert_close(out.double(), reference(q.detach(), k.detach(), v.detach(), True),
                               rtol=1e-4, atol=2e-5)


def test_reference_attention_checks_causal_but_trains():
    """The model's own attention refuses a non-bool ``causal`` like the kernels do, yet keeps
    its backward pass (training runs through it)."""
    from llminfra.attention.reference import reference_attention, sdpa_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g, requires_grad=True) for _ in range(3))
    for fn in (reference_attention, sdpa_attention):
        with pytest.raises(ValueError, match="causal must be True or False"):
            fn(q, k, v, causal="no")
        fn(q, k, v, causal=True).sum().backward()
        assert q.grad is not None
        q.grad = None


@pytest.mark.parametrize("bad", [dict(n_layers=0), dict(head_dim=-1), dict(num_blocks=2.5),
                                 dict(block_size=0), dict(n_kv_heads=True)])
def test_paged_cache_refuses_impossible_sizes(bad):
    from llminfra.kvcache import PagedKVCache
    args = dict(n_layers=2, n_kv_heads=2, head_dim=4, num_blocks=4, block_size=4) | bad
    with pytest.raises(ValueError, match=f"{next(iter(bad))} must be a positive int"):
        PagedKVCache(**args)
