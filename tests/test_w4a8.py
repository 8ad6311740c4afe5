"""The w4a8 kernel (int4 weights × int8 activations, ``llminfra/kernels/csrc/w4a8.c``): each path
this machine can build — AVX-512 VNNI, AVX2, portable C — multiplies exactly where the
activations already lie on their int8 grid, within the int8 rounding elsewhere; its fusions equal
the torch calls they replace; FastDecoder on it gives the dequantized weights' logits; the build
and bad input fail with messages that say what to do."""

import platform

import pytest
import torch
import torch.nn.functional as F

from llminfra.model import ModelConfig
from llminfra.runner import FastDecoder
from llminfra.runner.fast_decode import _plain_linear
from llminfra.model.transformer import Transformer
from llminfra.quant import quantize
from llminfra.kernels import w4a8, build as w4a8_build

pytestmark = pytest.mark.skipif(not w4a8.available(),
                                reason="no C compiler here to build the w4a8 kernel")

X86 = platform.machine().lower() in ("x86_64", "amd64")
# every path this CPU runs: the portable loop everywhere, AVX2 and the native build on x86
ARCHES = ["portable"] + (["x86-64-v3", "native"] if X86 else ["native"])
#: K values that cut into every block shape: 2 groups; 16 + 2 (SmolLM2's 576); 16 + 8 + 4
#: (Qwen2's 896); 3 × 16 (1536); 4 + 2 (192)
WIDTHS = [64, 576, 896, 1536, 192]


@pytest.fixture(scope="module", params=ARCHES)
def built(request, tmp_path_factory):
    """(arch, library) for each path, built into a fresh folder."""
    return request.param, w4a8.load(w4a8.build(request.param, tmp_path_factory.mktemp("w4a8")))


@pytest.fixture(scope="module")
def lib(built):
    return built[1]


def test_the_paths_built_are_the_ones_asked_for(built):
    arch, lib = built
    path = w4a8.build_info(lib)["path"]
    if arch == "portable":
        assert path == "portable"
    elif arch == "x86-64-v3":                     # AVX2 without AVX-512
        assert path == "avx2"
    elif X86:
        assert path in ("avx512-vnni", "avx2")    # every x86 CPU PyTorch vectorizes has AVX2


def _on_grid(M, K, gen):
    """Activations whose int8 rounding is exact: integers in [-127, 127], each group's max 127."""
    x = torch.randint(-127, 128, (M, K), generator=gen).float()
    x[:, ::32] = 127.0
    return x


@pytest.mark.parametrize("K", WIDTHS)
@pytest.mark.parametrize("N", [1, 7, 48])
def test_exact_on_the_int8_grid(lib, K, N):
    gen = torch.Generator().manual_seed(K + N)
    w = w4a8.prepare(quantize(torch.randn(N, K, generator=gen), "int4-g32"), lib)
    weight = w4a8.dequantize(w, lib)
    x = _on_grid(3, K, gen)
    want = x.double() @ weight.double().T
    got = w4a8.w4a8_mm(x, w, lib)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))


@pytest.mark.parametrize("passes", [1, 2])
def test_threads_give_the_same_bits(lib, monkeypatch, passes):
    """Any thread count, started per call or kept in a pool, gives exactly one thread's result:
    odd N (a pair cut by the split), fewer columns than threads, rows enough to split the
    quantization too, and the fused norm and gate."""
    gen = torch.Generator().manual_seed(11 + passes)
    for M, N, K in ((1, 577, 576), (16, 49, 896), (9, 1, 192), (40, 130, 1536)):
        w = w4a8.prepare(quantize(torch.randn(N, K, generator=gen), "int4-g32"), lib)
        x = torch.randn(M, K, generator=gen) * 2
        one = w4a8.w4a8_mm(x, w, lib, passes, threads=1)
        for threads in (2, 3, 8):
            got = w4a8.w4a8_mm(x, w, lib, passes, threads=threads)
            assert torch.equal(got, one), (M, N, K, threads)
    monkeypatch.setattr(w4a8, "library", lambda: lib)
    weight = torch.randn(33, 192, generator=gen)
    f1, f2 = (w4a8.w4a8_linear(passes, threads=t)(weight) for t in (1, 2))
    assert (f1.threads, f2.threads) == (1, 2)
    x = torch.randn(20, 384, generator=gen)
    gain = torch.rand(192, generator=gen) + 0.5
    for _ in range(3):                            # the pool's workers, reused call after call
        assert torch.equal(f2.fused(x, gated=True), f1.fused(x, gated=True))
        assert torch.equal(f2.fused(x[:, :192], norm=gain), f1.fused(x[:, :192], norm=gain))
    assert w4a8.w4a8_linear(threads=None)(weight).threads == w4a8.default_threads()


