"""The grading command on a class folder: a stub, a solution and a wrong answer per exercise of
one chapter (07, three exercises, the quickest to run), plus a time-out and an unreadable file.

Runs 4 kernels (~5 s each on an idle 2-core machine); the other chapters use the same
machinery (their checker cells carry the same metadata, tested in test_exercises.py)."""

import csv
from pathlib import Path

import nbformat
import pytest

from llminfra.course import grade
from llminfra.course.exercises import annotate

ROOT = Path(__file__).resolve().parents[1]
NB07 = "07_tensor_and_pipeline_parallelism.ipynb"


def _wrong_07() -> nbformat.NotebookNode:
    """The solution with every answer broken a different way: column_shard takes rows (a wrong
    answer), row_shard raises inside (the checker reports it: failed), bubble's cell has a
    syntax error (its check cannot run: errored)."""
    nb = nbformat.read(ROOT / "solutions" / NB07, as_version=4)
    edits = {"return A[rank * k:(rank + 1) * k, :]\n": "return A[rank * k:(rank + 1) * k, :] + oops\n",
             "return A[:, rank * k:(rank + 1) * k]": "return A[rank * k:(rank + 1) * k, :]",
             "return (p - 1) / (m + p - 1)": "return (p - 1) / (m + p - 1"}
    done = set()
    for cell in nb.cells:
        for old, new in edits.items():
            if old in cell.source and old not in done:
                cell.source = cell.source.replace(old, new, 1)
                done.add(old)
    assert len(done) == 3, "the solution changed: update the edits"
    return nb


def _sleeper() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import time\ntime.sleep(60)\ncheck_x = 1"),
                nbformat.v4.new_code_cell("print('after')")]
    nb.cells[0].metadata["nbgrader"] = {"grade": True, "grade_id": "99-sleep", "points": 1}
    return nb


@pytest.fixture(scope="module")
def class_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    for student in ("ada", "bo", "cy"):
        (root / student).mkdir()
    (root / "ada" / NB07).write_text((ROOT / "exercises" / NB07).read_text())   # untouched stub
    (root / "bo" / NB07).write_text((ROOT / "solutions" / NB07).read_text())    # solution
    nbformat.write(_wrong_07(), root / "cy" / NB07)                             # wrong answers
    (root / "cy" / ".ipynb_checkpoints").mkdir()
    (root / "cy" / ".ipynb_checkpoints" / NB07).write_text("{}")
    return root


@pytest.fixture(scope="module")
def graded(class_folder):
    csv_path = class_folder.parent / "report.csv"
    rc = grade.main([str(class_folder), "--csv", str(csv_path), "--timeout", "300", "--jobs", "2",
                     "--reference", str(ROOT / "exercises")])
    assert rc == 0
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    return rows, csv_path


def test_csv_columns_and_one_row_per_exercise(graded):
    rows, path = graded
    assert path.read_text().splitlines()[0] == "student,notebook,exercise,status,message"
    keys = {(r["student"], r["notebook"], r["exercise"]) for r in rows}
    assert len(keys) == len(rows) == 3 + 3 + 3
    assert {r["status"] for r in rows} <= set(grade.STATUSES)


def _status(rows, student, exercise):
    (row,) = [r for r in rows if r["student"] == student and r["exercise"] == exercise]
    return row["status"], row["message"]


def test_stub_solution_and_wrong_answers_are_each_reported(graded):
    rows, _ = graded
    for ex in ("07-column_shard", "07-row_shard", "07-bubble"):
        assert _status(rows, "ada", ex)[0] == "not attempted"
        assert _status(rows, "bo", ex) == ("passed", "")
    status, message = _status(rows, "cy", "07-column_shard")
    assert status == "failed" and "seed" in message and "case 1 of" in message
    status, message = _status(rows, "cy", "07-row_shard")
    assert status == "failed" and "row_shard raised NameError: name 'oops'" in message
    status, message = _status(rows, "cy", "07-bubble")
    assert status == "errored" and "NameError" in message and "SyntaxError" in message


def test_time_out_and_unreadable_notebook_are_errored(tmp_path):
    """A flat folder (one student): a cell over the time limit, a file that is not JSON."""
    nbformat.write(_sleeper(), tmp_path / "99_sleep.ipynb")
    (tmp_path / "98_broken.ipynb").write_text("{ not json")
    results = {r.exercise: r for r in grade.grade(tmp_path, timeout_s=5)}
    assert results["99-sleep"].status == "errored"
    assert "longer than the time limit" in results["99-sleep"].message
    assert results["*"].status == "errored" and "cannot read" in results["*"].message
    assert results["*"].student == tmp_path.name


def test_an_edited_checker_cell_is_restored_from_the_reference(tmp_path):
    """A learner who replaces the check by `pass` does not pass (no kernel needed to see it)."""
    nb = nbformat.read(ROOT / "exercises" / NB07, as_version=4)
    cells = grade.exercise_cells(nb)
    for i, _ in cells:
        nb.cells[i].source = "pass"
    grade.restore_checkers(nb, nbformat.read(ROOT / "exercises" / NB07, as_version=4))
    assert all("check_" in nb.cells[i].source for i, _ in cells)


def test_a_deleted_checker_cell_is_reported():
    reference = nbformat.read(ROOT / "exercises" / NB07, as_version=4)
    nb = nbformat.read(ROOT / "exercises" / NB07, as_version=4)
    i, ex = grade.exercise_cells(nb)[-1]
    del nb.cells[i]
    assert grade.missing_checkers(nb, reference) == [ex] == ["07-bubble"]


def test_status_of_a_checker_cell():
    cell = nbformat.v4.new_code_cell("check(f)")
    cell.execution_count = 3

    def err(ename):
        return [nbformat.v4.new_output("error", ename=ename, evalue="why", traceback=[])]
    assert grade.status_of(cell) == ("passed", "")
    cell.outputs = err("CheckFailed")
    assert grade.status_of(cell) == ("failed", "why")
    cell.outputs = err("NotAttempted")
    assert grade.status_of(cell) == ("not attempted", "why")
    cell.outputs = err("NameError")
    assert grade.status_of(cell) == ("errored", "NameError: why")
    cell.outputs, cell.execution_count = [], None
    assert grade.status_of(cell)[0] == "errored"


def test_flat_folder_is_one_student(tmp_path):
    nbformat.write(annotate(nbformat.v4.new_notebook(), "01"), tmp_path / "01_a.ipynb")
    assert grade.find_notebooks(tmp_path) == [(tmp_path.name, tmp_path / "01_a.ipynb")]


def test_own_failures_exit_2(tmp_path, capsys):
    assert grade.main([str(tmp_path / "missing")]) == 2
    assert grade.main([str(tmp_path)]) == 2
    assert "no notebook found" in capsys.readouterr().err


def test_report_totals():
    results = [grade.Result("a", "n", "e1", "passed"), grade.Result("a", "n", "e2", "failed", "x\ny"),
               grade.Result("b", "n", "e1", "not attempted")]
    text = grade.report(results)
    assert "a: 1 of 2 exercises passed" in text and "b: 0 of 1 exercises passed" in text
    assert text.splitlines()[-1].startswith("total: 1 passed, 1 failed, 1 not attempted, 0 errored")
