"""``python -m llminfra bench attention``: time and MEASURED peak memory of naive, tiled and SDPA.

For N = 512 … 8192 (``--quick``: 256 … 1024), fp32, d = 64, one sequence and one head, causal
and not, on the CPU: :func:`~llminfra.attention.naive_attention` (T x S scores materialised),
:func:`~llminfra.attention.flash_attention` (tiled, Dao et al. 2022, arXiv:2205.14135) and
``torch.nn.functional.scaled_dot_product_attention``. The three methods are interleaved inside
each repeat and the best time of several is kept. Peak memory is measured, not computed: every
allocation and free the CPU allocator makes during one call is recorded by ``torch.profiler``
(``profile_memory=True``) and the peak of their running sum is reported (:func:`peak_bytes`).

``run_gpu()`` (called by ``python -m llminfra bench gpu``) checks the Triton kernel against
float64 attention and SDPA, then times both in bf16 for N = 1k … 16k, d = 64 / 128, in TFLOP/s.
Chapter 06 shows these numbers.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from llminfra.attention import flash_attention, flash_attention_triton, naive_attention
from llminfra.attention.flash_triton import attention_tflops
from llminfra.bench.timing import best_time_s, environment
from llminfra.attention.flash_tuning import chosen_tile

METHODS = ("naive", "flash", "sdpa")
FULL_N = (512, 1024, 2048, 4096, 8192)
QUICK_N = (256, 512, 1024)


@contextlib.contextmanager
def _quiet_stderr_fd():
    """Send file descriptor 2 to /dev/null for a moment: the profiler's C++ side prints
    start/stop lines there, which a Jupyter kernel would show as stderr."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_bytes(fn: Callable[[], object]) -> int:
    """Measured peak of extra CPU memory held during ``fn()``, in bytes (the result included).

    Runs ``fn`` once under ``torch.profiler`` with ``profile_memory=True``, takes its allocator
    events (+bytes on allocation, -bytes on free) in time order and returns the largest running
    sum: the high-water mark above what was allocated before the call. Validated in
    ``tests/test_bench_attention.py`` on allocations of known size.
    """
    with _quiet_stderr_fd():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
        del out
    try:
        raw = prof.profiler.kineto_results.events()
    except AttributeError as e:  # the profiler's internals moved: say so rather than guess
        raise RuntimeError(f"peak_bytes: this torch ({torch.__version__}) does not expose the "
                           "profiler's memory events (kineto_results)") from e
    events = sorted((e.start_ns(), e.nbytes()) for e in raw if e.name() == "[memory]")
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


def _inputs(N: int, d: int, heads: int, generator: torch.Generator):
    return tuple(torch.randn(1, heads, N, d, generator=generator) for _ in range(3))


def _methods(q, k, v, causal: bool, block_q: int, block_k: int) -> dict:
    return {
        "naive": lambda: naive_attention(q, k, v, causal),
        "flash": lambda: flash_attention(q, k, v, causal, block_q=block_q, block_k=block_k),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
    }


