"""Grade a folder of learners' exercise notebooks: ``python -m llminfra.course.grade DIR [--csv PATH]``.

``DIR`` holds one folder per student (``DIR/alice/03_precision_and_quantization.ipynb``), or the
notebooks of one student directly (the student is then ``DIR``'s name). Every exercise notebook
found is run top to bottom in a fresh kernel, from a copy of its own folder, with a time limit
per cell (a cell that runs over is interrupted and the rest still runs). Its exercises are the
cells that call a checker (nbgrader's autograder cells, see :mod:`llminfra.course.exercises`);
each gets one status from what its checker cell did (:mod:`llminfra.course.grade_status`):

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
* "the checker passed" is read from the kernel protocol, not from a printed line: each checker
  call runs in a cell of its own, and passes when the kernel's reply to that cell says it ran
  without an exception (:mod:`llminfra.course.grade_kernel`); there is no secret pass marker
  in the kernel for an answer to find and print;
* each notebook runs in its own throwaway copy of the course (:mod:`llminfra.course.
  grade_sandbox`): every notebook to grade, the reference notebooks and the package are read
  into memory before the first kernel starts, the kernel imports the package from a copy
  written from that memory, and its working folder is a copy of the learner's own files. An
  answer that rewrites a checker, the reference exercise or another student's notebook on disk
  changes no grade; the files are compared after each notebook, the reference and class
  notebooks put back, and the notebook reported as having rewritten them;
* every process a kernel started (its process group, and any descendant that left it) is
  killed when its notebook is done; a kernel that dies keeps the grades its notebook had
  earned before (the exercises after it are ``errored``: "the kernel died");
* ``not attempted`` needs the exercise's own stub: a checker's ``NotAttempted`` for an answer
  whose function no longer holds ``raise NotImplementedError`` (torch's own
  ``NotImplementedError``, from an op with no kernel for a dtype) is a failure with its message;
* a cell interrupted at the time limit, and every checker cell after it, is ``errored`` (an
  answer looping inside a bare ``except:`` swallows the interrupt: nothing after it ran);
* only the course's exercise notebooks are graded, by name (``Untitled.ipynb``,
  ``…-Copy1.ipynb`` are listed as ignored, never counted), and a notebook that other students
  of the class handed in but one did not gives each of its exercises ``not attempted`` for
  that one ("notebook missing").

Prints one block per student and a total (a progress bar on a terminal while it runs; the
kernels' start-up warnings silenced); ``--summary`` adds a class table that fits ~100 columns
(one line per student, one column of marks per chapter, the points:
:mod:`llminfra.course.grade_report`), ``--summary-only`` prints that table alone; ``--csv PATH``
writes the columns ``student, notebook, exercise, status, points, message, tampered`` (one row
per exercise) and ``PATH``'s ``-by-student.csv`` twin (one row per student, a column per
exercise); ``--handback DIR`` writes each student's Gradescope-style ``results.json`` and a
``feedback.md`` to hand back (:mod:`llminfra.course.grade_handback`). Every message is cut at
:data:`~llminfra.course.grade_report.MESSAGE_LIMIT` characters.
Tampering — a checker cell edited or replaced (even by a ``print('✓ …')``), the package
patched — is graded as if it had not happened and reported: on the exercise's line, with a
``†`` after the chapter's marks in the table and a list below it, in the CSV — once per
notebook: a change found before one exercise is not reported again under the later ones.
Needs only the course install (``make course``: nbclient, nbformat, ipykernel), none of the
test tools. Exits 0 whatever the learners' results; 2 when it
cannot do its own job (no such folder, no notebook found).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
from tqdm import tqdm

from llminfra.course.grade_handback import write_handback
from llminfra.course.grade_cells import (exercise_cells, find_notebooks, missing_checkers,
                                         missing_results, restore_checkers, select_notebooks)
from llminfra.course.grade_kernel import (checked_argument, grading_notebook, interrupted,
                                          role_of, run_notebook)
from llminfra.course.grade_report import (COLUMNS, MARKS, POINTS, STATUSES, Result, report,
                                          summary, write_csv, write_csv_by_student)
from llminfra.course.grade_sandbox import Tree, Watch, sandbox
from llminfra.course.grade_status import PASS_MARK, changes_note, status_of, still_stub

__all__ = ["grade", "grade_notebook", "main", "status_of", "changes_note", "still_stub",
           "Result", "report", "summary", "write_csv", "STATUSES", "COLUMNS", "POINTS", "MARKS",
           "PASS_MARK"]

#: the course's own exercise notebooks (the default reference), wherever the grader runs from
COURSE_EXERCISES = Path(__file__).resolve().parents[2] / "exercises"
#: the package the kernels import (each from its own copy, written from memory)
PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: the tamper note of an exercise whose checker cell differed from the reference's
EDITED_CHECKER = ("its checker cell had been edited or replaced (the reference's cell was put "
                  "back before grading)")


@dataclass
class _Executed:
    """What the kernel ran for each learner cell: its cell (a checker cell: its check cell),
    the check's tail, their replies, their positions in the run."""

    cells: list
    replies: dict
    tails: dict
    positions: dict


