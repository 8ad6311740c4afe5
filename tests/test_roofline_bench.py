"""``bench roofline``: the measured CPU roofline and the decode / prefill points (keys and
invariants, not times: timings are checked only as ratios inside one bench run)."""

import math

import pytest
import torch

from llminfra.bench import load_suite
from llminfra.bench.roofline import (WEIGHT_FORMATS, build_model, decode_s_per_step,
                                     interleaved_decode_s, measure_cpu_roofline, model_bytes)
from llminfra.calc.memory import weight_bytes
from llminfra.calc.roofline import Roofline


def test_measure_cpu_roofline_restores_threads():
    before = torch.get_num_threads()
    roof = measure_cpu_roofline(1, n_bytes=8 * 2**20, n=256, repeats=2)
    assert isinstance(roof, Roofline) and roof.peak_flops_per_s > 0 and roof.bytes_per_s > 0
    assert torch.get_num_threads() == before


def test_device_roofline_runs_on_the_cpu_and_gpu_check_refuses_without_cuda():
    """The GPU measurement is device-agnostic (checked here on the CPU); ``run_gpu`` raises
    without CUDA instead of skipping."""
    from llminfra.bench.roofline import measure_device_roofline, run_gpu
    roof = measure_device_roofline("cpu", n_bytes=8 * 2**20, n=128, dtype=torch.float32,
                                   repeats=2)
    assert roof.peak_flops_per_s > 0 and roof.bytes_per_s > 0
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            run_gpu()


def test_weight_formats_read_fewer_bytes():
    """The tiny preset's bytes: fp32 = 4 · 3,033,344 = 12,133,376 (the memory model's
    weight_bytes), bf16 half of it; int8 / int4 layers take their kernels' paths."""
    from llminfra.model import ModelConfig
    spec = ModelConfig.from_name("tiny").to_spec("tiny")
    sizes = {f: model_bytes(build_model("tiny", f)) for f in WEIGHT_FORMATS}
    assert sizes["fp32"] == weight_bytes(spec, "fp32") == 12_133_376
    assert sizes["bf16"] == sizes["fp32"] // 2
    assert sizes["fp32"] > sizes["bf16"] > sizes["int8"] > sizes["int4"]
    paths = {n.split(".")[-1]: m.fast_path for n, m in build_model("tiny", "int4").named_modules()
             if hasattr(m, "fast_path")}
    # w2's K = ffn_dim = 688 is no multiple of 128: that layer falls back to the reference
    assert paths == {"wq": "int4", "wk": "int4", "wv": "int4", "wo": "int4", "w1": "int4",
                     "w3": "int4", "w2": None}
    with pytest.raises(KeyError, match="int3"):
        build_model("tiny", "int3")


def test_decode_step_timer_counts_calls():
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    print("seed", seed)
    t, calls = decode_s_per_step(build_model("tiny"), 2, 8, 2, torch.Generator().manual_seed(seed))
    assert t > 0 and calls > 4 * 10  # at least ten torch calls per layer


def test_interleaved_timer_steps_every_model_alike():
    """Every model gets a time (a step after the same prompt, with the same tokens)."""
    models = {f: build_model("tiny", f) for f in ("fp32", "bf16", "int8")}
    t = interleaved_decode_s(models, 16, 2, torch.Generator().manual_seed(1))
    assert set(t) == set(models) and all(v > 0 for v in t.values())


@pytest.mark.slow
def test_quick_run_has_the_keys():
    before = torch.get_num_threads()
    r = load_suite("roofline").run(quick=True)
    assert torch.get_num_threads() == before and r["threads"] == 1
    for key in ("copy_bytes_per_s", "matmul_flops_per_s", "decode_points",
                "quantized_decode_tokens_per_s"):
        assert key in r
    assert set(r["quantized_decode_tokens_per_s"]) == {"fp32", "bf16", "int8", "int4"}
    for preset in ("tiny", "bench-100m"):
        p = r["decode_points"][preset]["1"]
        assert p["measured_s"] > 0 and p["bound"] == "memory"
        assert math.isclose(p["times_the_bound"], p["measured_s"] / p["bound_s"])
    q = r["quantized_decode"]
    assert q["fp32"]["bytes_per_step"] > q["int8"]["bytes_per_step"] > q["int4"]["bytes_per_step"]
    assert "int4" in load_suite("roofline").format_table(r)


def test_compute_roof_is_the_faster_kernel_and_restores_threads():
    """The roof is the faster of torch's matmul and the C panel kernel (which is checked
    against ``x @ W.T`` inside), each > 0; without the C library the panel entry is None."""
    from llminfra.bench.roofline import measure_compute_roof
    before = torch.get_num_threads()
    r = measure_compute_roof(n=128, repeats=1)
    assert torch.get_num_threads() == before
    rates = {k: r[k] for k in ("torch_matmul", "f32_panels") if r[k] is not None}
    assert r["torch_matmul"] > 0 and r["kernel"] in rates
    assert r["flops_per_s"] == max(rates.values())
    roof = measure_cpu_roofline(1, n_bytes=8 * 2**20, n=128, repeats=1)
    assert roof.source.endswith(("torch_matmul", "f32_panels"))


def test_kernels_are_counted_apart_from_calls_copies_and_launch_calls():
    """``kernels_in`` on a fake profile: two device kernels, one copy and one memset on the
    device, two host launch calls and a graph replay, and host ops that launch nothing."""
    from types import SimpleNamespace

    from llminfra.bench.roofline import count_cuda_kernels, kernels_in
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [SimpleNamespace(name=n, device_type=d) for n, d in (
        ("ampere_sgemm_128x64_tn", cuda), ("void at::native::elementwise_kernel", cuda),
        ("Memcpy HtoD (Pageable -> Device)", cuda), ("Memset (Device)", cuda),
        ("cudaLaunchKernel", cpu), ("cudaLaunchKernel", cpu), ("cudaGraphLaunch", cpu),
        ("aten::view", cpu), ("aten::slice", cpu), ("aten::mm", cpu))]
    assert kernels_in(events) == {"kernels": 2, "copies": 2, "launch_calls": 3}
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            count_cuda_kernels(lambda: None)
        # what a GPU bench records where the profiler cannot count: the reason, not a gap
        from llminfra.bench.calls import launches_or_error
        assert "CUDA" in launches_or_error(lambda: None)["error"]


def test_a_cpu_profile_has_calls_but_no_kernels():
    """A real ``torch.profiler`` profile of CPU work: torch calls, views among them, but no
    event on a GPU and no launch call."""
    from torch.profiler import ProfilerActivity, profile

    from llminfra.bench.roofline import count_torch_calls, kernels_in
    x = torch.randn(8, 8)

    def step():
        return (x[:4].view(2, 16) @ torch.ones(16, 2)).sum()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    assert kernels_in(prof.events()) == {"kernels": 0, "copies": 0, "launch_calls": 0}
    assert count_torch_calls(step) >= 4       # slice, view, ones, matmul, sum
