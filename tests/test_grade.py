"""The grading command on a class folder: a stub, a solution and a wrong answer per exercise of
one chapter (07, three exercises, the quickest to run), plus a time-out and an unreadable file;
then what a teacher must be able to trust: a hang under a bare ``except:``, a monkeypatched
checker, a patched reference function, a ✓ line printed by the answer itself, an example line
that raises after the checker passed, stray copies, a run from another folder, a quiet terminal.

Runs 10 kernels (~5 s each on an idle 2-core machine); the other chapters use the same
machinery (their checker cells carry the same metadata, tested in test_exercises.py). The guard
and the report are tested without a kernel in test_grade_guard.py and test_grade_report.py."""

import csv
from pathlib import Path

import nbformat
import pytest

from llminfra.course import grade
from llminfra.course.exercises import annotate

pytestmark = pytest.mark.slow   # kernels run the notebooks

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
    assert path.read_text().splitlines()[0] == ("student,notebook,exercise,status,points,"
                                                "message,tampered")
    assert all(r["tampered"] == "" for r in rows)    # nobody here edited a checker cell
    assert all(r["points"] == ("1" if r["status"] == "passed" else "0") for r in rows)
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
    """A learner who replaces the check by `pass` does not pass (no kernel needed to see it),
    and the edit is named; blank lines and trailing spaces are not an edit."""
    reference = nbformat.read(ROOT / "exercises" / NB07, as_version=4)
    nb = nbformat.read(ROOT / "exercises" / NB07, as_version=4)
    cells = grade.exercise_cells(nb)
    for i, _ in cells[:2]:
        nb.cells[i].source = "pass"
    last = cells[2][0]
    nb.cells[last].source = "\n" + nb.cells[last].source.replace("\n", "  \n") + "\n\n"
    assert grade.restore_checkers(nb, reference) == [ex for _, ex in cells[:2]]
    assert all("check_" in nb.cells[i].source for i, _ in cells)
    assert grade.restore_checkers(nb, reference) == []


def test_a_deleted_checker_cell_is_reported():
    reference = nbformat.read(ROOT / "exercises" / NB07, as_version=4)
    nb = nbformat.read(ROOT / "exercises" / NB07, as_version=4)
    i, ex = grade.exercise_cells(nb)[-1]
    del nb.cells[i]
    assert grade.missing_checkers(nb, reference) == [ex] == ["07-bubble"]


def _reply(status="ok", ename=None, evalue=None):
    return {"status": status, "ename": ename, "evalue": evalue}


def test_status_of_a_check_cell_is_read_from_the_kernels_reply():
    """A check cell (its checker call alone) passes when the kernel's reply says ``ok`` and the
    checker printed its ✓ line; the reply's exception decides a failure (even with no error
    output shown); an error in the tail (the follow-up lines) is a note on a pass."""
    cell = nbformat.v4.new_code_cell("check(f)")
    cell.execution_count = 3

    def err(ename):
        return [nbformat.v4.new_output("error", ename=ename, evalue="why", traceback=[])]

    def out(*lines):
        return [nbformat.v4.new_output("stream", name="stdout", text="".join(
            line + "\n" for line in lines))]
    assert grade.status_of(cell, _reply())[0] == "errored"           # ok, but no ✓ line
    assert grade.status_of(cell, checker=False) == ("passed", "")
    cell.outputs = out("✓ f: 5 random cases passed")
    assert grade.status_of(cell, _reply()) == ("passed", "")
    assert grade.status_of(cell, None)[0] == "errored"               # no reply: did not run
    assert grade.status_of(cell, _reply("error", "CheckFailed", "wrong"))[0] == "failed"
    cell.outputs = err("CheckFailed")
    assert grade.status_of(cell, _reply("error", "CheckFailed", "why")) == ("failed", "why")
    assert grade.status_of(cell, _reply("error", "NotAttempted", "why")) == ("not attempted",
                                                                             "why")
    assert grade.status_of(cell, _reply("error", "NameError", "why")) == ("errored",
                                                                          "NameError: why")
    cell.outputs = out("✓ forged by the answer")                     # then the checker raised
    assert grade.status_of(cell, _reply("error", "CheckFailed", "no"))[0] == "failed"
    cell.outputs = out("✓ f")
    assert grade.status_of(cell, _reply("error", "KeyboardInterrupt", ""))[0] == "errored"
    tail = nbformat.v4.new_code_cell("print(f'{x:,d}')")
    tail.outputs = err("ValueError")
    status, message = grade.status_of(cell, _reply(), tail, tail_reply=_reply("error",
                                                                              "ValueError", "why"))
    assert status == "passed" and "a later line of its cell then raised ValueError: why" in message
    cell.outputs, cell.execution_count = [], None
    assert grade.status_of(cell, None)[0] == "errored"


