"""Online softmax and IO accounting (Theorem 2 of Dao et al. 2022, arXiv:2205.14135)."""

import math

import pytest
import torch

from llminfra.attention import (IOCounter, flash_attention, flash_block_sizes, measure_io,
                                merge_stats, naive_attention, online_softmax,
                                online_softmax_stats, safe_softmax)
from llminfra.attention.io_accounting import theorem2_flash_elements


@pytest.mark.parametrize("block", [1, 3, 8, 1000])
def test_online_softmax_equals_safe_softmax(gen, block):
    x = torch.randn(5, 7, 29, generator=gen, dtype=torch.float64) * 30
    torch.testing.assert_close(online_softmax(x, block), safe_softmax(x))
    torch.testing.assert_close(safe_softmax(x), torch.softmax(x, -1))
    m, l = online_softmax_stats(x, block)
    torch.testing.assert_close(m, x.amax(-1, keepdim=True))
    torch.testing.assert_close(l, torch.exp(x - m).sum(-1, keepdim=True))


def test_softmax_worked_example_and_masked_rows():
    """[1, 2, 3] → [0.0900, 0.2447, 0.6652]; a row of -inf → zeros; 1e4 does not overflow."""
    x = torch.tensor([[1.0, 2.0, 3.0], [float("-inf")] * 3, [1e4, 1e4, -1e4]])
    want = torch.tensor([[0.0900, 0.2447, 0.6652], [0.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    for f in (safe_softmax, online_softmax):
        torch.testing.assert_close(f(x), want, atol=1e-4, rtol=0)


def test_merge_stats_example_and_identity():
    """(1, 1) merged with (3, 1) → (3, 1 + e^-2); merging with the empty pair (-inf, 0) is a no-op."""
    m, l = merge_stats(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(3.0), torch.tensor(1.0))
    assert m.item() == 3.0 and math.isclose(l.item(), 1 + math.exp(-2), rel_tol=1e-6)
    e_m, e_l = torch.tensor(float("-inf")), torch.tensor(0.0)
    m2, l2 = merge_stats(m, l, e_m, e_l)
    assert m2.item() == m.item() and l2.item() == l.item()
    m3, l3 = merge_stats(e_m, e_l, e_m, e_l)
    assert m3.item() == float("-inf") and l3.item() == 0.0


def test_block_sizes_line_1():
    """d = 64, M = 16384: Bc = ceil(16384 / 256) = 64, Br = min(64, 64) = 64;
    d = 32, M = 32768: Bc = 256, Br = 32."""
    assert flash_block_sizes(64, 16384) == (64, 64)
    assert flash_block_sizes(32, 32768) == (32, 256)
    with pytest.raises(ValueError, match="M >= d"):
        flash_block_sizes(64, 10)


def test_naive_io_exact_count(gen):
    """Algorithm 0, fp32, non-causal: read Q, K (2Nd), write S (N²), read S (N²), write P (N²),
    read P and V (N² + Nd), write O (Nd): 4 bytes × (4Nd + 4N²). N = 100, d = 16 → 185,600."""
    q, k, v = (torch.randn(1, 1, 100, 16, generator=gen) for _ in range(3))
    io = IOCounter()
    naive_attention(q, k, v, io=io)
    assert io.total_bytes == 4 * (4 * 100 * 16 + 4 * 100 * 100) == 185_600


def test_flash_io_exact_count(gen):
    """Algorithm 1, fp32, N = 96, d = 8, Br = 8, Bc = 32 (Tc = 3 key blocks):
    K, V once (2Nd) + per key block, every query block loads Q_i, O_i, l_i, m_i and stores
    O_i, l_i, m_i: Tc · (3Nd + 4N) → 4 bytes × (1536 + 3 · (2304 + 384)) = 38,400."""
    q, k, v = (torch.randn(1, 1, 96, 8, generator=gen) for _ in range(3))
    io = IOCounter()
    flash_attention(q, k, v, block_q=8, block_k=32, io=io)
    assert io.total_bytes == 4 * (2 * 96 * 8 + 3 * (3 * 96 * 8 + 4 * 96)) == 38_400


def test_theorem2_shapes(gen):
    """Naive bytes grow ~4x when N doubles; flash bytes shrink ~k-fold when M grows k-fold, and
    their ratio to N²d²/M stays bounded (it tends to 12 for Algorithm 1)."""
    rows = {(r["N"], r["sram_elements"]): r
            for r in [measure_io(N, 16, M, generator=gen) for N in (128, 256) for M in (512, 4096)]}
    assert 3.5 < rows[256, 512]["naive_bytes"] / rows[128, 512]["naive_bytes"] < 4.1
    assert rows[256, 4096]["flash_bytes"] < rows[256, 512]["flash_bytes"] / 4
    for r in rows.values():
        assert 10 < r["flash_ratio"] < 25 and 3.5 < r["naive_ratio"] <= 4.0
    # tiling pays only when the fast memory is large next to d²: M = 4096 = 16 d² wins,
    # M = 512 = 2 d² moves more bytes than the naive version
    assert rows[256, 4096]["flash_bytes"] < rows[256, 4096]["naive_bytes"] / 3
    assert rows[256, 512]["flash_bytes"] > rows[256, 512]["naive_bytes"]
    assert math.isclose(theorem2_flash_elements(256, 16, 512), 256 * 256 * 256 / 512)


def test_attention_tflops_counts_visible_pairs():
    """Causal pairs T·(S − T) + T²/2: T = S = 4 → 8 (half of 16, the FlashAttention-2
    convention); T = 2 of S = 6 (decode-like) → 8 + 2 = 10, not half of 12.
    FLOPs = 4·B·H·d·pairs; over 1 s at d = 1, B = H = 1 that is pairs·4e-12 TFLOP/s."""
    from llminfra.attention.flash_triton import attention_tflops

    assert attention_tflops(1, 1, 4, 4, 1, True, 1.0) == pytest.approx(32e-12)
    assert attention_tflops(1, 1, 2, 6, 1, True, 1.0) == pytest.approx(40e-12)
    assert attention_tflops(1, 1, 2, 6, 1, False, 1.0) == pytest.approx(48e-12)
