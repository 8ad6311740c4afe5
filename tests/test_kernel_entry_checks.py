"""The fp32 C kernels refuse what they were not built to read (issue 54, item 3): every Python
entry of a kernel checks dtype, device, contiguity and the ranges C takes as ``int`` and raises
a ``ValueError`` naming them, a closed thread pool is a ``RuntimeError``, NaN in is NaN out, and
a cached library cut short is refused before it is mapped.

Each case failed on the code before: a bf16 or fp16 weight was packed as floats (SIGSEGV), a
closed pool's handle stayed in the one-call step (a use after free), a NaN query or key gave
finite attention, a block id or length of 2**32 or more was cut to its low 32 bits, a truncated
build whose checksum matched was SIGBUS at load, K = 0 was a ``ZeroDivisionError``. What could
crash the interpreter on that code runs in a subprocess."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from llminfra.kernels import abi, build, cache, library
from llminfra.kernels.library import INT32, check_cpu, check_range

needs_lib = pytest.mark.skipif(not library.available(),
                               reason=f"the C library does not build here: "
                                      f"{library.unavailable_reason()}")


def run_python(code: str, timeout_s: float = 120, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter: a crash there is a return code here."""
    import os
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout_s,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})


def lines(r: subprocess.CompletedProcess) -> list[str]:
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    return r.stdout.strip().splitlines()