def _learner_view(nb, run) -> _Executed:
    cells, replies, tails, positions = list(nb.cells), {}, {}, {}
    for j, cell in enumerate(run.nb.cells):
        role, i = role_of(cell)
        if role in ("learner", "check"):
            cells[i], replies[i], positions[i] = cell, run.replies.get(j), j
        elif role == "tail":
            tails[i] = (cell, run.replies.get(j))
    return _Executed(cells, replies, tails, positions)


def _unreadable(student: str, name: str, e: Exception) -> list[Result]:
    return [Result(student, name, "*", "errored", f"cannot read the notebook: {e}")]


def grade_notebook(job: "Job") -> list[Result]:
    """Every exercise of one notebook, graded in its sandbox; never raises for a learner's
    mistake."""
    student, name = job.student, job.name
    try:
        nb = nbformat.reads(job.text.decode("utf-8"), as_version=4)
    except Exception as e:  # noqa: BLE001 - an unreadable notebook is a result, not a crash
        return _unreadable(student, name, e)
    missing, edited = [], []
    if job.reference is not None:
        reference = nbformat.reads(job.reference.decode("utf-8"), as_version=4)
        edited = restore_checkers(nb, reference)
        missing = missing_checkers(nb, reference)
    gone = [Result(student, name, ex, "errored", "the checker cell was deleted from the "
                   "notebook") for ex in missing]
    cells = exercise_cells(nb)
    if not cells:
        return gone
    runnable = grading_notebook(nb, {i for i, _ in cells}, name[:2])
    with sandbox(job.package, job.folder, job.class_root) as (cwd, env):
        run = run_notebook(runnable, cwd, job.timeout_s, job.kernel, env)
    guard_reply = run.replies.get(0)
    if run.died_at == 0 or guard_reply is None or guard_reply.get("status") != "ok":
        why = run.died or status_of(run.nb.cells[0], guard_reply, checker=False)[1]
        return [Result(student, name, ex, "errored", f"the grader's guard cell failed "
                       f"({why or 'no reply'}); nothing was graded") for _, ex in cells] + gone
    ran = _learner_view(nb, run)
    return _results(student, name, nb, ran, run, cells, edited) + gone


def _results(student, name, nb, ran: _Executed, run, cells, edited) -> list[Result]:
    stopped = next((i for i, cell in enumerate(ran.cells) if cell.cell_type == "code"
                    and (interrupted(cell) or interrupted(ran.tails.get(i, ({},))[0]))), None)
    died_in = role_of(run.nb.cells[run.died_at])[1] if run.died_at is not None else None
    reported: set[str] = set()
    results = []
    for i, ex in cells:
        tail, tail_reply = ran.tails.get(i, (None, None))
        status, message = status_of(ran.cells[i], ran.replies.get(i), tail,
                                    tail_reply=tail_reply)
        if status == "not attempted" and not still_stub(nb, i):
            answer = checked_argument(nb.cells[i].source)
            status, message = "failed", (f"{message} — but `{answer}` "
                                         "no longer holds the exercise's stub: the "
                                         "NotImplementedError came from code it calls (a torch "
                                         "op with no kernel for this dtype?)")
        if run.died_at is not None and ran.positions.get(i, 0) >= run.died_at:
            where = ("while this cell ran" if died_in == i
                     else f"in cell {died_in}, before this cell ran")
            status, message = "errored", f"the kernel died {where} ({run.died})"
        if stopped is not None and i > stopped:
            status, message = "errored", (f"not graded: cell {stopped} was interrupted at the "
                                          "time limit, so the cells after it did not run as "
                                          "written")
        cause = _earlier_error(ran.cells, i, {j for j, _ in cells})
        if status == "errored" and cause and stopped is None and run.died_at is None:
            message += f" (after {cause})"
        note = changes_note(ran.cells[i], reported)
        if note:
            message = f"{message}; {note}" if message else note
        tampered = ([EDITED_CHECKER] if ex in edited else []) + ([note] if note else [])
        results.append(Result(student, name, ex, status, message, "; ".join(tampered)))
    return results


