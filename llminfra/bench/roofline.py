"""``python -m llminfra bench roofline [--quick] --json PATH``: this machine's roofline, measured.

* ``copy_bytes_per_s``: STREAM "copy" (McCalpin, 1995, "Memory bandwidth and machine balance in
  current high performance computers", IEEE TCCA newsletter): ``dst.copy_(src)`` of a buffer far
  larger than the caches, counted as 2 · size bytes (one read, one write);
* ``matmul_flops_per_s``: the compute roof, the faster of two fp32 products measured on the
  same threads (``matmul_flops_per_s_by_kernel``): ``2 · n³ / t`` of torch's ``n × n`` matmul
  (its BLAS) and ``2 · M · N · K / t`` of the package's C panel kernel (``f32_panels.c``, the
  kernel a prompt chunk of ``llminfra serve`` runs on; absent without a C compiler). A roof
  is what the fastest kernel at hand reaches: where the BLAS takes a slow path the engine's own
  kernel runs above it, and a roof measured with the BLAS alone would sit under the engines.
  ``compute_roof_by_threads`` has both on 1 and 2 threads (bf16 matmul beside them);
* ``decode_points`` / ``prefill_points``: per model preset (``tiny``, ``bench-100m``) and batch,
  the measured seconds of one step beside the roofline bound of the same step from
  :func:`llminfra.calc.roofline.step_breakdown` on the measured CPU roofline; decode points add
  the torch calls per step (:func:`count_torch_calls`) and ``overhead_floor_s``, the step time
  of the same architecture (layers, heads, batch, context) shrunk to a width of 2 per head — the
  same calls with almost
  no bytes or FLOPs, i.e. the per-call overhead that bounds a model too small to be limited by
  either;
* ``quantized_decode_tokens_per_s``: batch-1 decode of ``bench-100m`` with fp32, bf16, int8
  (per channel) and int4 (groups of 128) weights — the quantized ones through
  :class:`llminfra.quant.QuantLinear`'s CPU kernels (bf16 activations; vectorized on x86 with
  AVX2 or AVX-512, ``environment.cpu_capability`` says which) —
  stepped in turn so that load elsewhere hits all formats alike, with the bytes each reads per
  step.

Everything runs on ONE thread (``torch.set_num_threads(1)``, restored afterwards), so ratios
measured side by side are stable on a shared machine. ``run_gpu()`` (called by ``bench gpu``)
measures the same roofline on a CUDA device and places a bf16 decode step of ``bench-100m`` on
it, with its torch calls and the kernels the profiler saw it launch (:func:`count_cuda_kernels`).
Chapters 03 and 08.
"""

from __future__ import annotations

import os
import time

import torch

from llminfra.bench.calls import (_CountCalls, count_cuda_kernels,  # noqa: F401 - API
                                  count_torch_calls, kernels_in, launches_or_error)
from llminfra.bench.compute_roof import (PANEL_SHAPE, measure_compute_roof,  # noqa: F401 - API
                                         measure_matmul_flops_per_s, measure_panel_flops_per_s)
from llminfra.bench.timing import (best_time_s, copy_bandwidth_bytes_per_s, cpu_name, environment,
                                   synchronize, torch_threads)
from llminfra.calc.memory import kv_bytes_per_token
from llminfra.calc.step import step_flops
from llminfra.calc.roofline import Roofline, step_breakdown
from llminfra.model import DenseKVCache, ModelConfig, Transformer
from llminfra.quant import QuantLinear, quantize_model

PRESETS = ("tiny", "bench-100m")
BATCHES = {"tiny": (1, 8), "bench-100m": (1, 4)}
#: prompt tokens cached before the decode steps are timed
DECODE_CONTEXT = 64
PREFILL_LEN = {"tiny": 128, "bench-100m": 256}
#: weight format -> quantization scheme (None: the model cast to that dtype)
WEIGHT_FORMATS = {"fp32": None, "bf16": None, "int8": "int8-channel", "int4": "int4-g128"}
SEED = 8


