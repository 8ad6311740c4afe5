"""What a step costs the host and what it launches: torch calls, and on a GPU the kernels.

A step's **calls** (:func:`count_torch_calls`) are every torch function, tensor method and
attribute read it makes: each costs the host time to run Python, parse the arguments and
dispatch, on any device. Its **launches** are what reaches the GPU: kernels, copies and
memsets as the profiler records them (:func:`count_cuda_kernels`, CUDA only). The two differ:
a view, a slice or ``.shape`` is a call that launches nothing, a fused op one launch for
several calls' work, and a replayed CUDA graph one launch call for all of a step's kernels.
Chapters 08 and 12.
"""

from __future__ import annotations

import torch


class _CountCalls(torch.overrides.TorchFunctionMode):
    """Counts the torch calls made inside it: every function, tensor method and attribute read
    that goes through ``__torch_function__`` (views, slices, ``.shape`` too)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def count_torch_calls(fn, *args, **kwargs) -> int:
    """The torch calls ``fn(*args, **kwargs)`` makes, as :class:`_CountCalls` sees them:
    functions, tensor methods, attribute reads, views, slices and chunks. These are **calls**,
    not kernel launches: each costs host time (Python, argument parsing, dispatch), but an
    attribute read, a view or a slice launches nothing, and a fused op launches one kernel for
    several calls' work (the fast layer's ``rotate`` is five calls and one kernel). Host time
    per call is what a step's calls cost on any device; the launches on a GPU are
    :func:`count_cuda_kernels`. Deterministic for a given code path."""
    with _CountCalls() as counter:
        fn(*args, **kwargs)
    return counter.calls


#: names of the CUDA runtime / driver calls that put work on the GPU (a graph launch is one)
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch",
                "cudaLaunchCooperativeKernel")


def kernels_in(events) -> dict:
    """From a profile's events (``torch.profiler.profile(...).events()``): ``kernels``, the
    events that ran on the GPU other than copies and memsets, ``copies`` (``Memcpy`` /
    ``Memset``), and ``launch_calls``, the host's calls of :data:`LAUNCH_CALLS` (a CUDA
    graph's replay is one launch call however many kernels it runs)."""
    out = {"kernels": 0, "copies": 0, "launch_calls": 0}
    for e in events:
        name = getattr(e, "name", "")
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            out["copies" if name.startswith(("Memcpy", "Memset")) else "kernels"] += 1
        elif name.startswith(LAUNCH_CALLS):
            out["launch_calls"] += 1
    return out


def count_cuda_kernels(fn, *args, **kwargs) -> dict:
    """:func:`kernels_in` of ``fn(*args, **kwargs)`` under ``torch.profiler`` (CPU and CUDA
    activities, the device synchronised before the profile ends): what a step launches on the
    GPU, beside its :func:`count_torch_calls`. ``RuntimeError`` without a CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError("count_cuda_kernels needs a CUDA device; none is visible to torch")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(*args, **kwargs)
        torch.cuda.synchronize()
    return kernels_in(prof.events())


def launches_or_error(fn, *args, **kwargs) -> dict:
    """:func:`count_cuda_kernels`, or ``{"error": "..."}`` where the profiler fails: a scarce
    GPU run keeps its other numbers and says why this one is missing (never a silent gap)."""
    try:
        return count_cuda_kernels(fn, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - recorded in the result, not swallowed
        return {"error": f"{type(e).__name__}: {e}"}

