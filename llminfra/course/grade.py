"""Grade a folder of learners' exercise notebooks: ``python -m llminfra.course.grade DIR [--csv PATH]``.

``DIR`` holds one folder per student (``DIR/alice/03_precision_and_quantization.ipynb``), or the
notebooks of one student directly (the student is then ``DIR``'s name). Every exercise notebook
found is run top to bottom in a fresh kernel, from its own folder, with a time limit per cell
(a cell that runs over is interrupted and the rest still runs). Its exercises are the cells that
call a checker (nbgrader's autograder cells, see :mod:`llminfra.course.exercises`); each gets
one status from what its checker cell did:

* ``passed`` — the checker returned and printed its ``✓`` line. When a later line of the same
  cell (the course's example print after the check) then raised, the exercise is still
  ``passed``, with that error as a note: the checker is the judge, and an answer it accepts
  must not lose its point to the example's formatting;
* ``failed`` — the checker raised ``CheckFailed`` (the message is the checker's diagnosis);
* ``not attempted`` — the checker raised ``NotAttempted``: the learner's function is still the
  stub that raises ``NotImplementedError``;
* ``errored`` — anything else (a ``NameError`` because the answer cell has a syntax error, a
  time-out, a kernel that died, a notebook that cannot be read).

A teacher can trust a ``passed``:

* the checker cells are first restored from the pristine exercise notebook of the same name
  (``--reference DIR``; default: the course's own ``exercises/``, found from the package, from
  any working directory), so an edited checker cell grades nothing;
* the package is put back as imported before each checker cell, and the answers' changes to it
  re-applied after (:mod:`llminfra.course.grade_guard`): an answer cell that replaced a checker,
  ``run_checks``, or the package function a checker computes its expected values with
  (``llminfra.parallel.pipeline.bubble_fraction = my_wrong_bubble``) is graded against the
  package's own code, and the result's message names what it had changed;
* "the checker returned" is a line only the grader can print (a random marker per notebook,
  :mod:`llminfra.course.grade_kernel`), so an answer that prints a ``✓`` line itself passes
  nothing;
* a cell interrupted at the time limit, and every checker cell after it, is ``errored`` (an
  answer looping inside a bare ``except:`` swallows the interrupt: nothing after it ran);
* only the course's exercise notebooks are graded, by name (``Untitled.ipynb``,
  ``…-Copy1.ipynb`` are listed as ignored, never counted), and a notebook that other students
  of the class handed in but one did not gives each of its exercises ``not attempted`` for
  that one ("notebook missing").

Prints one block per student and a total (a progress bar on a terminal while it runs; the
kernels' start-up warnings silenced); ``--summary`` adds a class table that fits ~100 columns
(one line per student, one column of marks per chapter, the points:
:mod:`llminfra.course.grade_report`), ``--summary-only`` prints that table alone; ``--csv``
writes the columns ``student, notebook, exercise, status, points, message, tampered``.
Tampering — a checker cell edited or replaced (even by a ``print('✓ …')``), the package
patched — is graded as if it had not happened and reported: on the exercise's line, with a
``†`` after the chapter's marks in the table and a list below it, in the CSV. Needs only the course install (``make course``: nbclient,
nbformat, ipykernel), none of the test tools. Exits 0 whatever the learners' results; 2 when it
cannot do its own job (no such folder, no notebook found).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat
from tqdm import tqdm

from llminfra.course.exercises import checked_names
from llminfra.course.grade_kernel import (TIMEOUT_ENAME, checker_cell, guard_cell, interrupted,
                                          new_marker, read_stdout, run_notebook)
from llminfra.course.grade_report import (COLUMNS, MARKS, POINTS, STATUSES, Result, report,
                                          summary, write_csv)

__all__ = ["grade", "grade_notebook", "main", "status_of", "Result", "report", "summary",
           "write_csv", "STATUSES", "COLUMNS", "POINTS", "MARKS"]

#: the course's own exercise notebooks (the default reference), wherever the grader runs from
COURSE_EXERCISES = Path(__file__).resolve().parents[2] / "exercises"
#: what a checker cell prints when its checker passes (run_checks and every custom checker)
PASS_MARK = "✓"
#: the tamper note of an exercise whose checker cell differed from the reference's
EDITED_CHECKER = ("its checker cell had been edited or replaced (the reference's cell was put "
                  "back before grading)")


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


def _same_code(a: str, b: str) -> bool:
    """The same source but for blank lines and trailing spaces."""
    lines = lambda text: [line.rstrip() for line in text.strip().splitlines() if line.strip()]  # noqa: E731
    return lines(a) == lines(b)


def restore_checkers(nb, reference) -> list[str]:
    """Put back the source of every checker cell of ``reference`` (by ``grade_id``); returns
    the exercise ids whose checker cell had been edited (a ``print('✓ …')`` in place of the
    check, a ``pass``): graded with the pristine cell, and reported as tampered with."""
    pristine = {cell.metadata["nbgrader"]["grade_id"]: cell.source for cell in reference.cells
                if cell.get("metadata", {}).get("nbgrader", {}).get("grade")}
    edited = []
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in pristine:
            if not _same_code(cell.source, pristine[grade_id]):
                edited.append(grade_id)
            cell.source = pristine[grade_id]
    return edited


def missing_checkers(nb, reference) -> list[str]:
    """The exercise ids of ``reference`` whose checker cell ``nb`` no longer has."""
    present = {ex for _, ex in exercise_cells(nb)}
    return [ex for _, ex in exercise_cells(reference) if ex not in present]


def status_of(cell, checker: bool = True, marker: str = "") -> tuple[str, str]:
    """``(status, message)`` from the outputs of an executed checker cell (``checker=False``:
    any other cell, which passes without printing a ``✓`` line). ``marker``: the grader's token
    (:mod:`llminfra.course.grade_kernel`); with it, a pass needs the marked "returned" line, and
    an error after that line (a follow-up line of the cell) leaves the exercise passed, with a
    note."""
    printed, _, returned = read_stdout(cell, marker)
    for out in cell.get("outputs", []):
        if out.get("output_type") != "error":
            continue
        ename, evalue = out.get("ename", ""), out.get("evalue", "")
        if ename in (TIMEOUT_ENAME, "KeyboardInterrupt"):
            return "errored", f"interrupted: the cell ran longer than the time limit ({evalue or ename})"
        if checker and returned and PASS_MARK in printed:
            return "passed", (f"the checker passed; a later line of its cell then raised "
                              f"{ename}: {evalue}")
        if ename == "NotAttempted":
            return "not attempted", evalue
        if ename == "CheckFailed":
            return "failed", evalue
        return "errored", f"{ename}: {evalue}"
    if cell.get("execution_count") is None:
        return "errored", "the cell did not run (the kernel stopped before it)"
    if checker and (PASS_MARK not in printed or (marker and not returned)):
        return "errored", "the checker did not report a pass (no ✓ line in the cell's output)"
    return "passed", ""


def changes_note(cell, marker: str) -> str:
    """The guard's note on a checker cell: what the answers had changed in the package."""
    changed = [note.removeprefix("changed ") for note in read_stdout(cell, marker)[1]
               if note.startswith("changed ")]
    if not changed:
        return ""
    return ("the answer cells had changed " + "; ".join(changed) + " — put back for the check, "
            "so it judged the answer against the package's own code")