def measure_copy_bytes_per_s(n_bytes: int = 128 * 2**20, repeats: int = 5) -> float:
    """STREAM-copy bandwidth: ``2 · n_bytes / t`` of ``dst.copy_(src)`` (fp32 buffers,
    :func:`llminfra.bench.timing.copy_bandwidth_bytes_per_s`)."""
    return copy_bandwidth_bytes_per_s(n_bytes, repeats)


def measure_cpu_roofline(threads: int | None = 1, n_bytes: int = 128 * 2**20, n: int = 1024,
                         repeats: int = 5) -> Roofline:
    """This CPU's :class:`~llminfra.calc.roofline.Roofline` on ``threads`` threads (``None``:
    as set; restored afterwards): copy bandwidth, and as the compute roof the faster fp32
    product of torch's ``n × n`` matmul and the C panel kernel (:func:`measure_compute_roof`).
    On ``t > 1`` threads the roof is at least ``t`` × the one-thread roof: ``t`` cores cannot
    do more than ``t`` times one core's peak (the FMA peak is linear in the cores), and one
    core is far easier to find idle on a shared machine than all of them."""
    with torch_threads(threads):
        t = torch.get_num_threads()
        bw = measure_copy_bytes_per_s(n_bytes, repeats)
        roof = measure_compute_roof(n, repeats)
    peak, how = roof["flops_per_s"], roof["kernel"]
    if t > 1:
        with torch_threads(1):
            one = measure_compute_roof(n, repeats)
        if t * one["flops_per_s"] > peak:
            peak, how = t * one["flops_per_s"], f"{t} x one thread of {one['kernel']}"
    return Roofline(f"this CPU ({t} thread(s), measured)", peak, bw,
                    f"llminfra.bench.roofline: STREAM copy and fp32 products, measured; "
                    f"compute roof from {how}")