@pytest.mark.parametrize("passes", [1, 2])
def test_a_row_gets_the_same_bits_in_a_prompt(lib, passes):
    """Products of several rows take them in tiles of up to 4 (AVX-512: ``dot2_rows``, the
    tile's integer sums side by side), and of 8 or more unpack each pair of W rows once for all
    of them (``dot2_from``); each row's result is the same bits as that row alone, on every
    block shape, whole and partial tiles, an odd N and several threads."""
    gen = torch.Generator().manual_seed(21 + passes)
    for M, N, K in ((4, 7, 576), (9, 33, 896), (37, 49, 1536), (5, 1, 192), (6, 12, 64),
                    (2, 5, 576), (3, 9, 1536), (8, 3, 128)):
        w = w4a8.prepare(quantize(torch.randn(N, K, generator=gen), "int4-g32"), lib)
        x = torch.randn(M, K, generator=gen) * 2
        whole = w4a8.w4a8_mm(x, w, lib, passes, threads=2)
        alone = torch.cat([w4a8.w4a8_mm(x[r:r + 1], w, lib, passes, threads=1)
                           for r in range(M)])
        assert torch.equal(whole, alone), (M, N, K)


def test_the_kernels_weights_are_the_quantizers(lib):
    """``dequantize`` reads the packed layout back: the int4-g32 weights, up to the fp16 offset."""
    wt = torch.randn(32, 576, generator=torch.Generator().manual_seed(3))
    q = quantize(wt, "int4-g32")
    got = w4a8.dequantize(w4a8.prepare(q, lib), lib)
    scale = q.scale.float().max()
    torch.testing.assert_close(got, q.dequantize(), rtol=0, atol=float(scale) * 5e-3)


def test_within_int8_rounding_elsewhere(lib):
    gen = torch.Generator().manual_seed(5)
    w = w4a8.prepare(quantize(torch.randn(256, 576, generator=gen), "int4-g32"), lib)
    x = torch.randn(4, 576, generator=gen)
    want = x @ w4a8.dequantize(w, lib).T
    err = (w4a8.w4a8_mm(x, w, lib) - want).abs().max() / want.abs().max()
    # int8 in groups of 32 rounds each activation by up to max|x|/254: about 0.5 % at most here
    assert 1e-5 < float(err) < 1.5e-2


def test_two_passes_carry_the_rounding_error_too(lib):
    """``passes=2`` multiplies what the int8 rounding left as well: about 15-bit activations."""
    gen = torch.Generator().manual_seed(6)
    w = w4a8.prepare(quantize(torch.randn(64, 896, generator=gen), "int4-g32"), lib)
    x = torch.randn(3, 896, generator=gen)
    want = x.double() @ w4a8.dequantize(w, lib).double().T
    errs = [float((w4a8.w4a8_mm(x, w, lib, passes=p).double() - want).abs().max()
                  / want.abs().max()) for p in (1, 2)]
    assert errs[1] < 2e-4 and errs[1] < errs[0] / 30, errs
    xg = _on_grid(2, 896, gen)                    # on the grid the second pass adds nothing
    torch.testing.assert_close(w4a8.w4a8_mm(xg, w, lib, passes=2), w4a8.w4a8_mm(xg, w, lib),
                               rtol=1e-6, atol=1e-3)


