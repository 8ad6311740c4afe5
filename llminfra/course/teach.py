"""A teacher's commands: ``python -m llminfra.course.teach check-machines | reset-exercises``.

``check-machines`` runs every chapter and solution notebook once, in a fresh kernel, on a copy
in memory (nothing is written), and prints per chapter how long it took and whether every cell
ran — the day before a workshop, on each machine the class will use. It exits 1 when a notebook
failed, so a script can tell.

``reset-exercises`` restores ``exercises/`` to its pristine state for a new class: every exercise
notebook is generated again from ``solutions/`` (stubs, no outputs), learners' checkpoints are
removed, and notebooks with no solution twin are listed; it changes nothing without ``--yes``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import nbformat

from llminfra.course.exercises import generate, make_exercise


def first_error(nb) -> str:
    """``"cell N: Ename: value"`` for the first cell with an error output, else ''."""
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"cell {i}: {out.get('ename')}: {out.get('evalue', '')}".splitlines()[0]
    return ""


def check_notebook(path: Path, timeout_s: int) -> tuple[float, str]:
    """Run ``path`` once (in memory); return ``(seconds, problem)``, problem '' when all ran."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    try:
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except Exception as e:  # noqa: BLE001 - a time-out or a dead kernel is this notebook's result
        return time.perf_counter() - t0, f"{type(e).__name__}: {e}".splitlines()[0]
    return time.perf_counter() - t0, first_error(nb)


def check_machines(folders: list[Path], timeout_s: int, out=sys.stdout) -> int:
    """Run every notebook in ``folders``; print a line per notebook and a summary; return the
    number of notebooks that failed."""
    paths = [p for folder in folders for p in sorted(folder.glob("*.ipynb"))]
    failed, total_s = 0, 0.0
    print(f"{'chapter':<8}{'notebook':<52}{'time (s)':>9}  result", file=out)
    for path in paths:
        seconds, problem = check_notebook(path, timeout_s)
        total_s += seconds
        failed += bool(problem)
        chapter = path.name.split("_", 1)[0]
        where = f"{path.parent.name}/{path.name}"
        print(f"{chapter:<8}{where:<52}{seconds:>9.1f}  {'FAIL ' + problem if problem else 'pass'}",
              file=out, flush=True)
    print(f"{len(paths) - failed} of {len(paths)} notebooks ran without an error in "
          f"{total_s:.0f} s", file=out)
    return failed


def reset_exercises(solutions: Path, exercises: Path, yes: bool, out=sys.stdout) -> int:
    """Regenerate ``exercises/`` from ``solutions/`` (only with ``yes``); return 0."""
    names = sorted(p.name for p in solutions.glob("*.ipynb"))
    changed = [n for n in names if not (exercises / n).exists() or (exercises / n).read_text()
               != nbformat.writes(make_exercise(nbformat.read(solutions / n, as_version=4),
                                                n.split("_", 1)[0])) + "\n"]
    extra = sorted(p.name for p in exercises.glob("*.ipynb") if p.name not in names)
    checkpoints = exercises / ".ipynb_checkpoints"
    if not yes:
        print(f"would restore {len(changed)} of {len(names)} exercise notebooks: "
              f"{', '.join(changed) or 'none'}" + (" and remove .ipynb_checkpoints/"
                                                   if checkpoints.exists() else ""), file=out)
        if extra:
            print(f"would keep (no solution twin): {', '.join(extra)}", file=out)
        print("run again with --yes to do it (learners' answers in exercises/ are lost)", file=out)
        return 0
    generate(solutions, exercises, keep_work=False)  # every notebook pristine, answers gone
    if checkpoints.exists():
        shutil.rmtree(checkpoints)
    print(f"restored {len(changed)} of {len(names)} exercise notebooks"
          + (f"; kept {', '.join(extra)} (no solution twin)" if extra else ""), file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check-machines", help="run every notebook once; time and result per chapter")
    c.add_argument("folders", nargs="*", type=Path,
                   default=[Path("notebooks"), Path("solutions")])
    c.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    r = sub.add_parser("reset-exercises", help="restore exercises/ to pristine for a new class")
    r.add_argument("--yes", action="store_true", help="really overwrite exercises/")
    r.add_argument("--solutions", type=Path, default=Path("solutions"))
    r.add_argument("--exercises", type=Path, default=Path("exercises"))
    args = p.parse_args(argv)
    if args.command == "check-machines":
        missing = [f for f in args.folders if not f.is_dir()]
        if missing:
            print(f"no such folder: {', '.join(map(str, missing))}", file=sys.stderr)
            return 2
        return 1 if check_machines(args.folders, args.timeout) else 0
    if not args.solutions.is_dir():
        print(f"no such folder: {args.solutions}", file=sys.stderr)
        return 2
    return reset_exercises(args.solutions, args.exercises, args.yes)


if __name__ == "__main__":
    raise SystemExit(main())
