"""Generate ``exercises/`` from ``solutions/``: ``python -m llminfra.course.exercises [--check]``.

Between nbgrader's markers ``### BEGIN SOLUTION`` and ``### END SOLUTION`` the solution's code is
replaced by ``raise NotImplementedError("…")`` at the same indentation; everything else is kept,
and every output is cleared so the learner starts from a fresh notebook.

Both versions carry nbgrader's cell metadata (:func:`annotate`): a cell with a solution block is
an answer cell (``grade_id`` ``"NN-name-answer"``), a cell that calls a ``check_…`` function is a
locked autograder cell worth one point (``grade_id`` ``"NN-name"``, the exercise's id in
``python -m llminfra.course.grade``), so a course on nbgrader can autograde them as they are.
Generating also writes that metadata into ``solutions/`` (outputs untouched). ``--check`` writes
nothing and exits 1 when ``exercises/`` or the solutions' metadata differ from what would be
generated (stale or missing), or ``exercises/`` holds a notebook with no solution twin.

A learner works in ``exercises/``, so a notebook there may hold their work: answer cells filled
in, outputs of their runs, cells of their own. That is never "stale" and never overwritten:

* ``--check`` compares everything of the course's — the cells' order, types, sources and
  nbgrader metadata — except what is the learner's (an answer cell's source, outputs,
  execution counts, JupyterLab's cell and notebook metadata, cells the learner added); a
  notebook whose course cells are up to date passes, whatever the answers;
* where the course's cells did change (a ``git pull`` brought new prose or checkers), generating
  writes the new notebook with the learner's answer cells carried over (by ``grade_id``) and
  first copies the learner's file to ``exercises/backup/``; ``--check`` says so, and advises
  nothing that deletes a learner's work.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("your code here")'
CHECK_CALL = re.compile(r"\bcheck_(\w+)\(")
DEFINED = re.compile(r"^(?:def|class)\s+(\w+)", re.MULTILINE)
NBGRADER_SCHEMA = 3


def checked_names(source: str) -> list[str]:
    """The exercises a cell checks: ``ch03.check_absmax_int8(f)`` -> ``["absmax_int8"]``."""
    return [m.group(1) for m in CHECK_CALL.finditer(source) if not source[:m.start()].endswith("def ")]


def nbgrader_metadata(cell, chapter: str) -> dict | None:
    """nbgrader's metadata for ``cell`` (None for a cell that is neither an answer nor a check).

    Raises ``ValueError`` for a cell that checks two exercises (split it: one grade per cell).
    """
    if cell.cell_type != "code":
        return None
    if BEGIN in cell.source:
        names = DEFINED.findall(cell.source) or ["answer"]
        return {"grade": False, "grade_id": f"{chapter}-{names[0]}-answer", "locked": False,
                "schema_version": NBGRADER_SCHEMA, "solution": True, "task": False}
    names = checked_names(cell.source)
    if len(names) > 1:
        raise ValueError(f"one cell checks {names}: put each check in its own cell")
    if names:
        return {"grade": True, "grade_id": f"{chapter}-{names[0]}", "locked": True, "points": 1,
                "schema_version": NBGRADER_SCHEMA, "solution": False, "task": False}
    return None


def annotate(nb: nbformat.NotebookNode, chapter: str) -> nbformat.NotebookNode:
    """Set (or clear) every cell's ``metadata.nbgrader``; return ``nb`` (changed in place)."""
    for cell in nb.cells:
        meta = nbgrader_metadata(cell, chapter)
        if meta is None:
            cell.metadata.pop("nbgrader", None)
        else:
            cell.metadata["nbgrader"] = meta
    return nb


def strip_solution(source: str) -> str:
    """Replace every marked block in ``source`` by one stub line at the block's indentation.

    Raises ``ValueError`` for unbalanced markers.
    """
    out, inside, found = [], False, False
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"nested {BEGIN!r}")
            inside, found = True, True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + STUB)
        elif stripped == END:
            if not inside:
                raise ValueError(f"{END!r} without {BEGIN!r}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN!r} without {END!r}")
    return "\n".join(out) if found else source


