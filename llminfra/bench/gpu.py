"""``python -m llminfra bench gpu``: every CUDA check and benchmark of the project in one call.

Each suite that has a CUDA part defines ``run_gpu() -> dict``; this module imports them all,
runs each in turn and records the device, driver, torch / Triton versions and date. Without a
CUDA device nothing is run, and the result says so: a skipped GPU check is never a pass.
"""

from __future__ import annotations

import importlib
import logging
import time
import traceback

import torch

from llminfra.bench import SUITES
from llminfra.bench.timing import environment

log = logging.getLogger(__name__)


class NoGPUError(RuntimeError):
    """Raised by ``bench gpu`` when there is no CUDA device to run on."""


#: the suites with a CUDA part (``run_gpu``), in the order ``bench gpu`` runs them; each must
#: import on a bare GPU machine (torch, Triton, numpy, pandas, matplotlib, transformers and none
#: of the course-only packages: tests/test_bench_gpu_imports.py checks)
GPU_SUITES = ("attention", "kvcache", "parallel", "roofline", "memory", "engine")


def gpu_suites() -> dict:
    """Suite name -> its ``run_gpu``, or the exception that stopped it from importing (a suite
    that cannot import is a failure of ``bench gpu``, never left out)."""
    found = {}
    for name in GPU_SUITES:
        try:
            found[name] = importlib.import_module(SUITES[name]).run_gpu
        except Exception as err:  # noqa: BLE001 - reported in the result, not dropped
            found[name] = err
    return found


def run(quick: bool = False) -> dict:
    """Run every suite's ``run_gpu``; raise :class:`NoGPUError` when CUDA is absent."""
    if not torch.cuda.is_available():
        raise NoGPUError("no CUDA device is visible to torch; `bench gpu` ran nothing "
                         f"(torch {torch.__version__}, cuda build: {torch.version.cuda})")
    result = {"environment": environment(), "suites": {}, "failed": []}
    for name, fn in gpu_suites().items():
        log.info("bench gpu: %s", name)
        if isinstance(fn, Exception):
            result["failed"].append(name)
            result["suites"][name] = {"error": f"import failed: {type(fn).__name__}: {fn}"}
            continue
        start = time.perf_counter()
        try:
            result["suites"][name] = fn()
            result["suites"][name]["wall_s"] = time.perf_counter() - start
        except Exception:  # one broken suite must not hide the others' numbers
            result["failed"].append(name)
            result["suites"][name] = {"error": traceback.format_exc()}
    return result


def format_table(result: dict) -> str:
    """One line per suite: what ran and whether it failed."""
    env = result["environment"]
    lines = [f"device: {env.get('device_name')}  torch {env['torch']}  triton {env.get('triton')}"]
    for name, data in result["suites"].items():
        status = "FAILED" if name in result["failed"] else "ok"
        lines.append(f"  {name:<12} {status}")
    return "\n".join(lines)
