"""A CPU's compute roof, measured with the kernels that reach it.

A roofline's flat roof is the fastest a product can run. Measured with one kernel it is that
kernel's speed, and a faster kernel then runs "above the roof": on the course's 2-core AMD EPYC
torch's fp32 matmul (MKL, which takes a slower path on AMD's CPUs) stays well under the
package's own panel kernel (both are in the recorded ``bench roofline`` run,
``llminfra/data/bench_roofline_cpu.json``, ``compute_roof_by_threads``). So the roof is the
faster of the two, each measured on the same threads (:func:`measure_compute_roof`). Above
both is the cores' FMA peak, ``cores × GHz × FMA units × lanes × 2``, which needs the clock
the cores really run at (a virtual machine reports its nominal one). Chapter 08.
"""

from __future__ import annotations

import torch

from llminfra.bench.timing import best_time_s
from llminfra.kernels.f32_skinny import kernel
from llminfra.runner.fused import SkinnyMatmul


def measure_matmul_flops_per_s(n: int = 1024, dtype: torch.dtype = torch.float32,
                               repeats: int = 5) -> float:
    """``2 · n³ / t`` of an ``n × n`` matmul in ``dtype`` (best of ``repeats``)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    return 2 * n**3 / best_time_s(lambda: a @ b, repeats=repeats)


#: timed runs of the panel kernel's product, at least (the best counts)
PANEL_REPEATS = 40
#: the panel kernel's product for the compute roof: M rows (a prompt chunk) · W (N, K), 16 MB
PANEL_SHAPE = (256, 2048, 2048)


def measure_panel_flops_per_s(shape: tuple[int, int, int] = PANEL_SHAPE,
                              repeats: int = 5) -> float | None:
    """``2 · M · N · K / t`` of ``x (M, K) · Wᵀ`` on the package's C panel kernel
    (``llminfra/kernels/csrc/f32_panels.c`` through :class:`llminfra.runner.fused.SkinnyMatmul`,
    on torch's thread count), checked against ``x @ W.T`` first; ``None`` where the kernels
    cannot be built (no C compiler: the roof is then torch's matmul alone)."""
    M, N, K = shape
    try:
        k = kernel(torch.get_num_threads())
    except (RuntimeError, OSError):
        return None
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(N, K, generator=g), torch.randn(M, K, generator=g)
    mm = SkinnyMatmul(w, kernel=k)
    torch.testing.assert_close(mm(x), x @ w.T, rtol=1e-4, atol=1e-3)
    return 2 * M * N * K / best_time_s(lambda: mm(x), repeats=repeats)


def measure_compute_roof(n: int = 1024, repeats: int = 5) -> dict:
    """fp32 FLOP/s of torch's ``n × n`` matmul and of the C panel kernel on torch's thread
    count: ``{"torch_matmul": ..., "f32_panels": ... or None, "kernel": the faster,
    "flops_per_s": its rate}`` (the compute roof, see the module docstring)."""
    rates = {"torch_matmul": measure_matmul_flops_per_s(n, torch.float32, repeats),
             # a product of a few ms: the best of many finds a slice of a shared machine's
             # time when no other process holds a core
             "f32_panels": measure_panel_flops_per_s(repeats=max(repeats, PANEL_REPEATS))}
    best = max((k for k, v in rates.items() if v is not None), key=rates.get)
    return {**rates, "kernel": best, "flops_per_s": rates[best]}
