"""The fp32 kernels for a decode step's products (llminfra/kernels/csrc/f32_skinny.c for one or two rows,
f32_panels.c for more) and their use: against torch's product, the same bits for any thread
count, bad input refused plainly, and the engine's fast runner on them giving the tokens oneDNN
gives."""

import pytest
import torch

from llminfra.kernels import w4a8

pytestmark = pytest.mark.skipif(not w4a8.available(),
                                reason=f"the C kernels do not build here: "
                                       f"{w4a8.unavailable_reason()}")


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("M", [0, 1, 2, 3, 7, 8, 9, 17])
@pytest.mark.parametrize("K", [576, 100, 16, 5])
def test_products_match_torch(M, K):
    from llminfra.kernels.f32_skinny import f32_mm

    g = torch.Generator().manual_seed(M * 1000 + K)
    x, W = torch.randn(M, K, generator=g), torch.randn(37, K, generator=g)
    r = torch.randn(M, 37, generator=g)
    _close(f32_mm(x, W), x @ W.t())
    _close(f32_mm(x, W, r), torch.addmm(r, x, W.t()))


def test_same_bits_for_any_thread_count():
    from llminfra.kernels.f32_skinny import f32_mm

    g = torch.Generator().manual_seed(1)
    x, W = torch.randn(3, 576, generator=g), torch.randn(1000, 576, generator=g)
    one = f32_mm(x, W, threads=1)
    for t in (2, 3, 7):
        assert torch.equal(f32_mm(x, W, threads=t), one)


def test_a_row_gets_the_same_bits_in_any_batch():
    """Each output is one accumulator over K in order, whatever block of W's rows and pass of
    x's rows holds it: a row alone and the same row among 16 others are equal, bit for bit
    (37 rows of W: blocks and a ragged last block)."""
    from llminfra.kernels.f32_skinny import f32_mm

    g = torch.Generator().manual_seed(2)
    x, W = torch.randn(17, 100, generator=g), torch.randn(37, 100, generator=g)
    batch = f32_mm(x, W, threads=2)
    for m in (0, 5, 6, 16):
        assert torch.equal(f32_mm(x[m:m + 1], W, threads=1), batch[m:m + 1])


def test_views_are_read_as_their_values():
    from llminfra.kernels.f32_skinny import f32_mm

    g = torch.Generator().manual_seed(2)
    x, W = torch.randn(4, 128, generator=g), torch.randn(64, 256, generator=g)
    _close(f32_mm(x.t()[:, :2].t(), W[:, ::2]), x.t()[:, :2].t() @ W[:, ::2].t())


@pytest.mark.parametrize("bad, message", [
    (dict(x=torch.randn(2, 8), weight=torch.randn(3, 9)), "8 features, the weight 9"),
    (dict(x=torch.randn(2, 8).double(), weight=torch.randn(3, 8)), "float32"),
    (dict(x=torch.randn(8), weight=torch.randn(3, 8)), "2-D"),
    (dict(x=torch.randn(2, 8), weight=torch.randn(3, 8), residual=torch.randn(3, 2)),
     "residual must have shape"),
    (dict(x=torch.randn(2, 8), weight=torch.randn(3, 8), threads=0), "threads"),
])
def test_bad_input_is_refused_plainly(bad, message):
    from llminfra.kernels.f32_skinny import f32_mm

    with pytest.raises(ValueError, match=message):
        f32_mm(**bad)


def test_kernel_settings_are_checked():
    from llminfra.kernels.f32_skinny import kernel

    for rows in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_rows"):
            kernel(max_rows=rows)
    with pytest.raises(ValueError, match="threads"):
        kernel(threads=65)