def make_exercise(solution: nbformat.NotebookNode, chapter: str = "00") -> nbformat.NotebookNode:
    """The exercise twin of a solution notebook: stubs in, outputs out, nbgrader metadata on."""
    nb = annotate(nbformat.from_dict(solution), chapter)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = strip_solution(cell.source)
            cell.outputs = []
            cell.execution_count = None
        cell.get("metadata", {}).pop("execution", None)
    nb.metadata.pop("widgets", None)
    return nb


def _render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


# ------------------------------------------------------- the learner's work in exercises/
def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _is_answer(cell) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution"))


def _course_key(cell) -> tuple:
    """What of a cell is the course's: its type, nbgrader metadata and source — an answer
    cell's source is the learner's (only its ``grade_id`` counts)."""
    meta = cell.get("metadata", {}).get("nbgrader")
    return (cell.cell_type, repr(sorted(meta.items())) if meta else "",
            None if _is_answer(cell) else cell.source)


def _align(current, wanted) -> tuple[list[int] | None, list[int]]:
    """``(positions, extra)``: for each cell of ``wanted`` in order, the index of the cell of
    ``current`` that holds it (None for all when one is missing: the course's cells differ);
    ``extra``: the indices of ``current``'s other cells (the learner's own)."""
    positions, j = [], 0
    for cell in wanted.cells:
        key = _course_key(cell)
        while j < len(current.cells) and _course_key(current.cells[j]) != key:
            j += 1
        if j == len(current.cells):
            return None, []
        positions.append(j)
        j += 1
    extra = [k for k in range(len(current.cells)) if k not in set(positions)]
    return positions, extra


def learner_work(current, wanted) -> list[str]:
    """What in the exercise notebook ``current`` is a learner's (empty: nothing; it is then
    safe to overwrite): answer cells changed from the stub, outputs of a run, cells of their
    own (more cells than ``wanted``, the notebook as generated)."""
    stubs = {_grade_id(c): c.source for c in wanted.cells if _is_answer(c)}
    work = []
    answers = [_grade_id(c) for c in current.cells
               if _is_answer(c) and c.source != stubs.get(_grade_id(c))]
    if answers:
        work.append(f"answers in {', '.join(answers)}")
    if any(c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))
           for c in current.cells):
        work.append("outputs of a run")
    # more cells than the course's version: the learner's own (an old version's cell that the
    # course changed in place is not counted; one the course removed is, and kept: harmless)
    own = len(current.cells) - len(wanted.cells)
    if own > 0:
        work.append(f"{own} cell(s) of your own")
    return work


def course_cells_match(current, wanted) -> bool:
    """Are all of ``wanted``'s cells in ``current``, in order, as the course wrote them
    (answer cells' sources, outputs, other metadata and the learner's own cells aside)?"""
    positions, _ = _align(current, wanted)
    return positions is not None


def carry_answers(current, wanted) -> tuple[nbformat.NotebookNode, int]:
    """``wanted`` with the learner's answer cells of ``current`` (by ``grade_id``) in place
    of the stubs; returns it and how many answers were carried over."""
    mine = {_grade_id(c): c.source for c in current.cells if _is_answer(c)}
    out = nbformat.from_dict(wanted)
    carried = 0
    for cell in out.cells:
        if _is_answer(cell) and _grade_id(cell) in mine and mine[_grade_id(cell)] != cell.source:
            cell.source = mine[_grade_id(cell)]
            carried += 1
    return out, carried


def _backup(target: Path) -> Path:
    """Copy ``target`` to ``exercises/backup/<name>-<time>.ipynb`` before it is rewritten."""
    folder = target.parent / "backup"
    folder.mkdir(exist_ok=True)
    copy = folder / f"{target.stem}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
    shutil.copy2(target, copy)
    return copy