def test_a_package_change_is_noted_once_per_notebook():
    """The guard's "changed" line names what the answers had changed; a later check cell of the
    same notebook that finds the same change does not report it again, a new one it does."""
    def cell(*changes):
        c = nbformat.v4.new_code_cell("check(f)")
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="".join(
            f"llminfra-grader changed {x}\n" for x in changes) + "✓ f\n")]
        return c
    reported = set()
    note = grade.changes_note(cell("llminfra.x.f"), reported)
    assert "the answer cells had changed llminfra.x.f —" in note
    assert grade.changes_note(cell("llminfra.x.f"), reported) == ""
    note = grade.changes_note(cell("llminfra.x.f; llminfra.y.g"), reported)
    assert "llminfra.y.g" in note and "llminfra.x.f" not in note
    assert grade.changes_note(cell(), reported) == ""


def test_not_attempted_needs_the_exercises_own_stub():
    """A checker's NotAttempted counts as "not attempted" only while the checked function still
    holds its ``raise NotImplementedError``; a written answer (torch raised it) is failed."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('def f(x):\n    raise NotImplementedError("your code '
                                          'here")'),
                nbformat.v4.new_code_cell("ch03.check_f(f)")]
    assert grade.still_stub(nb, 1)
    nb.cells[0].source = "def f(x):\n    return torch.tensor([1], dtype=torch.int8).matmul(x)"
    assert not grade.still_stub(nb, 1)
    nb.cells[1].source = "ch03.check_f(other_name)"           # no def to read: the checker's word
    assert grade.still_stub(nb, 1)


def test_flat_folder_is_one_student(tmp_path):
    nbformat.write(annotate(nbformat.v4.new_notebook(), "01"), tmp_path / "01_a.ipynb")
    assert grade.find_notebooks(tmp_path) == [(tmp_path.name, tmp_path / "01_a.ipynb")]


def test_own_failures_exit_2(tmp_path, capsys):
    assert grade.main([str(tmp_path / "missing")]) == 2
    assert grade.main([str(tmp_path)]) == 2
    assert "no notebook found" in capsys.readouterr().err


def _solution_07_with(extra_cell: str | None = None) -> nbformat.NotebookNode:
    """The chapter-07 solution, with a cell added before its last checker cell."""
    nb = nbformat.read(ROOT / "solutions" / NB07, as_version=4)
    annotate(nb, "07")
    if extra_cell is not None:
        last = grade.exercise_cells(nb)[-1][0]
        nb.cells.insert(last, nbformat.v4.new_code_cell(extra_cell))
    return nb


def test_a_hang_inside_a_bare_except_is_never_a_pass(tmp_path):
    """A cell loops inside ``except:``, which swallows the time limit's interrupt: the checker
    after it is errored (before: graded passed); the checkers before it still pass."""
    hang = "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except:\n        pass\n"
    nbformat.write(_solution_07_with(extra_cell=hang), tmp_path / NB07)
    # 12 s a cell: enough for the cells before the hang on a loaded 2-core CI machine (at 4 s
    # the torch import timed out there, and the checkers before the hang were errored too)
    results = {r.exercise: r for r in grade.grade(tmp_path, timeout_s=12,
                                                  reference_dir=ROOT / "exercises")}
    assert [results[e].status for e in ("07-column_shard", "07-row_shard")] == ["passed"] * 2
    assert results["07-bubble"].status == "errored", results
    assert "interrupted" in results["07-bubble"].message


def test_a_monkeypatched_checker_does_not_pass(tmp_path):
    """An answer cell that replaces the checker (and run_checks) with one that prints the pass
    line: the grader's fresh import of the checkers still finds the wrong answers."""
    patch = ("from llminfra.course import checking\nfrom llminfra.course.checks import ch07\n"
             "fake = lambda *a, **k: print('✓ faked: 5 random cases passed')\n"
             "checking.run_checks = fake\n"
             "for name in dir(ch07):\n    if name.startswith('check_'):\n"
             "        setattr(ch07, name, fake)\n"
             "check_column_shard = check_row_shard = check_bubble = fake\n")
    nb = _wrong_07()
    annotate(nb, "07")
    first = grade.exercise_cells(nb)[0][0]
    nb.cells.insert(first, nbformat.v4.new_code_cell(patch))
    nbformat.write(nb, tmp_path / NB07)
    results = {r.exercise: r.status for r in grade.grade(tmp_path, timeout_s=120,
                                                         reference_dir=ROOT / "exercises")}
    assert results["07-column_shard"] == "failed" and results["07-row_shard"] == "failed"
    assert "passed" not in results.values()