def measure_device_roofline(device: str | torch.device = "cuda", n_bytes: int = 512 * 2**20,
                            n: int = 4096, dtype: torch.dtype = torch.bfloat16,
                            repeats: int = 5) -> Roofline:
    """The roofline of ``device`` as measured: copy bandwidth (``2 · n_bytes / t`` of
    ``dst.copy_(src)``) and ``2 · n³ / t`` of an ``n × n`` matmul in ``dtype``, each the best of
    ``repeats`` with the device synchronised around the timing."""
    device = torch.device(device)
    bw = copy_bandwidth_bytes_per_s(n_bytes, repeats, device)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    peak = 2 * n**3 / best_time_s(lambda: a @ b, repeats=repeats, device=device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    return Roofline(f"{name} (measured, {str(dtype).replace('torch.', '')} matmul)", peak, bw,
                    "llminfra.bench.roofline.measure_device_roofline")


def run_gpu() -> dict:
    """This CUDA device's measured roofline, and a batch-1 bf16 decode step of ``bench-100m``
    on it beside its bound. ``RuntimeError`` without a CUDA device (never a silent skip)."""
    if not torch.cuda.is_available():
        raise RuntimeError("roofline.run_gpu needs a CUDA device; none is visible to torch")
    roof = measure_device_roofline("cuda")
    gen = torch.Generator().manual_seed(SEED)
    model = build_model("bench-100m", "bf16").to("cuda")
    spec = model.config.to_spec("bench-100m")
    t, calls = decode_s_per_step(model, 1, DECODE_CONTEXT, 10, gen)
    launches = _decode_launches(model, gen)
    bound = step_breakdown(spec, roof, [(1, DECODE_CONTEXT + 1)], dtype="bf16")
    return {"environment": environment(), "copy_bytes_per_s": roof.bytes_per_s,
            "matmul_flops_per_s_bf16": roof.peak_flops_per_s,
            "ridge_flops_per_byte": roof.ridge_flops_per_byte,
            "decode_bench_100m_bf16": {"measured_s": t, "bound_s": bound["time_s"],
                                       "times_the_bound": t / bound["time_s"],
                                       "ops_per_step": calls,
                                       "launches_per_step": launches}}


@torch.no_grad()
def _decode_launches(model, gen: torch.Generator) -> dict:
    """:func:`count_cuda_kernels` (or the error that stopped it) of one batch-1 decode step after a
    :data:`DECODE_CONTEXT`-token prompt (the torch calls of the same step are ``ops_per_step``)."""
    V, device = model.config.vocab_size, next(model.parameters()).device
    cache = DenseKVCache(model.config.n_layers)
    model(torch.randint(0, V, (1, DECODE_CONTEXT), generator=gen).to(device), cache)
    tok = torch.randint(0, V, (1, 1), generator=gen).to(device)
    return launches_or_error(lambda: model(tok, cache, cache.seq_len))


def build_model(preset: str, weights: str = "fp32", shrunk: bool = False):
    """``Transformer(ModelConfig.from_name(preset))`` (random weights, seed 0) in ``weights``:
    ``fp32``, ``bf16``, or bf16 with ``int8`` / ``int4`` linear layers (:data:`WEIGHT_FORMATS`).
    ``shrunk``: the same layers and heads with head_dim 2 and an MLP of width 8 (overhead only).
    """
    from dataclasses import replace

    if weights not in WEIGHT_FORMATS:
        raise KeyError(f"unknown weight format {weights!r}; allowed: {', '.join(WEIGHT_FORMATS)}")
    config = ModelConfig.from_name(preset)
    if shrunk:
        config = replace(config, dim=2 * config.n_heads, ffn_dim=8)
    model = Transformer(config).eval()
    if weights != "fp32":
        model = model.to(torch.bfloat16)
    if WEIGHT_FORMATS[weights]:
        model = quantize_model(model, WEIGHT_FORMATS[weights])
        for m in model.modules():       # PyTorch's int8 / int4 kernels on any CPU
            if isinstance(m, QuantLinear):
                m.fast = True
    return model


def model_bytes(model) -> int:
    """Bytes of every parameter and buffer (packed codes and scales of quantized layers)."""
    return sum(t.numel() * t.element_size()
               for t in list(model.parameters()) + list(model.buffers()))


@torch.no_grad()
def decode_s_per_step(model, batch: int, context: int, steps: int, gen: torch.Generator):
    """Best seconds of one decode step (``batch`` new tokens) over ``steps`` steps after a
    ``context``-token prompt (the best is the least disturbed by other processes on a shared
    machine); returns ``(seconds, torch calls in one step)``."""
    V = model.config.vocab_size
    device = next(model.parameters()).device
    cache = DenseKVCache(model.config.n_layers)
    model(torch.randint(0, V, (batch, context), generator=gen).to(device), cache)
    ts, calls = [], 0
    for i in range(steps + 1):
        tok = torch.randint(0, V, (batch, 1), generator=gen).to(device)
        synchronize(device)
        t0 = time.perf_counter()
        if i == 1:
            with _CountCalls() as counter:
                model(tok, cache, cache.seq_len)
            calls = counter.calls
        else:
            model(tok, cache, cache.seq_len)
        synchronize(device)
        if i > 1:  # step 0 warms up, step 1 counts calls
            ts.append(time.perf_counter() - t0)
    return min(ts), calls


@torch.no_grad()
def prefill_s(model, batch: int, prompt_len: int, repeats: int, gen: torch.Generator) -> float:
    """Best seconds of a prefill of ``batch`` prompts of ``prompt_len`` tokens."""
    x = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=gen)
    return best_time_s(lambda: model(x), repeats=repeats)


def _point(spec, roof: Roofline, pairs, measured_s: float) -> dict:
    b = step_breakdown(spec, roof, pairs, dtype="fp32")
    return {"measured_s": measured_s, "bound_s": b["time_s"], "bound": b["bound"],
            "flops": b["flops"], "bytes": b["bytes"], "intensity": b["flops"] / b["bytes"],
            "measured_flops_per_s": b["flops"] / measured_s,
            "times_the_bound": measured_s / b["time_s"]}