# ---------------------------------------------------------------- the checker itself
def test_the_checker_names_the_tensor_the_value_and_the_limit():
    cases = [
        (lambda: check_cpu("w", torch.empty(2, device="meta")), "w is on meta"),
        (lambda: check_cpu("w", torch.zeros(2).bfloat16(), torch.float32),
         "w must be torch.float32, got torch.bfloat16"),
        (lambda: check_cpu("t", torch.zeros(2, dtype=torch.int32), (torch.int64,)),
         "t must be torch.int64, got torch.int32"),
        (lambda: check_cpu("w", torch.zeros(4, 4).t(), contiguous=True), "w must be contiguous"),
        (lambda: check_range("ids", torch.tensor([3, 2 ** 32]), *INT32),
         "ids holds 4294967296, outside -2147483648 .. 2147483647"),
        (lambda: check_range("K", 0, 1, 9), "K holds 0, outside 1 .. 9"),
        (lambda: check_range("K", True, 1, 9), "K must be an int"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    check_range("empty", torch.empty(0, dtype=torch.int64), 0, 0)       # nothing to refuse
    check_cpu("x", torch.zeros(3), torch.float32, contiguous=True)


# ---------------------------------------------------------------- 1. 16-bit weights
@needs_lib
def test_a_16_bit_model_on_the_skinny_kernels_is_refused_by_dtype():
    """A bf16 model on the fast runner with the fp32 kernels, an fp16 weight, the packing
    itself: ``ValueError`` naming the dtype and float32 (it was SIGSEGV in f32_panel_pack).
    ``matmul='auto'`` puts a 16-bit model on F.linear instead of the fp32 kernels."""
    r = run_python("""
        import torch
        from llminfra.engine import LLMEngine
        from llminfra.kernels import f32_skinny
        from llminfra.model import ByteTokenizer, ModelConfig, Transformer
        from llminfra.runner import fast_runner
        from llminfra.runner.kernel_choice import engine_runner, skinny_kernels
        from llminfra.runner.matmul import SkinnyMatmul

        def refusal(call):
            try:
                call()
            except ValueError as e:
                return str(e).replace("\\n", " ")
            return "no error"
        config = ModelConfig(vocab_size=256, dim=64, n_layers=1, n_heads=2, n_kv_heads=1,
                             ffn_dim=128, max_seq_len=64)
        net = Transformer(config, torch.Generator().manual_seed(0)).eval().to(torch.bfloat16)
        print(refusal(lambda: LLMEngine(net, ByteTokenizer(),
                                        runner=fast_runner(kernels=skinny_kernels(1)))))
        k = f32_skinny.kernel(1)
        big = torch.empty(4096, 4096, dtype=torch.float16)   # read as floats: past its end
        print(refusal(lambda: SkinnyMatmul(big, kernel=k)))
        print(refusal(lambda: f32_skinny.pack_panels(k, torch.randn(40, 64).bfloat16())))
        _, runner = engine_runner(net, "a-real-model", matmul="auto")
        print(runner == "readable" or runner.keywords["kernels"] is None)
    """)
    engine, half, pack, auto = lines(r)
    for said, dtype in ((engine, "bfloat16"), (half, "float16"), (pack, "bfloat16")):
        assert f"take float32 weights, got torch.{dtype}" in said, said
    assert auto == "True"


# ---------------------------------------------------------------- 2. a closed pool
@needs_lib
def test_a_kernel_on_a_closed_pool_is_refused_not_run_on_freed_threads():
    """Close the pool, then call: each kernel on it (fp32 product, w4a8 product, attention,
    the one-call step, which copied the handle when it was built) is a ``RuntimeError``
    naming the closed pool, and nothing crashes."""
    r = run_python("""
        import torch
        from llminfra.engine import LLMEngine, SamplingParams
        from llminfra.kernels import paged_decode
        from llminfra.model import ByteTokenizer, ModelConfig, Transformer
        from llminfra.runner import fast_runner
        from llminfra.runner.kernel_choice import quantized_kernels, skinny_kernels

        config = ModelConfig(vocab_size=256, dim=64, n_layers=1, n_heads=2, n_kv_heads=1,
                             ffn_dim=128, max_seq_len=64)
        net = Transformer(config, torch.Generator().manual_seed(0)).eval()
        for kernels in (skinny_kernels(2), quantized_kernels("w4a8", 2)):
            engine = LLMEngine(net, ByteTokenizer(), block_size=8,
                               runner=fast_runner(kernels=kernels))
            stack, seen = engine.runner.stack, []
            def spy(*inputs, logits_rows=None):
                seen.append([t.clone() for t in inputs])
                return stack(*inputs, logits_rows=logits_rows)
            spy.max_batch = stack.max_batch
            engine.runner.stack = spy
            engine.generate([[1, 2, 3]], SamplingParams(max_tokens=3, ignore_eos=True))
            m = engine.runner.weights.layers[0].wo
            kernels.attention.owner.close()
            calls = {"matmul": lambda: m(torch.randn(1, 64)),
                     "attention": lambda: paged_decode.c_attend(
                         kernels.attention, torch.tensor([[0]]), torch.tensor([1]),
                         torch.zeros(2, 8, 1, 32), (2, 1, 32), 64),
                     "stack": lambda: stack(*seen[-1])}
            for name, call in calls.items():
                try:
                    call()
                    print(kernels.name, name, "ran")
                except RuntimeError as e:
                    print(kernels.name, name, "closed" in str(e) and "ThreadPool" in str(e))
    """)
    got = lines(r)
    assert got == [f"{k} {c} True" for k in ("skinny", "w4a8")
                   for c in ("matmul", "attention", "stack")], got


# ---------------------------------------------------------------- 3. NaN in, NaN out
def _reference(q, K, V, tables, lens):
    """torch's SDPA over each sequence's keys gathered in order."""
    n, H, d = q.shape
    B, H_kv = K.shape[1], K.shape[2]
    out = torch.empty(n, H, d)
    for s in range(n):
        t = torch.arange(int(lens[s]))
        k, v = (P[tables[s, t // B], t % B].transpose(0, 1) for P in (K, V))   # (H_kv, L, d)
        out[s] = F.scaled_dot_product_attention(q[s][:, None], k, v, enable_gqa=True)[:, 0]
    return out


@needs_lib
@pytest.mark.parametrize("where", ["q", "key mid-tile", "key lane 0", "value"])
def test_nan_in_the_paged_attention_is_nan_out_like_torch(where):
    """A NaN in a query head, in one key (mid-tile, and the first lane of the first tile: the
    running max started from it) or in one value: NaN in exactly the heads torch's SDPA gives
    NaN, the others equal to it (the max and exp of the online softmax dropped a NaN)."""
    from llminfra.kernels.paged_decode import paged_attention_c
    g = torch.Generator().manual_seed(5)
    n, H, H_kv, d, B = 3, 6, 2, 64, 16
    q = torch.randn(n, H, d, generator=g)
    K, V = torch.randn(2, 7, B, H_kv, d, generator=g)
    tables, lens = torch.tensor([[0, 1, 2], [3, 4, 6], [5, 6, 6]]), torch.tensor([40, 17, 9])
    if where == "q":
        q[1, 4, 7] = float("nan")
    elif where == "key mid-tile":
        K[1, 5, 0, 3] = float("nan")                  # sequence 0's key 21, K/V head 0
    elif where == "key lane 0":
        K[3, 0, 1, :] = float("nan")                  # sequence 1's key 0, K/V head 1
    else:
        V[5, 8, 1, 0] = float("nan")                  # sequence 2's key 8, K/V head 1
    want = _reference(q, K, V, tables, lens)
    got = paged_attention_c(q, K, V, tables, lens, threads=1)
    nan = want.isnan()
    assert nan.any(-1).sum() == (1 if where == "q" else 3)        # the heads that see it
    assert torch.equal(got.isnan(), nan)
    torch.testing.assert_close(got[~nan], want[~nan], rtol=1e-4, atol=1e-5)


@needs_lib
@pytest.mark.parametrize("M", [1, 2, 5])
def test_nan_through_the_fp32_products_is_nan_out(M):
    """The fp32 products (``f32_skinny.c`` for 1-2 rows, ``f32_panels.c`` for more), plain,
    with the norm formed in the call and gated: a NaN in a row of x is NaN in that row's
    outputs only, a NaN in a row of W in that output column only, as torch's product."""
    from llminfra.kernels import f32_skinny
    from llminfra.runner.matmul import SkinnyMatmul
    g = torch.Generator().manual_seed(M)
    W, x = torch.randn(40, 64, generator=g), torch.randn(M, 64, generator=g)
    x[0, 3] = float("nan")
    m = SkinnyMatmul(W, kernel=f32_skinny.kernel(1))
    assert torch.equal(m(x).isnan(), (x @ W.t()).isnan())
    for y in (m.fused(x, norm=torch.ones(64)), m.fused(torch.cat([x, x], -1), gated=True)):
        assert y[0].isnan().all() and not y[1:].isnan().any()
    W[7, 5] = float("nan")
    y = SkinnyMatmul(W, kernel=f32_skinny.kernel(1))(torch.randn(M, 64, generator=g))
    assert y.isnan().nonzero()[:, 1].unique().tolist() == [7]


# ---------------------------------------------------------------- 4. ids past int32
@needs_lib
def test_block_ids_and_lengths_past_int32_are_refused_not_truncated():
    """2**32 + 1 became block 1 and a length of 2**32 + 9 became 9: now a ``ValueError``
    naming the value and the limit, at the checked entry and at the runner's."""
    from llminfra.kernels.paged_decode import c_attend, kernel, paged_attention_c
    q, K = torch.randn(1, 2, 16), torch.randn(3, 8, 1, 16)
    ok_tables, ok_lens = torch.tensor([[0, 1]]), torch.tensor([9])
    k = kernel(threads=1)
    for tables, lens, value in ((ok_tables + 2 ** 32, ok_lens, 2 ** 32 + 1),
                                (ok_tables, ok_lens + 2 ** 32, 2 ** 32 + 9),
                                (ok_tables - 2 ** 33, ok_lens, -2 ** 33)):
        for call in (lambda: paged_attention_c(q, K, K, tables, lens),
                     lambda: c_attend(k, tables, lens, K, (2, 1, 16), 32)):
            with pytest.raises(ValueError, match=f"holds {value}, outside -2147483648 .. "
                                                 f"2147483647"):
                call()
    paged_attention_c(q, K, K, ok_tables, ok_lens)                    # within: it runs


# ---------------------------------------------------------------- 5. the cached library
@needs_lib
@pytest.mark.parametrize("keep", [0.5, 0.9, 0.99])
def test_a_truncated_build_with_a_matching_checksum_is_refused_not_sigbus(tmp_path, keep):
    """A cached build cut short, its checksum written to match (the checksum says a file is
    the one written, not that it is whole): refused before it is mapped, in a fresh
    interpreter as ``library()`` would load it (it was SIGBUS, exit -7), and not reported as
    a good build by ``cached``."""
    good = library.library().path
    path = tmp_path / good.name
    data = good.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    cache.checksum_path(path).write_text(cache.sha256(path) + "\n")
    assert "cut short" in cache.cached_build_problem(path)
    r = run_python(f"""
        from llminfra.kernels import abi
        try:
            abi.load({str(path)!r})
            print("loaded")
        except RuntimeError as e:
            print(e)
    """)
    said = lines(r)[0]
    assert "not loading" in said and "cut short" in said and "past its" in said, said
    assert cache.file_problem(good) is None                   # the whole file passes


@pytest.mark.skipif(shutil.which("cc") is None, reason="no cc to build a stand-in library")
def test_a_library_lacking_any_symbol_of_the_header_is_refused(tmp_path):
    """Every function of the header's API is checked at load, not only the int4 ones: a
    library with all of them but ``paged_decode_f32`` is refused naming it."""
    body = "\n".join(f"int {name}(void) {{ return 0; }}" for name in abi.SYMBOLS
                     if name != "paged_decode_f32")
    (tmp_path / "stub.c").write_text(body + "\n")
    path = tmp_path / "libstub.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(tmp_path / "stub.c"), "-o", str(path)],
                   check=True, capture_output=True, timeout=60)
    path.write_bytes(path.read_bytes() + b"\0" * cache.MIN_LIBRARY_BYTES)   # not "too small"
    cache.checksum_path(path).write_text(cache.sha256(path) + "\n")
    with pytest.raises(RuntimeError, match=r"lacks paged_decode_f32$"):
        abi.load(path)


# ---------------------------------------------------------------- 6. K = 0, d = 0
@needs_lib
def test_an_empty_input_width_is_a_value_error_naming_it():
    """K = 0 (a weight of no columns) and a head dim of 0 were ``ZeroDivisionError``."""
    from llminfra.kernels import f32_skinny
    from llminfra.kernels.paged_decode import paged_attention_c
    from llminfra.runner.matmul import SkinnyMatmul
    k = f32_skinny.kernel(1)
    for call in (lambda: SkinnyMatmul(torch.randn(3, 0), kernel=k),
                 lambda: f32_skinny.f32_mm(torch.randn(2, 0), torch.randn(3, 0))):
        with pytest.raises(ValueError, match=r"K \(the weight's input width\) holds 0, "
                                             r"outside 1 \.\."):
            call()
    with pytest.raises(ValueError, match=r"d \(the head dim\) holds 0"):
        paged_attention_c(torch.randn(1, 2, 0), torch.zeros(2, 4, 1, 0), torch.zeros(2, 4, 1, 0),
                          torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long))


# ---------------------------------------------------------------- 7. every entry
@needs_lib
def test_the_one_call_step_and_the_rope_write_check_their_integer_inputs():
    """C reads tokens, positions, slots and block tables as int64 rows: an int32 or a
    non-contiguous one is refused by name (C used to read 8 bytes of each 4)."""
    from llminfra.engine import LLMEngine, SamplingParams
    from llminfra.model import ByteTokenizer, ModelConfig, Transformer
    from llminfra.runner import fast_runner
    from llminfra.runner.fast_step import c_place
    from llminfra.runner.kernel_choice import skinny_kernels
    config = ModelConfig(vocab_size=256, dim=64, n_layers=1, n_heads=2, n_kv_heads=1,
                         ffn_dim=128, max_seq_len=64)
    net = Transformer(config, torch.Generator().manual_seed(0)).eval()
    kernels = skinny_kernels(1)
    engine = LLMEngine(net, ByteTokenizer(), block_size=8, runner=fast_runner(kernels=kernels))
    stack = engine.runner.stack
    t, p, s, bt = (torch.tensor([1, 2]), torch.tensor([0, 0]), torch.tensor([0, 8]),
                   torch.tensor([[0], [1]]))
    assert stack(t, p, s, bt).shape == (2, 256)
    cases = [((t.int(), p, s, bt), "tokens must be torch.int64, got torch.int32"),
             ((t, p.int(), s, bt), "positions must be torch.int64"),
             ((t, p, s, bt.t().contiguous().t()[:, :1].repeat(1, 2)[:, ::2]),
              "block_tables must be contiguous"),
             ((t, p, s[:1], bt), r"need tokens, positions, slots \(n,\)"),
             ((t, p, s, bt.to("meta")), "block_tables is on meta")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            stack(*args)
    fn, w = kernels.attention.rope_write, engine.runner.weights
    with pytest.raises(ValueError, match="slots must be torch.int64"):
        c_place(fn, w, p, s.int(), 16)
    place = c_place(fn, w, p, s, 16)
    pool = engine.runner.pools[0]
    with pytest.raises(ValueError, match="rope_write_f32 reads 2 float32 CPU rows"):
        place(torch.zeros(2, 128, dtype=torch.float64), pool)


@needs_lib
def test_the_products_refuse_by_name_what_c_would_read_raw():
    """The packing of panels (a non-contiguous or 16-bit weight, panels of the wrong size), a
    w4a8 product's norm on another device (its NULL pointer meant "no norm"), an fp32
    product's bf16 weight: each a ``ValueError`` naming the tensor."""
    from llminfra.kernels import f32_skinny, w4a8
    k = f32_skinny.kernel(1)
    W = torch.randn(40, 64)
    f = w4a8.w4a8_linear(threads=1)(W)
    cases = [(lambda: f32_skinny.pack_panels(k, W.t().contiguous().t()), "must be contiguous"),
             (lambda: f32_skinny.pack_panels(k, W, torch.empty(10)), "panels must hold 3072"),
             (lambda: f.fused(torch.randn(1, 64), norm=torch.ones(64, device="meta")),
              "norm is on meta"),
             (lambda: f32_skinny.f32_mm(torch.randn(1, 64), W.bfloat16()),
              "weight must be torch.float32, got torch.bfloat16")]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    panels = f32_skinny.pack_panels(k, W)
    assert panels.numel() == 48 * 64                         # ceil(40 / 16) panels of 16
