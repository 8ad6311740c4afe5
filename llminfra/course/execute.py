"""Re-run notebooks and store their outputs: ``python -m llminfra.course.execute NB…``.

Runs each notebook top to bottom in a fresh kernel (with a per-cell timeout, so a hung cell
cannot hang the run), from the notebook's own folder, and writes it back with its outputs; widget
state is dropped so diffs stay quiet. Prints the wall time of each notebook.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, timeout_s: int = 300, kernel: str = "python3") -> float:
    """Execute ``path`` in place; return its wall time in seconds."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout_s, kernel_name=kernel,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    elapsed = time.perf_counter() - t0
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = p.parse_args(argv)
    for path in args.notebooks:
        if not path.exists():
            print(f"no such notebook: {path}", file=sys.stderr)
            return 2
        print(f"{path}: {execute(path, args.timeout):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