def _points(roof: Roofline, quick: bool, gen: torch.Generator) -> tuple[dict, dict]:
    decode, prefill = {}, {}
    for preset in PRESETS:
        model = build_model(preset, "fp32")
        spec = model.config.to_spec(preset)
        decode[preset], prefill[preset] = {}, {}
        for batch in BATCHES[preset][:1] if quick else BATCHES[preset]:
            steps = 4 if quick else 10
            t, calls = decode_s_per_step(model, batch, DECODE_CONTEXT, steps, gen)
            floor, _ = decode_s_per_step(build_model(preset, shrunk=True), batch,
                                         DECODE_CONTEXT, steps, gen)
            p = _point(spec, roof, [(1, DECODE_CONTEXT + 1)] * batch, t)
            p.update(s_per_token=t / batch, bound_s_per_token=p["bound_s"] / batch,
                     ops_per_step=calls, overhead_floor_s=floor)
            decode[preset][str(batch)] = p
            T = PREFILL_LEN[preset] // (2 if quick else 1)
            prefill[preset][str(batch)] = _point(
                spec, roof, [(T, T)] * batch, prefill_s(model, batch, T, 2 if quick else 3, gen))
        del model
    return decode, prefill


@torch.no_grad()
def interleaved_decode_s(models: dict, context: int, rounds: int, gen: torch.Generator) -> dict:
    """Best seconds of one batch-1 decode step of each model, the models stepped in turn (each
    round runs every model once), so that a burst of load elsewhere on a shared machine slows
    all of them alike rather than one; every cache starts from the same ``context``-token
    prompt and gets the same tokens."""
    first = next(iter(models.values()))
    prompt = torch.randint(0, first.config.vocab_size, (1, context), generator=gen)
    caches = {}
    for name, model in models.items():
        caches[name] = DenseKVCache(model.config.n_layers)
        model(prompt, caches[name])
    best = {name: float("inf") for name in models}
    for r in range(rounds + 1):  # round 0 warms up
        tok = torch.randint(0, first.config.vocab_size, (1, 1), generator=gen)
        for name, model in models.items():
            t0 = time.perf_counter()
            model(tok, caches[name], caches[name].seq_len)
            if r:
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def _quantized(roof: Roofline, quick: bool, gen: torch.Generator) -> dict:
    """Batch-1 decode tokens/s of bench-100m per weight format (measured in turn, see
    :func:`interleaved_decode_s`), and the bytes each reads per step."""
    spec = ModelConfig.from_name("bench-100m").to_spec("bench-100m")
    models = {fmt: build_model("bench-100m", fmt) for fmt in WEIGHT_FORMATS}
    times = interleaved_decode_s(models, DECODE_CONTEXT, 5 if quick else 12, gen)
    out = {}
    for fmt, model in models.items():
        t, weights = times[fmt], model_bytes(model)
        kv_b = (DECODE_CONTEXT + 1) * kv_bytes_per_token(spec, "fp32" if fmt == "fp32" else "bf16")
        out[fmt] = {"tokens_per_s": 1 / t, "s_per_token": t, "weight_bytes": weights,
                    "bytes_per_step": weights + kv_b,
                    "bound_tokens_per_s": roof.bytes_per_s / (weights + kv_b),
                    "flops_per_step": step_flops(spec, [(1, DECODE_CONTEXT + 1)])}
    return out


def _roofs(quick: bool) -> tuple[Roofline, dict]:
    """The one-thread roofline (copy bandwidth; the compute roof of :func:`measure_compute_roof`)
    and ``{threads: compute roof}`` on 1 and 2 threads, each with torch's bf16 matmul beside."""
    repeats = 3 if quick else 5
    by_threads = {}
    for threads in (1, 2):
        with torch_threads(threads):
            by_threads[str(threads)] = measure_compute_roof(1024, repeats)
            # quick: 512 (a CPU without native bf16 was slow at 1024 × 1024 in bf16)
            by_threads[str(threads)]["torch_matmul_bf16"] = measure_matmul_flops_per_s(
                512 if quick else 1024, torch.bfloat16, repeats)
    one = by_threads["1"]
    roof = Roofline("this CPU (1 thread(s), measured)", one["flops_per_s"],
                    measure_copy_bytes_per_s(repeats=repeats),
                    f"llminfra.bench.roofline: STREAM copy and fp32 products, measured; "
                    f"compute roof from {one['kernel']}")
    return roof, by_threads