def grade_notebook(student: str, path: Path, timeout_s: int, reference_dir: Path | None,
                   kernel: str = "python3") -> list[Result]:
    """Every exercise of one notebook, graded; never raises for a learner's mistake."""
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 - an unreadable notebook is a result, not a crash
        return [Result(student, path.name, "*", "errored", f"cannot read the notebook: {e}")]
    ref_path = reference_dir / path.name if reference_dir is not None else None
    missing, edited = [], []
    if ref_path is not None and ref_path.exists():
        reference = nbformat.read(ref_path, as_version=4)
        edited = restore_checkers(nb, reference)
        missing = missing_checkers(nb, reference)
    gone = [Result(student, path.name, ex, "errored", "the checker cell was deleted from the "
                   "notebook") for ex in missing]
    cells = exercise_cells(nb)
    if not cells:
        return gone
    chapter, marker = path.name[:2], new_marker()
    for i, _ in cells:
        nb.cells[i].source = checker_cell(nb.cells[i].source, chapter, marker)
    nb.cells.insert(0, guard_cell(marker, chapter))
    try:
        ran = run_notebook(nb, path.parent, timeout_s, kernel)
    except Exception as e:  # noqa: BLE001 - a dead kernel fails this notebook only
        return [Result(student, path.name, ex, "errored", f"{type(e).__name__}: {e}")
                for _, ex in cells]
    guard = ran.cells.pop(0)         # the cell indices are the learner's again
    status, message = status_of(guard, checker=False)
    if status != "passed":
        return [Result(student, path.name, ex, "errored", f"the grader's guard cell failed "
                       f"({message}); nothing was graded") for _, ex in cells]
    results = []
    stopped = next((j for j, cell in enumerate(ran.cells)
                    if cell.cell_type == "code" and interrupted(cell)), None)
    for i, ex in cells:
        status, message = status_of(ran.cells[i], marker=marker)
        if stopped is not None and i > stopped:
            status, message = "errored", (f"not graded: cell {stopped} was interrupted at the "
                                          "time limit, so the cells after it did not run as "
                                          "written")
        cause = _earlier_error(ran, i, {j for j, _ in cells})
        if status == "errored" and cause and stopped is None:
            message += f" (after {cause})"
        note = changes_note(ran.cells[i], marker)
        if note:
            message = f"{message}; {note}" if message else note
        tampered = ([EDITED_CHECKER] if ex in edited else []) + ([note] if note else [])
        results.append(Result(student, path.name, ex, status, message, "; ".join(tampered)))
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="one folder per student, or one student's notebooks")
    p.add_argument("--csv", type=Path, help="also write the report as CSV")
    p.add_argument("--timeout", type=int, default=120, help="seconds per cell (default 120)")
    p.add_argument("--reference", type=Path, default=None,
                   help="pristine exercise notebooks whose checker cells are restored "
                        "(default: the course's exercises/, from any folder; 'none' to trust "
                        "the cells)")
    p.add_argument("--jobs", type=int, default=1, help="notebooks graded at once")
    p.add_argument("--summary", action="store_true",
                   help="also print the class table: one line per student, one column of "
                        "marks per chapter, the points, what was tampered with")
    p.add_argument("--summary-only", action="store_true",
                   help="print the class table alone, without the per-exercise report")
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
    if not args.summary_only:
        print(report(results))
    if args.summary or args.summary_only:
        print(summary(results))
    for student, path in ignored:
        print(f"ignored (not a course exercise notebook): {student}: {path.name}")
    if args.csv is not None:
        write_csv(results, args.csv)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
