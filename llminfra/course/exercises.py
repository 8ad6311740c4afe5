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
"""

from __future__ import annotations

import argparse
import re
import sys
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


def generate(solutions: Path, exercises: Path, check: bool = False) -> list[str]:
    """Write (or with ``check``, compare) every exercise; return the problems found."""
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
        wanted[path.name] = _render(make_exercise(solution, chapter))
    for name, text in wanted.items():
        target = exercises / name
        current = target.read_text() if target.exists() else None
        if current == text:
            continue
        if check:
            problems.append(f"{target} is {'missing' if current is None else 'stale'}")
        else:
            exercises.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    for extra in sorted(exercises.glob("*.ipynb")):
        if extra.name not in wanted:
            problems.append(f"{extra} has no twin in {solutions}/")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    p.add_argument("--solutions", type=Path, default=Path("solutions"))
    p.add_argument("--exercises", type=Path, default=Path("exercises"))
    args = p.parse_args(argv)
    problems = generate(args.solutions, args.exercises, check=args.check)
    for prob in problems:
        print(prob, file=sys.stderr)
    if args.check and problems:
        print("run `python -m llminfra.course.exercises` to regenerate", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