def test_matmul_sends_rows_to_the_kernels_and_past_the_panels_limit_to_blas(monkeypatch):
    """One or two rows go to f32_skinny.c, more (a prompt of 600 rows too) to f32_panels.c, and
    past a ``panel_max_rows`` set lower, to F.linear: each right, and the route is the one
    said."""
    from llminfra.runner import fused
    from llminfra.kernels.f32_skinny import PANEL_MAX_ROWS, f32_mm
    from llminfra.runner.kernel_set import skinny_kernels

    g = torch.Generator().manual_seed(3)
    W = torch.randn(96, 64, generator=g)
    sent = []
    product = fused.SkinnyMatmul._product
    monkeypatch.setattr(fused.SkinnyMatmul, "_product",
                        lambda self, x, r, M: sent.append(M) or product(self, x, r, M))
    assert PANEL_MAX_ROWS >= 2 ** 20
    for limit, rows in ((PANEL_MAX_ROWS, (1, 2, 3, 16, 600)), (64, (1, 3, 64, 65))):
        m = skinny_kernels(threads=2, max_rows=2, panel_max_rows=limit).matmul(W)
        sent.clear()
        for M in rows:
            x, r = torch.randn(M, 64, generator=g), torch.randn(M, 96, generator=g)
            _close(m(x), x @ W.t())
            _close(m.add(x, r), torch.addmm(r, x, W.t()))
        assert sent == [M for M in rows if M <= limit for _ in range(2)]    # 65 of 64: F.linear
    x = torch.randn(1, 1, 64, generator=g)       # FastDecoder's (1, T, dim)
    assert m(x).shape == (1, 1, 96)
    assert torch.equal(m(x)[0], f32_mm(x[0], W))
    xt, sent_before = torch.randn(64, 3, generator=g).t(), len(sent)
    _close(m(xt), xt @ W.t())                    # a non-contiguous x: F.linear
    assert len(sent) == sent_before


@pytest.mark.parametrize("N, K", [(96, 64), (37, 100), (5, 7), (1000, 576)])
def test_panel_rows_get_the_same_bits_in_any_batch_and_thread_count(N, K):
    """f32_panels.c: tiles of 8 rows against pairs of 16-column panels (N not a multiple of 16
    or 32 leaves a partial panel and a lone one); each output is one sum over K in order, so a
    row's result is the same bits in a batch of 3 as of 64, on 1 or 3 threads, and right."""
    from llminfra.runner.kernel_set import skinny_kernels

    g = torch.Generator().manual_seed(N + K)
    W, x = torch.randn(N, K, generator=g), torch.randn(64, K, generator=g)
    r = torch.randn(64, N, generator=g)
    whole = skinny_kernels(threads=3).matmul(W).add(x, r)
    _close(whole, torch.addmm(r, x, W.t()))
    one = skinny_kernels(threads=1).matmul(W)
    for rows in (slice(0, 3), slice(5, 14), slice(40, 64)):
        assert torch.equal(one.add(x[rows], r[rows]), whole[rows])


def test_a_biased_matrix_stays_on_onednn():
    from llminfra.runner.kernel_set import skinny_kernels

    W, b = torch.randn(8, 16), torch.randn(8)
    m = skinny_kernels(max_rows=2).matmul(W, b)
    x = torch.randn(1, 16)
    _close(m(x), x @ W.t() + b)


def test_fast_runner_on_skinny_gives_onednns_tokens():
    """The engine on the tiny model: greedy tokens with matmul='skinny' (batch 1 and 2 on the C
    kernel) are oneDNN's."""
    from llminfra.engine import SamplingParams
    from llminfra.serving.serve import build_engine

    prompts = ["The cat sat on", "Paged attention keeps", "def fib(n):"]
    outs = {}
    for kind in ("onednn", "skinny"):
        engine = build_engine("tiny", num_blocks=64, max_num_seqs=2, matmul=kind)
        outs[kind] = [o.outputs[0].token_ids for o in engine.generate(
            prompts, SamplingParams(max_tokens=12, temperature=0.0))]
    assert outs["skinny"] == outs["onednn"]
    assert all(len(t) == 12 for t in outs["skinny"])


def test_serve_picks_skinny_for_a_real_model_and_refuses_it_on_the_readable_runner():
    from llminfra.runner.kernel_choice import resolve_matmul
    from llminfra.serving.serve import build_engine

    assert resolve_matmul("auto", "smollm2-135m") == "skinny"
    assert resolve_matmul("auto", "tiny") == "plain"
    with pytest.raises(ValueError, match="skinny.*fast runner"):
        build_engine("tiny", num_blocks=16, matmul="skinny", runner="readable")