def test_fusions_equal_the_torch_calls(lib, monkeypatch):
    monkeypatch.setattr(w4a8, "library", lambda: lib)
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(40, 192, generator=gen)
    f = w4a8.w4a8_linear()(weight)
    x = torch.randn(2, 3, 192, generator=gen) * 3
    gain = torch.rand(192, generator=gen) + 0.5
    normed = F.rms_norm(x, (192,), gain, 1e-5)
    torch.testing.assert_close(f.fused(x, norm=gain, eps=1e-5), f(normed), rtol=1e-4, atol=1e-4)
    gate_up = torch.randn(2, 384, generator=gen)
    gate, up = gate_up.chunk(2, -1)
    torch.testing.assert_close(f.fused(gate_up, gated=True), f(F.silu(gate) * up),
                               rtol=1e-4, atol=1e-4)
    # the kernel's own exp across SiLU's range (clamped past ±87: silu is x or 0 there), and
    # a NaN or an infinity in a row's gate: that row's outputs NaN, as torch's product gives
    wide = torch.stack([torch.linspace(-120, 120, 192), torch.linspace(-3, 3, 192)])
    gate_up = torch.cat([wide, torch.randn(2, 192, generator=gen)], dim=1).repeat(4, 1)
    for row, bad in ((4, float("nan")), (5, float("inf")), (6, float("-inf"))):
        gate_up[row, 7] = bad
    gate, up = gate_up.chunk(2, -1)
    got, want = f.fused(gate_up, gated=True), f(F.silu(gate) * up)
    assert got[4:7].isnan().all() and want[4:7].isnan().all()
    torch.testing.assert_close(got[[0, 1, 2, 3, 7]], want[[0, 1, 2, 3, 7]], rtol=1e-4,
                               atol=1e-4)
    assert f(x).shape == (2, 3, 40) and f(x.to(torch.bfloat16)).dtype == torch.bfloat16
    f2 = w4a8.w4a8_linear(passes=2)(weight)       # the fusions feed the second pass as well
    exact = normed @ w4a8.dequantize(f2.weight, lib).T
    torch.testing.assert_close(f2.fused(x, norm=gain, eps=1e-5), exact, rtol=1e-3, atol=1e-3)


CONFIG = ModelConfig(vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=384,
                     max_seq_len=64, tie_embeddings=True, qkv_bias=True)


