"""Grade a folder of learners' exercise notebooks: ``python -m llminfra.course.grade DIR [--csv PATH]``.

``DIR`` holds one folder per student (``DIR/alice/03_precision_and_quantization.ipynb``), or the
notebooks of one student directly (the student is then ``DIR``'s name). Every exercise notebook
found is run top to bottom in a fresh kernel, from its own folder, with a time limit per cell
(a cell that runs over is interrupted and the rest still runs). Its exercises are the cells that
call a checker (nbgrader's autograder cells, see :mod:`llminfra.course.exercises`); each gets
one status from what its checker cell did:

* ``passed`` — the cell ran without an error;
* ``failed`` — the checker raised ``CheckFailed`` (the message is the checker's diagnosis);
* ``not attempted`` — the checker raised ``NotAttempted``: the learner's function is still the
  stub that raises ``NotImplementedError``;
* ``errored`` — anything else (a ``NameError`` because the answer cell has a syntax error, a
  time-out, a kernel that died, a notebook that cannot be read).

With ``--reference DIR`` (default: ``exercises/`` when it exists) the checker cells are first
restored from the pristine exercise notebook of the same name, so an edited checker cell
grades nothing. Prints one block per student and a total; ``--csv`` writes the columns
``student, notebook, exercise, status, message``. Exits 0 whatever the learners' results; 2
when it cannot do its own job (no such folder, no notebook found).
"""

from __future__ import annotations

import argparse
import csv
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from llminfra.course.exercises import checked_names

STATUSES = ("passed", "failed", "not attempted", "errored")
COLUMNS = ("student", "notebook", "exercise", "status", "message")
TIMEOUT_ENAME = "CellTimeout"


@dataclass(frozen=True)
class Result:
    """One exercise of one student: a row of the report."""

    student: str
    notebook: str
    exercise: str
    status: str
    message: str = ""


def find_notebooks(root: Path) -> list[tuple[str, Path]]:
    """``(student, notebook)`` pairs under ``root``: sub-folders are students; notebooks lying
    directly in ``root`` belong to the student named after ``root``. Checkpoints are skipped."""
    found = []
    for path in sorted(root.rglob("*.ipynb")):
        rel = path.relative_to(root)
        if ".ipynb_checkpoints" in rel.parts:
            continue
        student = rel.parts[0] if len(rel.parts) > 1 else root.resolve().name
        found.append((student, path))
    return found


def exercise_cells(nb) -> list[tuple[int, str]]:
    """``(cell index, exercise id)`` of every checker cell: the nbgrader ``grade_id`` of an
    autograder cell, else (a notebook that lost its metadata) ``check_<name>`` from the code."""
    cells = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and meta.get("grade_id"):
            cells.append((i, meta["grade_id"]))
        elif not meta and checked_names(cell.source):
            cells.append((i, "+".join(checked_names(cell.source))))
    return cells


def restore_checkers(nb, reference) -> None:
    """Put back the source of every checker cell of ``reference`` (by ``grade_id``)."""
    pristine = {cell.metadata["nbgrader"]["grade_id"]: cell.source for cell in reference.cells
                if cell.get("metadata", {}).get("nbgrader", {}).get("grade")}
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in pristine:
            cell.source = pristine[grade_id]


def missing_checkers(nb, reference) -> list[str]:
    """The exercise ids of ``reference`` whose checker cell ``nb`` no longer has."""
    present = {ex for _, ex in exercise_cells(nb)}
    return [ex for _, ex in exercise_cells(reference) if ex not in present]


def status_of(cell) -> tuple[str, str]:
    """``(status, message)`` from the outputs of an executed checker cell."""
    for out in cell.get("outputs", []):
        if out.get("output_type") != "error":
            continue
        ename, evalue = out.get("ename", ""), out.get("evalue", "")
        if ename == "NotAttempted":
            return "not attempted", evalue
        if ename == "CheckFailed":
            return "failed", evalue
        if ename in (TIMEOUT_ENAME, "KeyboardInterrupt"):
            return "errored", f"interrupted: the cell ran longer than the time limit ({evalue or ename})"
        return "errored", f"{ename}: {evalue}"
    if cell.get("execution_count") is None:
        return "errored", "the cell did not run (the kernel stopped before it)"
    return "passed", ""


