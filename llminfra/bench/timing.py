"""Timing and memory measurement helpers: the only place that synchronises a device."""

from __future__ import annotations

import contextlib
import datetime
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued work on ``device`` (a no-op on the CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (``None``: as they are), restoring the
    previous count afterwards, also when the block raises."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def best_time_s(fn: Callable[[], object], repeats: int = 3, warmup: int = 1,
                device: torch.device | str | None = None) -> float:
    """Best wall time of ``fn()`` over ``repeats`` runs, after ``warmup`` untimed runs."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def copy_bandwidth_bytes_per_s(nbytes: int = 2**28, repeats: int = 3,
                               device: torch.device | str | None = None) -> float:
    """(bytes read + bytes written) / s of ``dst.copy_(src)`` on ``nbytes`` float32s on
    ``device`` (default the CPU): STREAM's "Copy", the bandwidth a decode floor divides by."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_time_s(lambda: dst.copy_(src), repeats, device=device)


def cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (e.g. ``"AMD EPYC 7B13"``), else the
    architecture: two 2-core machines of the course differed several-fold in fp32 matmul speed,
    so a recorded run names its CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    """Device, versions and date, recorded with every benchmark JSON."""
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
        try:
            import triton
            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    else:
        info["device_name"] = "cpu"
    return info
