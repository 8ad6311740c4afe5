"""Re-run notebooks and store their outputs: ``python -m llminfra.course.execute NB…``.

Runs each notebook top to bottom in a fresh kernel (with a per-cell timeout, so a hung cell
cannot hang the run), from the notebook's own folder, and writes it back with its outputs.

Widget state is kept: nbclient's ``store_widget_state=True`` writes every live widget's state
into ``metadata.widgets``, so JupyterLab draws the widgets (sliders, tables, pictures) when the
notebook is opened, before anything runs, instead of their ``text/plain`` repr. nbval compares
neither that metadata nor the widget-view output, only ``text/plain``, which the course's
widgets keep stable (:class:`llminfra.widgets.panel.Panel`).

Each notebook's wall time is measured and stored in its ``metadata.llminfra``
(``run_time_s`` and the machine it was measured on); chapter 00's course map reads it
(:func:`llminfra.course.chapters.course_map`). So ``00_start_here`` runs last when it is one of
several notebooks given. ``--keep-run-time`` refreshes the outputs only and leaves the stored
time and machine as they were (chapter 00's stored map then still holds): for a change that does
not move the run time, made on another machine than the one measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from llminfra.bench.timing import cpu_name
from llminfra.course.grade_kernel import KERNEL_ARGUMENTS, KERNEL_ENV

#: the notebook that reads the others' run times; executed after them
MAP_NOTEBOOK = "00_start_here.ipynb"


def machine_description() -> str:
    """One line naming where a run time was measured, e.g.
    ``"AMD EPYC, x86_64, 2 CPU cores, CPU only"``; the CPU is named because two 2-core
    machines of the course differed severalfold in fp32 matmul speed and copy bandwidth (chapter
    08 measures both on the machine that runs it)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import torch
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only"
    except ImportError:
        gpu = "CPU only"
    return f"{cpu_name()}, {platform.machine()}, {cores} CPU cores, {gpu}"


def execute(path: Path, timeout_s: int = 300, kernel: str = "python3",
            keep_run_time: bool = False) -> float:
    """Execute ``path`` in place, keeping widget state; store (unless ``keep_run_time`` and a time
    is stored already) and return its wall time (s)."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout_s, kernel_name=kernel, store_widget_state=True,
                   extra_arguments=list(KERNEL_ARGUMENTS),   # the kernel's start-up warnings off
                   resources={"metadata": {"path": str(path.parent)}}).execute(
        env={**os.environ, **KERNEL_ENV})
    elapsed = time.perf_counter() - t0
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
    if not (keep_run_time and "run_time_s" in nb.metadata.get("llminfra", {})):
        nb.metadata["llminfra"] = {"run_time_s": round(elapsed, 1),
                                   "measured_on": machine_description()}
    nbformat.write(nb, path)
    return elapsed


def run_order(paths: list[Path]) -> list[Path]:
    """``paths`` in the order given, with chapter 00 (which reads the others' times) moved last."""
    return sorted(paths, key=lambda p: p.name == MAP_NOTEBOOK)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    p.add_argument("--keep-run-time", action="store_true",
                   help="keep each notebook's stored run time and machine (outputs only)")
    args = p.parse_args(argv)
    missing = [path for path in args.notebooks if not path.exists()]
    if missing:
        print(f"no such notebook: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    for path in run_order(args.notebooks):
        print(f"{path}: {execute(path, args.timeout, keep_run_time=args.keep_run_time):.1f} s",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
