"""Which notebooks a grading run takes, and which cells of each are its exercises.

A class folder holds one folder per student; only the course's exercise notebooks are graded,
by name (:func:`select_notebooks`). In each, the checker cells are the nbgrader autograder
cells (:func:`exercise_cells`), put back from the pristine reference before grading
(:func:`restore_checkers`). Used by :mod:`llminfra.course.grade`.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from llminfra.course.exercises import checked_names
from llminfra.course.grade_report import Result


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


def select_notebooks(found: list[tuple[str, Path]], reference_dir: Path | None) -> tuple[
        list[tuple[str, Path]], list[tuple[str, Path]], list[tuple[str, str]]]:
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


def missing_results(student: str, name: str, reference: bytes) -> list[Result]:
    nb = nbformat.reads(reference.decode("utf-8"), as_version=4)
    return [Result(student, name, ex, "not attempted", "notebook missing from the student's folder")
            for _, ex in exercise_cells(nb)]


__all__ = ["exercise_cells", "find_notebooks", "missing_checkers", "missing_results",
           "restore_checkers", "select_notebooks"]
