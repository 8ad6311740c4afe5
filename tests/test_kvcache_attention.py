"""Paged attention == contiguous attention (PyTorch gather and the Triton kernel under the
interpreter), on awkward shapes and block tables scattered at random."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from llminfra.kvcache import contiguous_decode_attention, gather_kv, paged_attention


def _scatter(k_dense, context_lens, block_size, gen, extra_blocks=3):
    """Store padded dense K (N, H_kv, S, d) into a pool at random block ids; return pool, tables."""
    N, H_kv, S, d = k_dense.shape
    per_seq = -(-S // block_size)
    num_blocks = N * per_seq + extra_blocks
    perm = torch.randperm(num_blocks, generator=gen)[:N * per_seq].view(N, per_seq)
    pool = torch.randn(num_blocks, block_size, H_kv, d, generator=gen)   # garbage elsewhere
    for n in range(N):
        for j in range(per_seq):
            chunk = k_dense[n, :, j * block_size:(j + 1) * block_size].transpose(0, 1)
            pool[perm[n, j], :chunk.shape[0]] = chunk
    return pool, perm


@pytest.mark.parametrize("N,H,H_kv,d,block_size", [(1, 1, 1, 1, 1), (3, 6, 2, 24, 4),
                                                   (5, 8, 8, 17, 16), (2, 12, 4, 64, 7)])
def test_paged_equals_contiguous(gen, N, H, H_kv, d, block_size):
    S = 3 * block_size + 5
    q = torch.randn(N, H, d, generator=gen)
    k = torch.randn(N, H_kv, S, d, generator=gen)
    v = torch.randn(N, H_kv, S, d, generator=gen)
    ctx = torch.randint(1, S + 1, (N,), generator=gen)
    ctx[0] = S
    k_pool, table = _scatter(k, ctx, block_size, gen)
    v_pool = torch.randn_like(k_pool)
    for n in range(N):                         # same block ids for V
        for j in range(table.shape[1]):
            chunk = v[n, :, j * block_size:(j + 1) * block_size].transpose(0, 1)
            v_pool[table[n, j], :chunk.shape[0]] = chunk
    expected = contiguous_decode_attention(q, k, v, ctx)
    torch.testing.assert_close(paged_attention(q, k_pool, v_pool, table, ctx), expected)
    torch.testing.assert_close(gather_kv(k_pool, table[0].tolist(), S), k[0])


def test_paged_attention_rejects_bad_shapes(gen):
    q = torch.randn(2, 3, 8, generator=gen)
    pool = torch.randn(4, 4, 2, 8, generator=gen)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        paged_attention(q, pool, pool, torch.zeros(2, 2, dtype=torch.long), torch.tensor([1, 1]))
    q = torch.randn(2, 4, 8, generator=gen)
    with pytest.raises(ValueError, match="context_lens"):
        paged_attention(q, pool, pool, torch.zeros(2, 2, dtype=torch.long), torch.tensor([1, 9]))


@pytest.mark.parametrize("q_shape,k_shape", [((2, 6, 8), (2, 4, 5, 8)),    # 6 % 4 != 0
                                              ((2, 4, 8), (3, 2, 5, 8)),    # N differs
                                              ((2, 4, 8), (2, 2, 5, 7))])   # d differs
def test_contiguous_reference_rejects_bad_shapes(gen, q_shape, k_shape):
    """The reference names the mismatch instead of failing deep inside einsum."""
    q, k = torch.randn(q_shape, generator=gen), torch.randn(k_shape, generator=gen)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        contiguous_decode_attention(q, k, k, torch.tensor([3, 5]))


TRITON_SCRIPT = textwrap.dedent("""
    import torch
    from llminfra.kvcache import paged_attention, paged_attention_triton
    g = torch.Generator().manual_seed(int(__import__('sys').argv[1]))
    for N, H, H_kv, d, B in [(3, 6, 2, 24, 8), (2, 4, 4, 16, 1), (4, 8, 2, 33, 16)]:
        nb = N * 6 + 2
        q = torch.randn(N, H, d, generator=g)
        k = torch.randn(nb, B, H_kv, d, generator=g)
        v = torch.randn(nb, B, H_kv, d, generator=g)
        bt = torch.randperm(nb, generator=g)[:N * 6].view(N, 6)
        ctx = torch.randint(1, 6 * B + 1, (N,), generator=g)
        torch.testing.assert_close(paged_attention_triton(q, k, v, bt, ctx),
                                   paged_attention(q, k, v, bt, ctx), atol=1e-5, rtol=1e-5)
    try:
        paged_attention_triton(q, k[:, :3], v[:, :3], bt, torch.ones(N, dtype=torch.long))
    except ValueError as e:
        assert "power of two" in str(e)
    else:
        raise AssertionError("block size 3 accepted")
    print("TRITON-OK")
""")


@pytest.mark.slow
def test_triton_kernel_under_interpreter(gen):
    """The real @triton.jit kernel, run on CPU tensors by Triton's interpreter in a subprocess
    (TRITON_INTERPRET must be set before triton is imported)."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    seed = str(int(torch.randint(0, 2**31, (1,), generator=gen)))
    out = subprocess.run([sys.executable, "-c", TRITON_SCRIPT, seed], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TRITON-OK" in out.stdout


BENCH_SCRIPT = textwrap.dedent("""
    import torch
    from llminfra.bench.kvcache import compare_kernels
    r = compare_kernels("cpu", cases=((3, 4, 2, 24, 8, 37), (2, 2, 2, 16, 16, 5)),
                        dtype=torch.float32, repeats=1)
    assert r["max_abs_error"] < 1e-4, r
    assert len(r["cases"]) == 2 and all(c["triton_s"] > 0 for c in r["cases"])
    print("BENCH-OK")
""")


@pytest.mark.slow
def test_bench_kernel_comparison_under_interpreter():
    """The code path of ``bench gpu``'s kvcache check, run on the CPU by the interpreter."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", BENCH_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "BENCH-OK" in out.stdout


def test_run_gpu_fails_loudly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: test_triton_kernel_on_cuda runs instead")
    from llminfra.bench.kvcache import run_gpu
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        run_gpu()


def test_triton_kernel_refuses_cpu_without_interpreter(gen):
    pytest.importorskip("triton")
    from llminfra.kvcache import paged_attention_triton
    q = torch.randn(1, 2, 8, generator=gen)
    pool = torch.randn(2, 4, 2, 8, generator=gen)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        paged_attention_triton(q, pool, pool, torch.zeros(1, 1, dtype=torch.long),
                               torch.tensor([1]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_kernel_on_cuda():
    from llminfra.bench.kvcache import run_gpu
    result = run_gpu()
    assert result["max_abs_error"] < 1e-2