def _interleaved_best(fns: dict, repeats: int) -> dict:
    """Best wall time of each function, the functions taking turns inside every repeat."""
    best = {name: float("inf") for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def measure_row(N: int, causal: bool, d: int = 64, heads: int = 1, block_q: int = 512,
                block_k: int = 256, repeats: int = 3,
                generator: torch.Generator | None = None) -> dict:
    """One bench row: check the three agree, then best time and measured peak bytes of each."""
    generator = generator or torch.Generator().manual_seed(N)
    q, k, v = _inputs(N, d, heads, generator)
    fns = _methods(q, k, v, causal, block_q, block_k)
    ref = fns["sdpa"]()
    for name in ("naive", "flash"):
        err = float((fns[name]() - ref).abs().max())
        if err > 1e-4:
            raise AssertionError(f"{name} differs from SDPA by {err:.3g} at N={N}, causal={causal}")
    times = _interleaved_best(fns, repeats)
    row = {"N": N, "causal": causal, "d": d, "heads": heads, "block_q": block_q,
           "block_k": block_k}
    for name in METHODS:
        row[f"{name}_s"] = times[name]
        row[f"{name}_peak_bytes"] = peak_bytes(fns[name])
    return row


def run(quick: bool = False, threads: int = 1) -> dict:
    """The CPU table: one row per N and causal flag (keys ``N``, ``causal``, ``naive_s``,
    ``flash_s``, ``sdpa_s``, ``naive_peak_bytes``, ``flash_peak_bytes``, ``sdpa_peak_bytes``).

    ``threads`` torch threads (restored afterwards): one by default, because on a shared
    2-core machine the many small tile operations of the tiled version suffer most from
    threads waiting on each other.
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = [measure_row(N, causal, repeats=2 if quick else 3)
                for N in (QUICK_N if quick else FULL_N) for causal in (False, True)]
        env = environment()
    finally:
        torch.set_num_threads(saved)
    return {"suite": "attention", "quick": quick, "dtype": "float32", "rows": rows,
            "criteria": criteria(rows), "environment": env}


def criteria(rows: list[dict]) -> dict:
    """Ratios at the largest N, side by side from one run, against the course's targets for the
    tiled version: peak ≤ naive/50, time ≤ 0.8× naive and ≤ 2× SDPA (non-causal), causal tiled
    ≤ 0.5× causal naive (what chapter 06 claims of it on a CPU)."""
    N = max(r["N"] for r in rows)
    nc = next(r for r in rows if r["N"] == N and not r["causal"])
    c = next(r for r in rows if r["N"] == N and r["causal"])
    return {"N": N,
            "flash_peak_over_naive": nc["flash_peak_bytes"] / nc["naive_peak_bytes"],
            "flash_time_over_naive": nc["flash_s"] / nc["naive_s"],
            "flash_time_over_sdpa": nc["flash_s"] / nc["sdpa_s"],
            "causal_flash_time_over_naive": c["flash_s"] / c["naive_s"]}


def format_table(result: dict) -> str:
    """The rows as a plain-text table (times in s, peak memory in MB = 1e6 bytes)."""
    r0 = result["rows"][0]
    lines = [f"attention, {result['dtype']}, d={r0['d']}, heads={r0['heads']}, tiled blocks "
             f"{r0['block_q']}x{r0['block_k']}, CPU threads "
             f"{result['environment']['torch_threads']}  (best time s / measured peak MB)",
             f"{'N':>6} {'causal':>6} {'naive s':>9} {'flash s':>9} {'sdpa s':>9} "
             f"{'naive MB':>9} {'flash MB':>9} {'sdpa MB':>9}"]
    for r in result["rows"]:
        lines.append(f"{r['N']:>6} {str(r['causal']):>6} {r['naive_s']:>9.4f} {r['flash_s']:>9.4f} "
                     f"{r['sdpa_s']:>9.4f} {r['naive_peak_bytes'] / 1e6:>9.2f} "
                     f"{r['flash_peak_bytes'] / 1e6:>9.2f} {r['sdpa_peak_bytes'] / 1e6:>9.2f}")
    c = result.get("criteria")
    if c:
        lines.append(f"at N={c['N']}: flash/naive peak {c['flash_peak_over_naive']:.4f} "
                     f"(target <= 0.02), time flash/naive {c['flash_time_over_naive']:.2f} "
                     f"(<= 0.8), flash/sdpa {c['flash_time_over_sdpa']:.2f} (<= 2), causal "
                     f"flash/naive {c['causal_flash_time_over_naive']:.2f} (<= 0.5)")
    return "\n".join(lines)


GPU_N = (1024, 2048, 4096, 8192, 16384)
GPU_TOKENS = 16384     # batch = GPU_TOKENS // N sequences, as in Dao 2023, arXiv:2307.08691 §4.1
GPU_HIDDEN = 2048      # heads = GPU_HIDDEN // d
#: the SDPA backends timed beside the Triton kernel (torch.nn.attention.SDPBackend names)
SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
#: published forward TFLOP/s on an H100 (bf16/fp16), cited beside the measured rows: Shah et al.
#: 2024, FlashAttention-3, arXiv:2407.08608, abstract ("FP16 reaching up to 740 TFLOPs/s (75%
#: utilization)"; "FlashAttention-2 achieving only 35% utilization on the H100 GPU", i.e.
#: about 0.35 x 989 dense bf16 TFLOP/s)
PUBLISHED_H100_TFLOPS = {"FlashAttention-3 (H100, up to)": 740.0,
                         "FlashAttention-2 (H100, 35 % of 989)": 0.35 * 989.0}


def _gpu_check(device: torch.device) -> dict:
    """Triton kernel vs float64 attention on awkward shapes; raises AssertionError if off."""
    g = torch.Generator(device=device).manual_seed(0)
    worst = 0.0
    for T, S, H, H_kv, d, causal in ((300, 333, 8, 2, 128, True), (257, 257, 4, 4, 64, False),
                                     (1, 1000, 8, 1, 64, True), (513, 513, 4, 2, 80, True)):
        q = torch.randn(2, H, T, d, device=device, generator=g, dtype=torch.bfloat16)
        k, v = (torch.randn(2, H_kv, S, d, device=device, generator=g, dtype=torch.bfloat16)
                for _ in range(2))
        ref = naive_attention(q.double(), k.double(), v.double(), causal)
        err = float((flash_attention_triton(q, k, v, causal).double() - ref).abs().max())
        if not err < 3e-2:
            raise AssertionError(f"Triton kernel off by {err:.3g} (T={T}, S={S}, H={H}, "
                                 f"H_kv={H_kv}, d={d}, causal={causal})")
        worst = max(worst, err)
    return {"max_abs_error_vs_float64": worst}


def sdpa_backend_s(q, k, v, causal: bool, backend: str, device) -> float | str:
    """Best seconds of SDPA forced to one ``backend`` (``torch.nn.attention.sdpa_kernel``), or
    the reason it cannot run these inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            return best_time_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                               repeats=10, warmup=3, device=device)
    except (RuntimeError, AttributeError) as err:
        return f"unavailable: {str(err).splitlines()[0][:160]}"