def test_a_checker_cell_replaced_by_a_printed_pass_is_graded_and_reported(tmp_path, capsys):
    """Each checker cell of the stub replaced by the line its checker prints on a pass: graded
    as the stub it is (not attempted), and reported — on the exercise's line, with a † after
    the chapter's marks in the class table and a list below it, in the CSV. The table alone
    with --summary-only."""
    nb = nbformat.read(ROOT / "exercises" / NB07, as_version=4)
    cells = grade.exercise_cells(nb)
    for i, ex in cells:
        nb.cells[i].source = f"print('✓ {ex.removeprefix('07-')}: 8 random cases passed')"
    (tmp_path / "ada").mkdir()
    nbformat.write(nb, tmp_path / "ada" / NB07)
    (tmp_path / "bo").mkdir()
    (tmp_path / "bo" / NB07).write_text((ROOT / "exercises" / NB07).read_text())
    csv_path = tmp_path.parent / f"{tmp_path.name}.csv"
    assert grade.main([str(tmp_path), "--summary-only", "--csv", str(csv_path),
                       "--reference", str(ROOT / "exercises")]) == 0
    out = capsys.readouterr().out
    assert "exercises passed" not in out               # no per-exercise report
    table = out.splitlines()
    ada = next(line for line in table if line.startswith("ada "))
    bo = next(line for line in table if line.startswith("bo "))
    assert ada.split()[1] == "···†" and bo.split()[1] == "···"
    listed = [line for line in table if line.strip().startswith("ada, 07-")]
    assert len(listed) == len(cells) and all("checker cell had been edited" in line
                                             for line in listed)
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert {(r["student"], r["status"], bool(r["tampered"])) for r in rows} == {
        ("ada", "not attempted", True), ("bo", "not attempted", False)}
    assert grade.main([str(tmp_path), "--reference", str(ROOT / "exercises")]) == 0
    report = capsys.readouterr().out
    assert report.count("† tampered: its checker cell had been edited") == len(cells)
    assert "3 tampered with" in report


def test_only_the_course_notebooks_are_graded_and_missing_ones_reported(tmp_path):
    """Untitled.ipynb and a -Copy1 are ignored (not counted); a notebook another student handed
    in gives its exercises 'not attempted' for the one who did not. (No kernel runs: ada's
    notebook is unreadable.)"""
    (tmp_path / "ada").mkdir()
    (tmp_path / "bo").mkdir()
    (tmp_path / "ada" / NB07).write_text("{ not json")
    for name in ("Untitled.ipynb", NB07.replace(".ipynb", "-Copy1.ipynb")):
        (tmp_path / "bo" / name).write_text((ROOT / "solutions" / NB07).read_text())
    ignored = []
    results = grade.grade(tmp_path, reference_dir=ROOT / "exercises", ignored=ignored)
    assert sorted(p.name for _, p in ignored) == ["07_tensor_and_pipeline_parallelism-Copy1.ipynb",
                                                  "Untitled.ipynb"]
    assert {r.notebook for r in results} == {NB07}
    ada = [r for r in results if r.student == "ada"]
    assert [r.status for r in ada] == ["errored"] and "cannot read" in ada[0].message
    bo = [r for r in results if r.student == "bo"]
    assert sorted(r.exercise for r in bo) == ["07-bubble", "07-column_shard", "07-row_shard"]
    assert all(r.status == "not attempted" and r.message == "notebook missing from the student's "
               "folder" for r in bo)


def test_run_from_another_directory_still_restores_the_checkers(tmp_path, monkeypatch, capsys):
    """Without --reference, from a folder with no exercises/: the course's own exercise
    notebooks are the reference, so a checker cell replaced by a print is restored and the
    wrong answers are found."""
    nb = _wrong_07()
    annotate(nb, "07")
    for i, _ in grade.exercise_cells(nb):
        nb.cells[i].source = "print('✓ all good: 5 random cases passed')"
    (tmp_path / "class" / "bo").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "class" / "bo" / NB07)
    (tmp_path / "class" / "bo" / "Untitled.ipynb").write_text(nbformat.writes(nb))
    monkeypatch.chdir(tmp_path)
    csv_path = tmp_path / "r.csv"
    assert grade.main(["class", "--csv", str(csv_path), "--timeout", "300"]) == 0
    with open(csv_path) as f:
        rows = [r for r in csv.DictReader(f) if r["notebook"] == NB07]
    assert len(rows) == 3 and "passed" not in {r["status"] for r in rows}, rows
    out = capsys.readouterr().out
    assert "ignored (not a course exercise notebook): bo: Untitled.ipynb" in out