def run(quick: bool = False) -> dict:
    """All measurements on one thread (restored afterwards), but the compute roofs on 2
    threads; ``quick`` takes fewer steps and batches (same keys)."""
    with torch_threads(1):
        gen = torch.Generator().manual_seed(SEED)
        t0 = time.perf_counter()
        load_before = os.getloadavg()
        roof, by_threads = _roofs(quick)
        one = by_threads["1"]
        decode, prefill = _points(roof, quick, gen)
        quant = _quantized(roof, quick, gen)
        result = {
            "environment": {**environment(), "cpu_name": cpu_name(),
                            "load_avg_before": load_before, "load_avg_after": os.getloadavg()},
            "quick": quick, "threads": 1, "seed": SEED,
            "copy_bytes_per_s": roof.bytes_per_s, "matmul_flops_per_s": roof.peak_flops_per_s,
            "matmul_kernel": one["kernel"],
            "matmul_flops_per_s_by_kernel": {k: one[k] for k in ("torch_matmul", "f32_panels")},
            "matmul_flops_per_s_by_dtype": {"fp32": one["torch_matmul"],
                                            "bf16": one["torch_matmul_bf16"]},
            "compute_roof_by_threads": by_threads, "panel_shape": list(PANEL_SHAPE),
            "ridge_flops_per_byte": roof.ridge_flops_per_byte,
            "decode_context": DECODE_CONTEXT, "decode_points": decode, "prefill_points": prefill,
            "quantized_decode": quant,
            "quantized_decode_tokens_per_s": {k: v["tokens_per_s"] for k, v in quant.items()},
            "quantized_speedup_vs_fp32": {k: v["tokens_per_s"] / quant["fp32"]["tokens_per_s"]
                                          for k, v in quant.items()},
        }
        result["seconds"] = time.perf_counter() - t0
    return result


def format_table(result: dict) -> str:
    """The numbers as plain text."""
    r = result
    out = [f"CPU roofline, 1 thread: copy {r['copy_bytes_per_s'] / 1e9:.3g} GB/s, fp32 roof "
           f"{r['matmul_flops_per_s'] / 1e9:.3g} GFLOP/s ({r['matmul_kernel']}; torch matmul "
           f"fp32 {r['matmul_flops_per_s_by_dtype']['fp32'] / 1e9:.3g}, bf16 "
           f"{r['matmul_flops_per_s_by_dtype']['bf16'] / 1e9:.3g}), ridge "
           f"{r['ridge_flops_per_byte']:.3g} FLOP/B",
           f"{'point':<26} {'measured ms':>11} {'bound ms':>9} {'x bound':>8} {'FLOP/B':>7} "
           f"{'overhead ms':>11}"]
    for kind in ("decode_points", "prefill_points"):
        for preset, rows in r[kind].items():
            for batch, p in rows.items():
                out.append(f"{kind.split('_')[0] + ' ' + preset + ' B=' + batch:<26} "
                           f"{p['measured_s'] * 1e3:>11.4g} {p['bound_s'] * 1e3:>9.4g} "
                           f"{p['times_the_bound']:>8.3g} {p['intensity']:>7.3g} "
                           + (f"{p['overhead_floor_s'] * 1e3:>11.4g}" if "overhead_floor_s" in p
                              else ""))
    out.append(f"{'bench-100m batch-1 decode':<26} {'tokens/s':>11} {'bound':>9} {'x fp32':>8} "
               f"{'MB/step':>7}")
    for fmt, q in r["quantized_decode"].items():
        out.append(f"{fmt:<26} {q['tokens_per_s']:>11.4g} {q['bound_tokens_per_s']:>9.4g} "
                   f"{r['quantized_speedup_vs_fp32'][fmt]:>8.3g} {q['bytes_per_step'] / 1e6:>7.4g}")
    return "\n".join(out)
