"""Grade a folder of learners' exercise notebooks: ``python -m llminfra.course.grade DIR [--csv PATH]``.

``DIR`` holds one folder per student (``DIR/alice/03_precision_and_quantization.ipynb``), or the
notebooks of one student directly (the student is then ``DIR``'s name). Every exercise notebook
found is run top to bottom in a fresh kernel, from its own folder, with a time limit per cell
(a cell that runs over is interrupted and the rest still runs). Its exercises are the cells that
call a checker (nbgrader's autograder cells, see :mod:`llminfra.course.exercises`); each gets
one status from what its checker cell did:

* ``passed`` — the cell ran without an error and its checker printed its ``✓`` line;
* ``failed`` — the checker raised ``CheckFailed`` (the message is the checker's diagnosis);
* ``not attempted`` — the checker raised ``NotAttempted``: the learner's function is still the
  stub that raises ``NotImplementedError``;
* ``errored`` — anything else (a ``NameError`` because the answer cell has a syntax error, a
  time-out, a kernel that died, a notebook that cannot be read).

A teacher can trust a ``passed``:

* the checker cells are first restored from the pristine exercise notebook of the same name
  (``--reference DIR``; default: the course's own ``exercises/``, found from the package, from
  any working directory), so an edited checker cell grades nothing;
* each checker cell runs the checker freshly imported from the package (the ``llminfra.course``
  modules are dropped from ``sys.modules`` first), so an answer cell that monkeypatched a
  checker or ``run_checks`` changes nothing;
* a cell interrupted at the time limit, and every checker cell after it, is ``errored`` (an
  answer looping inside a bare ``except:`` swallows the interrupt: nothing after it ran);
* only the course's exercise notebooks are graded, by name (``Untitled.ipynb``,
  ``…-Copy1.ipynb`` are listed as ignored, never counted), and a notebook that other students
  of the class handed in but one did not gives each of its exercises ``not attempted`` for
  that one ("notebook missing").
Prints one block per student and a total (a progress bar on a terminal while it runs);
``--summary`` adds one line per student, one column per exercise (✓ passed, ✗ failed, · not
attempted, ! errored) and the student's points (one per passed exercise); ``--csv`` writes the
columns ``student, notebook, exercise, status, points, message``. Exits 0 whatever the
learners' results; 2 when it cannot do its own job (no such folder, no notebook found).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat
from tqdm import tqdm

from llminfra.course.exercises import checked_names

STATUSES = ("passed", "failed", "not attempted", "errored")
COLUMNS = ("student", "notebook", "exercise", "status", "points", "message")
#: points per status (one per passed exercise) and each status's mark in the summary
POINTS = {"passed": 1, "failed": 0, "not attempted": 0, "errored": 0}
MARKS = {"passed": "✓", "failed": "✗", "not attempted": "·", "errored": "!"}
TIMEOUT_ENAME = "CellTimeout"


@dataclass(frozen=True)
class Result:
    """One exercise of one student: a row of the report."""

    student: str
    notebook: str
    exercise: str
    status: str
    message: str = ""

    @property
    def points(self) -> int:
        return POINTS[self.status]


#: the course's own exercise notebooks (the default reference), wherever the grader runs from
COURSE_EXERCISES = Path(__file__).resolve().parents[2] / "exercises"
#: what a checker cell prints when its checker passes (run_checks and every custom checker)
PASS_MARK = "✓"


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


def status_of(cell, checker: bool = True) -> tuple[str, str]:
    """``(status, message)`` from the outputs of an executed checker cell (``checker=False``:
    any other cell, which passes without printing a ``✓`` line)."""
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
    printed = "".join(out.get("text", "") for out in cell.get("outputs", [])
                      if out.get("output_type") == "stream")
    if checker and PASS_MARK not in printed:
        return "errored", "the checker did not report a pass (no ✓ line in the cell's output)"
    return "passed", ""


def _interrupted(cell) -> bool:
    return any(out.get("output_type") == "error"
               and out.get("ename") in (TIMEOUT_ENAME, "KeyboardInterrupt")
               for out in cell.get("outputs", []))


def fresh_checker_source(source: str, chapter: str) -> str:
    """``source`` run after a fresh import of the checkers it calls: the ``llminfra.course``
    modules are dropped from ``sys.modules``, then ``chNN`` (for ``chNN.check_x(...)``) and each
    bare ``check_x`` (chapter ``chapter``'s) are bound again from the new modules, so whatever
    an answer cell did to the old module objects or to those names is gone."""
    modules = sorted(set(re.findall(r"\b(ch\d\d)\.check_", source)))
    bare = sorted(set(re.findall(r"(?<![.\w])(check_\w+)\s*\(", source)))
    prelude = ("import importlib as _grader_importlib, sys as _grader_sys\n"
               "for _grader_m in [m for m in list(_grader_sys.modules) "
               "if m == 'llminfra.course' or m.startswith('llminfra.course.')]:\n"
               "    del _grader_sys.modules[_grader_m]\n")
    prelude += "".join(f"{m} = _grader_importlib.import_module('llminfra.course.checks.{m}')\n"
                       for m in modules)
    if bare:
        prelude += (f"_grader_checks = _grader_importlib.import_module("
                    f"'llminfra.course.checks.ch{chapter}')\n")
        prelude += "".join(f"{name} = _grader_checks.{name}\n" for name in bare)
    return prelude + source


def run_notebook(nb, cwd: Path, timeout_s: int, kernel: str = "python3"):
    """Execute ``nb`` (in memory; nothing is written) in a fresh kernel started in ``cwd``;
    return it with its outputs, or raise when the kernel cannot run it."""
    from nbclient import NotebookClient

    error = {"ename": TIMEOUT_ENAME, "evalue": f"the cell ran longer than {timeout_s} s and was "
             "interrupted", "traceback": []}

    def on_cell_executed(cell, cell_index, execute_reply):
        # a cell that swallows the interrupt (a bare ``except:``) sends no error output: the
        # time-out is only in nbclient's stand-in reply, so it is written into the cell here;
        # its kernel is still busy in that cell, so every later cell would only wait out its
        # own time limit: stop here (the grader marks the later checkers errored)
        if ((execute_reply or {}).get("content", {}).get("ename") == TIMEOUT_ENAME
                and not _interrupted(cell)):
            cell.outputs.append(nbformat.v4.new_output("error", **error))
            raise _KernelStuck(cell_index)

    client = NotebookClient(
        nb, timeout=timeout_s, kernel_name=kernel, allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout=error, on_cell_executed=on_cell_executed,
        resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute()
    except _KernelStuck:
        pass                         # nbclient has shut the kernel down on the way out
    return nb


class _KernelStuck(Exception):
    """A cell swallowed the time limit's interrupt: its kernel cannot run another cell."""


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
    chapter = path.name[:2]
    for i, _ in cells:
        nb.cells[i].source = fresh_checker_source(nb.cells[i].source, chapter)
    try:
        ran = run_notebook(nb, path.parent, timeout_s, kernel)
    except Exception as e:  # noqa: BLE001 - a dead kernel fails this notebook only
        return [Result(student, path.name, ex, "errored", f"{type(e).__name__}: {e}")
                for _, ex in cells]
    results = []
    stopped = next((j for j, cell in enumerate(ran.cells)
                    if cell.cell_type == "code" and _interrupted(cell)), None)
    for i, ex in cells:
        status, message = status_of(ran.cells[i])
        if stopped is not None and i > stopped:
            status, message = "errored", (f"not graded: cell {stopped} was interrupted at the "
                                          "time limit, so the cells after it did not run as "
                                          "written")
        cause = _earlier_error(ran, i, {j for j, _ in cells})
        if status == "errored" and cause and stopped is None:
            message += f" (after {cause})"
        results.append(Result(student, path.name, ex, status, message))
    return results + gone


def _earlier_error(nb, before: int, checker_cells: set[int]) -> str:
    """``"cell N raised Ename: value"`` for the last non-checker cell before ``before`` that
    raised (a syntax error in an answer, a time-out in the set-up), else ''."""
    for j in range(before - 1, -1, -1):
        if j in checker_cells:
            continue
        status, message = (status_of(nb.cells[j], checker=False)
                           if nb.cells[j].cell_type == "code" else ("", ""))
        if status == "errored" and nb.cells[j].get("execution_count") is not None:
            return f"cell {j} raised {message.splitlines()[0] if message else 'an error'}"
    return ""


def _grade_one(job) -> list[Result]:
    return grade_notebook(*job)


def select_notebooks(found: list[tuple[str, Path]], reference_dir: Path | None
                     ) -> tuple[list[tuple[str, Path]], list[tuple[str, Path]], list[tuple[str, str]]]:
    """``(graded, ignored, missing)``: with a reference folder, only the notebooks named as its
    exercise notebooks are graded; the others (``Untitled.ipynb``, ``…-Copy1.ipynb``) are
    ignored. The class's assignment is every course notebook some student handed in; each
    student's absent ones are ``(student, name)`` in ``missing``."""
    if reference_dir is None:
        return found, [], []
    names = {p.name for p in reference_dir.glob("*.ipynb")}
    graded = [(s, p) for s, p in found if p.name in names]
    ignored = [(s, p) for s, p in found if p.name not in names]
    have = {(s, p.name) for s, p in graded}
    assigned = sorted({p.name for _, p in graded})
    students = sorted({s for s, _ in found})
    missing = [(s, n) for s in students for n in assigned if (s, n) not in have]
    return graded, ignored, missing


def _missing_results(student: str, name: str, reference_dir: Path) -> list[Result]:
    reference = nbformat.read(reference_dir / name, as_version=4)
    return [Result(student, name, ex, "not attempted", "notebook missing from the student's folder")
            for _, ex in exercise_cells(reference)]


def grade(root: Path, timeout_s: int = 120, reference_dir: Path | None = None, jobs: int = 1,
          kernel: str = "python3", ignored: list | None = None) -> list[Result]:
    """Grade every exercise notebook under ``root`` (``jobs`` notebooks at a time). With
    ``reference_dir``, only its notebooks' names are graded; the paths left out are appended
    to ``ignored`` when a list is given."""
    graded, left_out, missing = select_notebooks(find_notebooks(root), reference_dir)
    if ignored is not None:
        ignored.extend(left_out)
    work = [(student, path, timeout_s, reference_dir, kernel) for student, path in graded]
    progress = dict(total=len(work), desc="grading", unit="notebook", file=sys.stderr,
                    disable=None)  # disable=None: shown on a terminal only
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            batches = list(tqdm(pool.map(_grade_one, work), **progress))
    else:
        batches = [_grade_one(job) for job in tqdm(work, **progress)]
    results = [r for batch in batches for r in batch]
    for student, name in missing:
        results += _missing_results(student, name, reference_dir)
    return results


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


def summary(results: list[Result]) -> str:
    """Students × exercises: each cell the status's mark (:data:`MARKS`), then the points and the
    points possible, one line per student (a class of 30 on one screen)."""
    import pandas as pd

    frame = pd.DataFrame([{"student": r.student, "exercise": r.exercise,
                           "mark": MARKS[r.status], "points": r.points} for r in results])
    marks = frame.pivot_table(index="student", columns="exercise", values="mark",
                              aggfunc="first", fill_value=" ")
    marks["points"] = [f"{p} / {n}" for p, n in zip(
        frame.groupby("student")["points"].sum(), frame.groupby("student").size())]
    legend = "  ".join(f"{m} {s}" for s, m in MARKS.items())
    return f"{marks.to_string()}\n{legend}; one point per passed exercise"


def write_csv(results: list[Result], path: Path) -> None:
    """The report as CSV with the columns :data:`COLUMNS`."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow({**asdict(r), "points": r.points})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="one folder per student, or one student's notebooks")
    p.add_argument("--csv", type=Path, help="also write the report as CSV")
    p.add_argument("--timeout", type=int, default=120, help="seconds per cell (default 120)")
    p.add_argument("--reference", type=Path, default=None,
                   help="pristine exercise notebooks whose checker cells are restored "
                        "(default: ./exercises when it exists; 'none' to trust the cells)")
    p.add_argument("--jobs", type=int, default=1, help="notebooks graded at once")
    p.add_argument("--summary", action="store_true",
                   help="also print a student × exercise table with points")
    args = p.parse_args(argv)
    if not args.dir.is_dir():
        print(f"no such folder: {args.dir}", file=sys.stderr)
        return 2
    reference = args.reference
    if reference is None:
        reference = COURSE_EXERCISES if COURSE_EXERCISES.is_dir() else None
        if reference is None:
            print(f"no exercises/ beside the package ({COURSE_EXERCISES}): checker cells are "
                  "graded as the students left them; pass --reference DIR", file=sys.stderr)
    elif str(reference) == "none":
        reference = None
    elif not reference.is_dir():
        print(f"no such reference folder: {reference}", file=sys.stderr)
        return 2
    if not find_notebooks(args.dir):
        print(f"no notebook found under {args.dir}", file=sys.stderr)
        return 2
    ignored = []
    results = grade(args.dir, args.timeout, reference, max(1, args.jobs), ignored=ignored)
    print(report(results))
    if args.summary:
        print(summary(results))
    for student, path in ignored:
        print(f"ignored (not a course exercise notebook): {student}: {path.name}")
    if args.csv is not None:
        write_csv(results, args.csv)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