@pytest.mark.parametrize("M, limit", [(1, None), (2, None), (5, None), (70, None), (70, 64)])
def test_fused_norm_and_swiglu_match_torch(M, limit, monkeypatch):
    """``fused(x, norm=g)`` is f(RMSNorm(x)·g) and ``fused(x, gated=True)`` f(silu(gate)·up),
    both formed inside the kernels' call for any number of rows up to ``panel_max_rows`` (70
    of 64 is past it: torch's and F.linear)."""
    import torch.nn.functional as F

    from llminfra.runner import fused
    from llminfra.kernels.f32_skinny import PANEL_MAX_ROWS
    from llminfra.runner.kernel_set import skinny_kernels

    most = PANEL_MAX_ROWS if limit is None else limit
    g = torch.Generator().manual_seed(M)
    W, gain = torch.randn(40, 100, generator=g), torch.rand(100, generator=g) + 0.5
    m = skinny_kernels(threads=2, max_rows=2, panel_max_rows=most).matmul(W)
    calls, product = [], fused.SkinnyMatmul._product
    monkeypatch.setattr(fused.SkinnyMatmul, "_product", lambda self, x, r, M, norm=None,
                        eps=0.0, gated=False: calls.append((M, norm is not None, gated))
                        or product(self, x, r, M, norm, eps, gated))
    x = torch.randn(M, 100, generator=g) * 3
    _close(m.fused(x, norm=gain, eps=1e-5), F.rms_norm(x, (100,), gain, 1e-5) @ W.t())
    assert calls == ([(M, True, False)] if M <= most else [])
    xx = torch.randn(1, M, 200, generator=g)
    gate, up = xx.chunk(2, -1)
    _close(m.fused(xx, gated=True), (F.silu(gate) * up) @ W.t())
    r = torch.randn(M, 40, generator=g)
    _close(m.fused(xx[0], gated=True, residual=r), r + (F.silu(gate[0]) * up[0]) @ W.t())
    assert calls[1:] == ([(M, False, True)] * 2 if M <= most else [])
    assert m.adds_in_fused
    with pytest.raises(ValueError, match="f32_skinny_gemm refused"):
        m._product(torch.randn(1, 50), None, 1)        # narrower than K: the C code refuses
    with pytest.raises(ValueError, match="f32_panel_gemm refused"):
        m._product(torch.randn(3, 50), None, 3)
    assert not skinny_kernels().matmul(W, torch.zeros(40)).fuses


def test_fast_decoder_on_skinny_gives_onednns_tokens():
    """FastDecoder takes the fused forms (its norms and SwiGLU inside the kernel's call at one
    row): greedy tokens equal oneDNN's on the tiny model."""
    from llminfra.model import load_model
    from llminfra.runner import FastDecoder, prepacked
    from llminfra.runner.kernel_set import skinny_kernels

    net, _ = load_model("tiny")
    prompt = list(range(5, 25))
    dnn = FastDecoder(net, max_len=64, linear=prepacked.onednn_linear).generate(prompt, 16)
    skinny = FastDecoder(net, max_len=64, kernels=skinny_kernels())
    assert skinny.fused
    assert skinny.generate(prompt, 16) == dnn


def _has_avx2() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx2 " in flags and " fma " in flags


@pytest.mark.skipif(not _has_avx2(), reason="needs an x86 CPU with AVX2 and FMA (the two "
                    "builds CI machines run); not counted as a pass")
def test_an_avx2_build_gives_the_native_builds_bits():
    """CI runs on AVX2 or AVX-512 machines and a notebook's printed tokens must not move with
    them: the C kernels (the few-row product with its norm, the panel product of more rows and
    the paged decode attention) give the same bits built for AVX2 (x86-64-v3) as for this CPU."""
    from llminfra.runner.fast_step import c_attend
    from llminfra.kernels import paged_decode

    g = torch.Generator().manual_seed(11)
    x, W, gain = torch.randn(2, 576, generator=g), torch.randn(300, 576, generator=g), \
        torch.rand(576, generator=g)
    K, V = torch.randn(20, 16, 3, 64, generator=g), torch.randn(20, 16, 3, 64, generator=g)
    q = torch.randn(3, 9, 64, generator=g)
    tables, lens = torch.randint(0, 20, (3, 5), generator=g), torch.tensor([70, 5, 33])
    xs, got = torch.randn(11, 576, generator=g), []
    for arch in ("native", "x86-64-v3"):
        lib = w4a8.load(w4a8.build(arch))
        y = torch.empty(2, 300)
        assert lib.f32_skinny_gemm(x.data_ptr(), W.data_ptr(), None, y.data_ptr(), 2, 300,
                                   576, 576, 0, gain.data_ptr(), 1e-5, 1, None) == 0
        k = paged_decode.on(lib)
        att = c_attend(k, tables, lens, K, (9, 3, 64), 9 * 64)(q, (None, None, K, V)).clone()
        gemm, pack = lib.f32_panel_gemm, lib.f32_panel_pack
        panels, ys = torch.empty(19 * 16 * 576), torch.empty(11, 300)
        assert pack(W.data_ptr(), panels.data_ptr(), 300, 576) == 0
        assert gemm(xs.data_ptr(), panels.data_ptr(), None, ys.data_ptr(), 11, 300, 576, 576, 0,
                    gain.data_ptr(), 1e-5, 1, None) == 0
        got.append((y, att, ys))
    assert all(torch.equal(a, b) for a, b in zip(*got))