def run_notebook(nb, cwd: Path, timeout_s: int, kernel: str = "python3"):
    """Execute ``nb`` (in memory; nothing is written) in a fresh kernel started in ``cwd``;
    return it with its outputs, or raise when the kernel cannot run it."""
    from nbclient import NotebookClient

    client = NotebookClient(
        nb, timeout=timeout_s, kernel_name=kernel, allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": f"the cell ran longer than "
                          f"{timeout_s} s and was interrupted", "traceback": []},
        resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def grade_notebook(student: str, path: Path, timeout_s: int, reference_dir: Path | None,
                   kernel: str = "python3") -> list[Result]:
    """Every exercise of one notebook, graded; never raises for a learner's mistake."""
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 - an unreadable notebook is a result, not a crash
        return [Result(student, path.name, "*", "errored", f"cannot read the notebook: {e}")]
    ref_path = reference_dir / path.name if reference_dir is not None else None
    missing = []
    if ref_path is not None and ref_path.exists():
        reference = nbformat.read(ref_path, as_version=4)
        restore_checkers(nb, reference)
        missing = missing_checkers(nb, reference)
    gone = [Result(student, path.name, ex, "errored", "the checker cell was deleted from the "
                   "notebook") for ex in missing]
    cells = exercise_cells(nb)
    if not cells:
        return gone
    try:
        ran = run_notebook(nb, path.parent, timeout_s, kernel)
    except Exception as e:  # noqa: BLE001 - a dead kernel fails this notebook only
        return [Result(student, path.name, ex, "errored", f"{type(e).__name__}: {e}")
                for _, ex in cells]
    results = []
    for i, ex in cells:
        status, message = status_of(ran.cells[i])
        cause = _earlier_error(ran, i, {j for j, _ in cells})
        if status == "errored" and cause:
            message += f" (after {cause})"
        results.append(Result(student, path.name, ex, status, message))
    return results + gone


def _earlier_error(nb, before: int, checker_cells: set[int]) -> str:
    """``"cell N raised Ename: value"`` for the last non-checker cell before ``before`` that
    raised (a syntax error in an answer, a time-out in the set-up), else ''."""
    for j in range(before - 1, -1, -1):
        if j in checker_cells:
            continue
        status, message = status_of(nb.cells[j]) if nb.cells[j].cell_type == "code" else ("", "")
        if status == "errored" and nb.cells[j].get("execution_count") is not None:
            return f"cell {j} raised {message.splitlines()[0] if message else 'an error'}"
    return ""


def _grade_one(job) -> list[Result]:
    return grade_notebook(*job)


def grade(root: Path, timeout_s: int = 120, reference_dir: Path | None = None, jobs: int = 1,
          kernel: str = "python3") -> list[Result]:
    """Grade every exercise notebook under ``root`` (``jobs`` notebooks at a time)."""
    work = [(student, path, timeout_s, reference_dir, kernel)
            for student, path in find_notebooks(root)]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            batches = list(pool.map(_grade_one, work))
    else:
        batches = [_grade_one(job) for job in work]
    return [r for batch in batches for r in batch]


def report(results: list[Result]) -> str:
    """A plain-text report: per student, one line per exercise, then the student's total."""
    lines = []
    for student in sorted({r.student for r in results}):
        mine = [r for r in results if r.student == student]
        passed = sum(r.status == "passed" for r in mine)
        lines.append(f"{student}: {passed} of {len(mine)} exercises passed")
        for r in mine:
            first = r.message.strip().splitlines()[0] if r.message.strip() else ""
            lines.append(f"  {r.notebook:<45} {r.exercise:<32} {r.status:<14} {first[:100]}")
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    lines.append("total: " + ", ".join(f"{n} {s}" for s, n in counts.items())
                 + f" ({len(results)} exercises, {len({r.student for r in results})} students)")
    return "\n".join(lines)


def write_csv(results: list[Result], path: Path) -> None:
    """The report as CSV with the columns :data:`COLUMNS`."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow(asdict(r))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="one folder per student, or one student's notebooks")
    p.add_argument("--csv", type=Path, help="also write the report as CSV")
    p.add_argument("--timeout", type=int, default=120, help="seconds per cell (default 120)")
    p.add_argument("--reference", type=Path, default=None,
                   help="pristine exercise notebooks whose checker cells are restored "
                        "(default: ./exercises when it exists; 'none' to trust the cells)")
    p.add_argument("--jobs", type=int, default=1, help="notebooks graded at once")
    args = p.parse_args(argv)
    if not args.dir.is_dir():
        print(f"no such folder: {args.dir}", file=sys.stderr)
        return 2
    reference = args.reference
    if reference is None and Path("exercises").is_dir():
        reference = Path("exercises")
    if reference is not None and str(reference) == "none":
        reference = None
    if not find_notebooks(args.dir):
        print(f"no notebook found under {args.dir}", file=sys.stderr)
        return 2
    results = grade(args.dir, args.timeout, reference, max(1, args.jobs))
    print(report(results))
    if args.csv is not None:
        write_csv(results, args.csv)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
