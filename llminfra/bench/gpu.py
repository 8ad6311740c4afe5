"""``python -m llminfra bench gpu``: every CUDA check and benchmark of the project in one call.

Each suite that has a CUDA part defines ``run_gpu() -> dict``; this module imports them all,
runs each in turn and records the device, driver, torch / Triton versions and date. Without a
CUDA device nothing is run, and the result says so: a skipped GPU check is never a pass.
"""

from __future__ import annotations

import importlib
import logging
import traceback

import torch

from llminfra.bench import SUITES
from llminfra.bench.timing import environment

log = logging.getLogger(__name__)


class NoGPUError(RuntimeError):
    """Raised by ``bench gpu`` when there is no CUDA device to run on."""


def gpu_suites() -> dict:
    """Suite name -> its ``run_gpu`` function, for every built suite that has one."""
    found = {}
    for name, module in SUITES.items():
        if name == "gpu":
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        if hasattr(mod, "run_gpu"):
            found[name] = mod.run_gpu
    return found


def run(quick: bool = False) -> dict:
    """Run every suite's ``run_gpu``; raise :class:`NoGPUError` when CUDA is absent."""
    if not torch.cuda.is_available():
        raise NoGPUError("no CUDA device is visible to torch; `bench gpu` ran nothing "
                         f"(torch {torch.__version__}, cuda build: {torch.version.cuda})")
    result = {"environment": environment(), "suites": {}, "failed": []}
    for name, fn in gpu_suites().items():
        log.info("bench gpu: %s", name)
        try:
            result["suites"][name] = fn()
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