def _gpu_row(N: int, d: int, causal: bool, device: torch.device) -> dict:
    B, H = max(1, GPU_TOKENS // N), GPU_HIDDEN // d
    g = torch.Generator(device=device).manual_seed(N + d)
    q, k, v = (torch.randn(B, H, N, d, device=device, generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    tri = flash_attention_triton(q, k, v, causal)                    # autotuned tile
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    err = float((tri.float() - sdpa.float()).abs().max())
    if not err < 3e-2:
        raise AssertionError(f"Triton vs SDPA differ by {err:.3g} at N={N}, d={d}, causal={causal}")
    t_tri = best_time_s(lambda: flash_attention_triton(q, k, v, causal),
                        repeats=10, warmup=3, device=device)
    t_sdpa = best_time_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                         repeats=10, warmup=3, device=device)
    backends = {}
    for name in SDPA_BACKENDS:
        t = sdpa_backend_s(q, k, v, causal, name, device)
        backends[name] = (attention_tflops(B, H, N, N, d, causal, t) if isinstance(t, float)
                          else t)
    tile = chosen_tile(q, causal)
    tflops = attention_tflops(B, H, N, N, d, causal, t_tri)
    flash = backends.get("FLASH_ATTENTION")
    return {"N": N, "d": d, "causal": causal, "batch": B, "heads": H, "dtype": "bfloat16",
            "triton_tile": tile, "triton_s": t_tri, "sdpa_s": t_sdpa,
            "max_abs_diff_vs_sdpa": err, "triton_tflops": tflops,
            "sdpa_tflops": attention_tflops(B, H, N, N, d, causal, t_sdpa),
            "sdpa_backend_tflops": backends,
            "triton_over_sdpa_flash": tflops / flash if isinstance(flash, float) else None}


def run_gpu() -> dict:
    """Triton FlashAttention vs SDPA on the GPU: correctness first, then TFLOP/s in bf16.

    Raises ``RuntimeError`` without CUDA and ``AssertionError`` when a result is wrong: nothing
    is skipped quietly. Forward FLOPs are ``4·B·H·N²·d`` (halved when causal).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("bench attention run_gpu needs a CUDA GPU; none is visible to torch")
    device = torch.device("cuda", torch.cuda.current_device())
    check = _gpu_check(device)
    rows = [_gpu_row(N, d, causal, device)
            for d in (64, 128) for causal in (False, True) for N in GPU_N]
    at128 = [r["triton_over_sdpa_flash"] for r in rows
             if r["d"] == 128 and r["triton_over_sdpa_flash"] is not None]
    result = {"suite": "attention", "check": check, "rows": rows,
              "published_h100_tflops": PUBLISHED_H100_TFLOPS,
              "triton_over_sdpa_flash_d128_median": (sorted(at128)[len(at128) // 2]
                                                     if at128 else None),
              "environment": environment()}
    result["table"] = format_gpu_table(result)
    return result


def format_gpu_table(result: dict) -> str:
    """The GPU rows as text: TFLOP/s of the Triton kernel and of SDPA."""
    names = [b for b in SDPA_BACKENDS]
    lines = [f"{'N':>6} {'d':>4} {'causal':>6} {'triton':>8} " + " ".join(
        f"{n.split('_')[0].lower():>9}" for n in names) + "   TFLOP/s (sdpa per backend)"]
    for r in result["rows"]:
        cells = [f"{v:>9.1f}" if isinstance(v, float) else f"{'n/a':>9}"
                 for v in (r.get("sdpa_backend_tflops", {}).get(n) for n in names)]
        lines.append(f"{r['N']:>6} {r['d']:>4} {str(r['causal']):>6} "
                     f"{r['triton_tflops']:>8.1f} " + " ".join(cells))
    for name, tflops in result.get("published_h100_tflops", {}).items():
        lines.append(f"  published: {name}: {tflops:.0f} TFLOP/s (arXiv:2407.08608)")
    return "\n".join(lines)