def _edit(nb, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in the one cell that holds it."""
    (cell,) = [c for c in nb.cells if old in c.source]
    cell.source = cell.source.replace(old, new, 1)


def test_a_patched_reference_function_does_not_pass(tmp_path):
    """Answer cells that make the package functions the checkers compute their expected values
    with agree with their wrong answers: the module attribute ``bubble_fraction`` replaced, the
    code of ``shard_cols`` swapped. The grader puts the package back before each check, so both
    wrong answers fail, and the message names the change once (before: graded passed, since only
    ``llminfra.course`` was re-imported and it bound the patched functions again)."""
    nb = _solution_07_with()
    _edit(nb, "k = A.shape[0] // size\n    return A[rank * k:(rank + 1) * k, :]",
          "k = A.shape[1] // size\n    return A[:, rank * k:(rank + 1) * k]")   # columns
    answer = next(c for c in nb.cells if "def row_shard" in c.source)
    answer.source += ("\n\nimport llminfra.parallel.tensor_parallel as _tp\n"
                      "_tp.shard_cols.__code__ = _tp.shard_rows.__code__\n")
    _edit(nb, "return (p - 1) / (m + p - 1)", "return (p - 1) / (m + p)")
    bubble = next(c for c in nb.cells if "def bubble" in c.source)
    bubble.source += ("\n\nimport llminfra.parallel.pipeline\n"
                      "llminfra.parallel.pipeline.bubble_fraction = bubble\n")
    nbformat.write(nb, tmp_path / NB07)
    results = {r.exercise: r for r in grade.grade(tmp_path, timeout_s=120,
                                                  reference_dir=ROOT / "exercises")}
    row, bub, col = (results[f"07-{ex}"] for ex in ("row_shard", "bubble", "column_shard"))
    assert (row.status, bub.status, col.status) == ("failed", "failed", "passed"), results
    assert "row_shard" in row.message and "bubble" in bub.message
    # reported once, under the first check that found it (issue 53), not again under the next
    noted = [r for r in (row, col)
             if "changed llminfra.parallel.tensor_parallel.shard_cols (its code" in r.message]
    assert len(noted) == 1 and "shard_cols" in noted[0].tampered, (row, col)
    assert "llminfra.parallel.pipeline.bubble_fraction —" in bub.message


def test_the_checker_judges_even_when_the_cells_example_line_raises(tmp_path):
    """A checker cell whose follow-up example line cannot print an answer the checker accepted
    (``:,d`` of a float): passed, with the error as a note (before: errored). An answer that
    prints a ✓ line itself and then escapes the checker (a ``BaseException``) passes nothing."""
    reference = tmp_path / "reference"
    reference.mkdir()
    pristine = nbformat.read(ROOT / "exercises" / NB07, as_version=4)
    _edit(pristine, "check_bubble(bubble)", "check_bubble(bubble)\nprint(f'{bubble(4, 8):,d}')")
    nbformat.write(pristine, reference / NB07)
    (tmp_path / "class").mkdir()
    nb = _solution_07_with()
    _edit(nb, '    """Rank ``rank``\'s block of the rows', '    class Boom(BaseException):\n'
          '        pass\n    print("✓ row_shard: 6 random cases passed")\n    raise Boom()\n'
          '    """Rank ``rank``\'s block of the rows')
    nbformat.write(nb, tmp_path / "class" / NB07)
    results = {r.exercise: r for r in grade.grade(tmp_path / "class", timeout_s=120,
                                                  reference_dir=reference)}
    bubble, row = results["07-bubble"], results["07-row_shard"]
    assert bubble.status == "passed", bubble
    assert "a later line of its cell then raised ValueError: Unknown format code 'd'" in \
        bubble.message
    assert row.status == "errored" and row.message.startswith("Boom"), row
    assert results["07-column_shard"].status == "passed"


def test_grading_prints_nothing_of_the_kernels_on_stderr(tmp_path, capfd):
    """The kernel's start-up warnings (ipykernel's 'running over TCP without encryption',
    debugpy's frozen modules) are noise repeated once per notebook: none reaches the terminal."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('✓ x: 1 case passed')")]
    nb.cells[0].metadata["nbgrader"] = {"grade": True, "grade_id": "99-x", "points": 1}
    nbformat.write(nb, tmp_path / "99_quiet.ipynb")
    capfd.readouterr()
    (result,) = grade.grade(tmp_path, timeout_s=60)
    assert (result.exercise, result.status) == ("99-x", "passed"), result
    assert capfd.readouterr().err == ""