def _earlier_error(cells, before: int, checker_cells: set[int]) -> str:
    """``"cell N raised Ename: value"`` for the last non-checker cell before ``before`` that
    raised (a syntax error in an answer, a time-out in the set-up), else ''."""
    for j in range(before - 1, -1, -1):
        if j in checker_cells or cells[j].cell_type != "code":
            continue
        status, message = status_of(cells[j], checker=False)
        if status == "errored" and cells[j].get("execution_count") is not None:
            first = message.splitlines()[0][:200] if message else "an error"
            return f"cell {j} raised {first}"
    return ""


@dataclass
class Job:
    """One notebook to grade, with everything read before grading began."""

    student: str
    name: str
    text: bytes
    folder: Path
    class_root: Path
    reference: bytes | None
    package: Tree
    timeout_s: int
    kernel: str = "python3"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        return f"cannot read: {e}".encode()


def _disk_note(changes: list[tuple[Path, bool]], jobs: int) -> str:
    """The tamper note for files a notebook rewrote on disk (``(path, put_back)`` pairs)."""
    if not changes:
        return ""
    files = "; ".join(f"{path} ({'put back' if back else 'not put back: reinstall the course'})"
                      for path, back in changes)
    who = "" if jobs == 1 else f" (or a notebook graded at the same time, --jobs {jobs})"
    return (f"rewrote files outside its own folder while it ran{who}: {files} — every grade "
            "used the copies read before grading")


def grade(root: Path, timeout_s: int = 120, reference_dir: Path | None = None, jobs: int = 1,
          kernel: str = "python3", ignored: list | None = None,
          package_dir: Path = PACKAGE_DIR) -> list[Result]:
    """Grade every exercise notebook under ``root`` (``jobs`` notebooks at a time), each in its
    own sandbox (the module docstring). With ``reference_dir``, only its notebooks' names are
    graded; the paths left out are appended to ``ignored`` when a list is given."""
    graded, left_out, missing = select_notebooks(find_notebooks(root), reference_dir)
    if ignored is not None:
        ignored.extend(left_out)
    texts = {path: _read(path) for _, path in graded}
    names = sorted({p.name for _, p in graded} | {n for _, n in missing})
    references = ({n: _read(reference_dir / n) for n in names}
                  if reference_dir is not None else {})
    package = Tree(package_dir)
    watch = Watch()
    watch.add_tree(package, restore=False)
    for path, data in texts.items():
        watch.add(path, data, restore=True)
    for n, data in references.items():
        watch.add(reference_dir / n, data, restore=True)
    work = [Job(student, path.name, texts[path], path.parent, root, references.get(path.name),
                package, timeout_s, kernel) for student, path in graded]
    progress = dict(total=len(work), desc="grading", unit="notebook", file=sys.stderr,
                    disable=None)  # disable=None: shown on a terminal only
    batches = []

    def checked(batch: list[Result]) -> list[Result]:
        note = _disk_note(watch.changed(), jobs)
        if note and batch:
            first = batch[0]
            both = "; ".join(t for t in (first.tampered, note) if t)
            batch[0] = Result(first.student, first.notebook, first.exercise, first.status,
                              first.message, both)
        return batch

    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            batches = [checked(b) for b in tqdm(pool.map(grade_notebook, work), **progress)]
    else:
        batches = [checked(grade_notebook(job)) for job in tqdm(work, **progress)]
    results = [r for batch in batches for r in batch]
    for student, name in missing:
        results += missing_results(student, name, references[name])
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
    p.add_argument("--handback", type=Path, default=None,
                   help="write each student's results.json (Gradescope's format) and "
                        "feedback.md under DIR/<student>/")
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
        wide = args.csv.with_name(args.csv.stem + "-by-student.csv")
        write_csv_by_student(results, wide)
        print(f"wrote {args.csv} and {wide}")
    if args.handback is not None:
        written = write_handback(results, args.handback)
        print(f"wrote results.json and feedback.md for {len(written)} students under "
              f"{args.handback}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