def test_fast_decoder_on_w4a8_gives_the_dequantized_logits(lib, monkeypatch, one_thread):
    monkeypatch.setattr(w4a8, "library", lambda: lib)
    torch.manual_seed(0)
    model = Transformer(CONFIG).eval()
    prompt = torch.randint(0, 512, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    fast = FastDecoder(model, max_len=64, linear=w4a8.w4a8_linear())
    assert fast.fused
    ref = FastDecoder(model, max_len=64, linear=lambda w: _plain_linear(
        quantize(w.float(), "int4-g32").dequantize()))
    with torch.no_grad():
        got, want = (d.forward(torch.tensor(prompt), 0) for d in (fast, ref))
        step_got, step_want = (d.forward(torch.tensor([5]), 12) for d in (fast, ref))
    for g, w in ((got, want), (step_got, step_want)):
        torch.testing.assert_close(g, w, rtol=0, atol=3e-2 * float(w.abs().max()))
    # the bytes a step reads: 0.625 a weight, as PyTorch's int4 layout
    assert fast.weight_bytes_read() == pytest.approx(
        FastDecoder(model, linear=_bf16_int4_bytes).weight_bytes_read(), rel=0.02)


def _bf16_int4_bytes(weight):
    """A stand-in ``linear`` reporting int4-g32 bytes with 2-byte scale and offset."""
    f = _plain_linear(weight)
    n = weight.numel()
    return type("L", (), {"__call__": staticmethod(f), "nbytes": n // 2 + 4 * (n // 32)})()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="multiple of 64"):
        w4a8.w4a8_linear()(torch.randn(16, 96))
    with pytest.raises(ValueError, match="2-D weight"):
        w4a8.w4a8_linear()(torch.randn(16))
    f = w4a8.w4a8_linear()(torch.randn(16, 64))
    with pytest.raises(ValueError, match="end in 64 features"):
        f(torch.randn(1, 65))
    with pytest.raises(ValueError, match=r"end in 128 features \(gate and up\)"):
        f.fused(torch.randn(1, 64), gated=True)
    with pytest.raises(ValueError, match=r"norm must have shape \(64,\)"):
        f.fused(torch.randn(1, 64), norm=torch.ones(63))
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 15\]"):
        w4a8.pack(torch.full((2, 64), 16), torch.ones(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"scale must have shape \(2, 2\)"):
        w4a8.pack(torch.zeros(2, 64), torch.ones(2, 3), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="passes must be 1"):
        w4a8.w4a8_linear(passes=3)
    with pytest.raises(ValueError, match="passes must be 1"):
        w4a8.w4a8_mm(torch.randn(1, 64), w4a8.prepare(quantize(torch.randn(16, 64), "int4-g32")),
                      passes=0)
    for threads in (0, 65, 1.5, True):
        with pytest.raises(ValueError, match="threads must be an int in 1..64"):
            w4a8.w4a8_linear(threads=threads)
    with pytest.raises(ValueError, match="arch must be"):
        w4a8.build("native; rm -rf")
    assert w4a8.prepare(quantize(torch.randn(8, 128), "int4-g64")) is None
    assert w4a8.prepare(quantize(torch.randn(8, 128), "int8-channel")) is None


def test_no_compiler_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))           # no cc, gcc or clang
    with pytest.raises(RuntimeError, match="no C compiler found.*int4_linear"):
        w4a8.build(directory=tmp_path)
    monkeypatch.setenv("CC", "no-such-compiler")         # named, missing: no other taken
    monkeypatch.setenv("PATH", __import__("os").defpath)
    with pytest.raises(RuntimeError, match="CC is 'no-such-compiler', which is not a program"):
        w4a8.build(directory=tmp_path)


def test_a_build_error_shows_the_compilers_message(monkeypatch, tmp_path):
    bad = tmp_path / "w4a8.c"
    bad.write_text("this is not C\n")
    monkeypatch.setattr(w4a8_build, "SOURCE", bad)
    with pytest.raises(RuntimeError, match="could not compile"):
        w4a8.build("portable", tmp_path)
    assert not list(tmp_path.glob("*.so"))               # no half-written library left


def test_builds_are_cached_by_source_and_cpu(tmp_path):
    first = w4a8.build("portable", tmp_path)
    mtime = first.stat().st_mtime_ns
    assert w4a8.build("portable", tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert w4a8.cache_dir() != tmp_path


def test_swiglu_is_the_same_bits_on_every_build_and_close_to_exact(tmp_path_factory):
    """The gated product's silu(gate)·up (its own exp, not libm's): identical on the portable,
    AVX2 and native builds, and within 4e-7 relative (a few float roundings) of float64."""
    gate = torch.cat([torch.linspace(-120, 120, 4000), torch.randn(4000) * 4,
                      torch.tensor([0.0, -0.0, 1e-30, -1e-30, 87.0, -87.0, 88.5, -88.5])])
    gate = torch.cat([gate, torch.zeros(-len(gate) % 16)])   # the vector loop and the tail
    gate = torch.cat([gate, torch.tensor([0.5, -0.5, 3.0])])
    up = torch.rand(len(gate)) + 0.5
    outs = []
    for arch in ARCHES:
        lib = w4a8.load(w4a8.build(arch, tmp_path_factory.mktemp("swiglu")))
        out = torch.empty_like(gate)
        lib.w4a8_swiglu(gate.data_ptr(), up.data_ptr(), out.data_ptr(), len(gate))
        outs.append(out)
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    exact = (F.silu(gate.double()) * up.double())
    torch.testing.assert_close(outs[0].double(), exact, rtol=4e-7, atol=1e-30)
    nan = torch.tensor([float("nan")] * 16)
    out = torch.empty(16)
    lib.w4a8_swiglu(nan.data_ptr(), up.data_ptr(), out.data_ptr(), 16)
    assert out.isnan().all()


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork on this OS")
def test_a_forked_child_frees_its_copy_of_a_pool():
    """A process forked while a pool's workers sleep (a test runner, a DataLoader, multiprocessing's
    default on Linux) holds a copy of the pool whose workers do not exist; its garbage collector
    frees it. That must return (it used to wait for ever on the copied condition variable)."""
    import os
    import time
    pool = w4a8.ThreadPool(2)
    w4a8.w4a8_mm(torch.randn(1, 64), w4a8.prepare(quantize(torch.randn(8, 64), "int4-g32")),
                 threads=2)
    time.sleep(0.05)                              # the workers have spun and gone to sleep
    pid = os.fork()
    if pid == 0:                                  # the child: free the copy, then leave
        pool.close()
        os._exit(0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("a forked child hung freeing its copy of the parent's pool")
    pool.close()                                  # the parent's own pool still stops cleanly
