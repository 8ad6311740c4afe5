"""The attention bench: peak memory is measured (validated on known allocations), rows carry the
keys the issue asks for, and the table prints them."""

import pytest
import torch

from llminfra.bench import attention as bench


def test_peak_bytes_measures_known_allocations():
    """4 MB, then 2 MB, free the 4 MB, then 12 MB: the high-water mark is 2 + 12 = 14 MB
    (plus a few bytes for the returned sum)."""
    def f():
        a = torch.empty(1_000_000)   # 4 MB
        b = torch.empty(500_000)     # 2 MB
        del a
        c = torch.empty(3_000_000)   # 12 MB
        return b.sum() + c.sum()
    peak = bench.peak_bytes(f)
    assert 14_000_000 <= peak < 14_001_000


def test_peak_bytes_naive_is_quadratic(gen):
    """Naive attention holds N x N fp32 scores: at N = 256 at least 256² · 4 = 262,144 bytes;
    tiled attention (blocks 64 x 64) far less."""
    q, k, v = (torch.randn(1, 1, 256, 16, generator=gen) for _ in range(3))
    from llminfra.attention import flash_attention, naive_attention
    naive = bench.peak_bytes(lambda: naive_attention(q, k, v))
    tiled = bench.peak_bytes(lambda: flash_attention(q, k, v, block_q=64, block_k=64))
    assert naive >= 256 * 256 * 4
    assert tiled < naive / 4


def test_rows_and_table():
    rows = [bench.measure_row(N, c, d=16, repeats=1, block_q=64, block_k=32)
            for N in (64, 128) for c in (False, True)]
    keys = {"N", "causal", "naive_s", "flash_s", "sdpa_s", "naive_peak_bytes",
            "flash_peak_bytes", "sdpa_peak_bytes"}
    for r in rows:
        assert keys <= r.keys()
        assert all(r[f"{m}_s"] > 0 and r[f"{m}_peak_bytes"] > 0 for m in bench.METHODS)
    result = {"dtype": "float32", "rows": rows, "criteria": bench.criteria(rows),
              "environment": {"torch_threads": 1}}
    table = bench.format_table(result)
    assert "128" in table and "flash/naive peak" in table
    assert result["criteria"]["N"] == 128


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_run_gpu_fails_loudly_without_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        bench.run_gpu()


def test_gpu_table_and_tflops():
    """4·B·H·N²·d FLOPs: B=1, H=1, N=1024, d=64 non-causal in 1 ms → 0.2684 TFLOP/s; causal half."""
    from llminfra.attention.flash_triton import attention_tflops
    assert abs(attention_tflops(1, 1, 1024, 1024, 64, False, 1e-3) - 0.268435456) < 1e-9
    assert abs(attention_tflops(1, 1, 1024, 1024, 64, True, 1e-3) - 0.134217728) < 1e-9
    row = {"N": 1024, "d": 64, "causal": False, "triton_tflops": 101.25, "sdpa_tflops": 99.0}
    assert "101.2" in bench.format_gpu_table({"rows": [row]})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (not counted as a pass)")
def test_run_gpu_on_gpu():
    result = bench.run_gpu()
    assert result["rows"] and all(r["triton_tflops"] > 0 for r in result["rows"])