def _update(target: Path, current_text: str, wanted: nbformat.NotebookNode, text: str,
            check: bool) -> list[str]:
    """Compare (``check``) or write one exercise notebook, keeping a learner's work."""
    try:
        current = nbformat.reads(current_text, as_version=4)
    except Exception:  # noqa: BLE001 - an unreadable file is replaced only after a backup
        current = None
    work = learner_work(current, wanted) if current is not None else ["an unreadable file"]
    if not work:
        if check:
            return [f"{target} is stale"]
        target.write_text(text)
        return []
    if current is not None and course_cells_match(current, wanted):
        return []                       # the learner's work; the course's cells are current
    if check:
        return [f"{target} holds your work ({'; '.join(work)}) and the course's prose or "
                f"checker cells in it differ from solutions/{target.name}"]
    copy = _backup(target)
    merged, carried = carry_answers(current, wanted) if current is not None else (wanted, 0)
    target.write_text(_render(merged))
    print(f"{target}: updated from solutions/, {carried} of your answer cells kept; your "
          f"previous file is {copy}", file=sys.stderr)
    return []


def generate(solutions: Path, exercises: Path, check: bool = False,
             keep_work: bool = True, written: list[Path] | None = None) -> list[str]:
    """Write (or with ``check``, compare) every exercise; return the problems found. A
    learner's work in ``exercises/`` is kept (module docstring); ``keep_work=False`` writes
    every notebook pristine, answers and all gone (a teacher's ``make reset-exercises``).
    ``written`` (a list) is given every file written (notebooks of both folders)."""
    written = [] if written is None else written
    problems = []
    wanted = {}
    for path in sorted(solutions.glob("*.ipynb")):
        chapter = path.name.split("_", 1)[0]
        solution = nbformat.read(path, as_version=4)
        annotated = _render(annotate(nbformat.from_dict(solution), chapter))
        if annotated != _render(solution):
            if check:
                problems.append(f"{path} lacks its nbgrader metadata")
            else:
                path.write_text(annotated)
                written.append(path)
        wanted[path.name] = make_exercise(solution, chapter)
    for name, nb in wanted.items():
        target, text = exercises / name, _render(nb)
        current = target.read_text() if target.exists() else None
        if current == text:
            continue
        if current is not None and (check or keep_work):
            found = _update(target, current, nb, text, check)
            problems += found
            if not check and not found and target.read_text() != current:
                written.append(target)
        elif check:
            problems.append(f"{target} is missing")
        else:
            exercises.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            written.append(target)
    for extra in sorted(exercises.glob("*.ipynb")):
        if extra.name not in wanted:
            problems.append(f"{extra} has no twin in {solutions}/")
    return problems


def _summary(solutions: Path, exercises: Path, check: bool, written: list[Path]) -> str:
    """One line on success: what was checked, or what was written."""
    n = len(list(solutions.glob("*.ipynb")))
    if check:
        return (f"{exercises}/: all {n} exercise notebooks match {solutions}/ (stubs, prose, "
                f"checker cells, nbgrader metadata); nothing written")
    if not written:
        return f"{exercises}/: all {n} exercise notebooks were already up to date; nothing written"
    names = ", ".join(str(p) for p in written)
    return f"wrote {len(written)} notebook(s) from {solutions}/ ({names}); the rest of {n} were up to date"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    p.add_argument("--solutions", type=Path, default=Path("solutions"))
    p.add_argument("--exercises", type=Path, default=Path("exercises"))
    args = p.parse_args(argv)
    written: list[Path] = []
    problems = generate(args.solutions, args.exercises, check=args.check, written=written)
    for prob in problems:
        print(prob, file=sys.stderr)
    if not problems:
        print(_summary(args.solutions, args.exercises, args.check, written))
    if args.check and problems:
        print("run `python -m llminfra.course.exercises` to update exercises/ from solutions/: "
              "it keeps your answer cells, and first copies each notebook of yours it changes "
              "to exercises/backup/", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
