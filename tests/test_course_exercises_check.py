"""``python -m llminfra.course.exercises [--check]`` and a learner's work in ``exercises/``
(issue 42): answers, runs and cells of their own are never "stale" and never overwritten; where
the course's cells did change, regenerating keeps the answers and backs the old file up, and
the advice never deletes anything. On a copy of chapter 02 (no kernel runs)."""

import shutil
from pathlib import Path

import nbformat
import pytest

from llminfra.course import exercises
from llminfra.course.exercises import BEGIN, END, STUB, generate

ROOT = Path(__file__).resolve().parents[1]
NB02 = "02_gpu_memory.ipynb"


@pytest.fixture()
def course(tmp_path):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    ex.mkdir()
    shutil.copy(ROOT / "solutions" / NB02, sol / NB02)
    shutil.copy(ROOT / "exercises" / NB02, ex / NB02)
    assert generate(sol, ex, check=True) == []
    return sol, ex


def _answers_from_solution(sol: Path) -> dict[str, str]:
    nb = nbformat.read(sol / NB02, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: c.source.replace(BEGIN + "\n", "").replace(
        END + "\n", "") for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("solution")}


def _do_the_exercises(ex: Path, sol: Path) -> dict[str, str]:
    """What a learner leaves: every answer written, cells run (outputs, counts, JupyterLab's
    metadata), a scratch cell of their own; returns the answers by grade_id."""
    nb = nbformat.read(ex / NB02, as_version=4)
    answers = _answers_from_solution(sol)
    assert len(answers) >= 3
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in answers:
            assert STUB in cell.source
            cell.source = answers[gid]
        if cell.cell_type == "code":
            cell.execution_count = 7
            cell.outputs = [nbformat.v4.new_output("stream", text="✓ something\n")]
            cell.metadata["execution"] = {"iopub.status.busy": "2026-12-04T21:00:00Z"}
    nb.cells.insert(3, nbformat.v4.new_code_cell("print('my own scratch cell')"))
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nbformat.write(nb, ex / NB02)
    return answers


def test_a_learners_answers_and_runs_are_not_stale(course, capsys):
    sol, ex = course
    _do_the_exercises(ex, sol)
    before = (ex / NB02).read_bytes()
    assert generate(sol, ex, check=True) == []
    assert exercises.main(["--check", "--solutions", str(sol), "--exercises", str(ex)]) == 0
    assert generate(sol, ex) == []                       # regenerating leaves it alone
    assert (ex / NB02).read_bytes() == before and not (ex / "backup").exists()


def _change_the_course(sol: Path) -> str:
    """A `git pull` changes a checker cell's example and a prose cell of the solution."""
    nb = nbformat.read(sol / NB02, as_version=4)
    prose = next(c for c in nb.cells if c.cell_type == "markdown" and len(c.source) > 40)
    prose.source += "\n\nA sentence added upstream."
    nbformat.write(nb, sol / NB02)
    return "A sentence added upstream."


def test_stale_prose_beside_a_learners_answers_is_told_and_updated_keeping_them(course, capsys):
    sol, ex = course
    answers = _do_the_exercises(ex, sol)
    before = (ex / NB02).read_bytes()
    added = _change_the_course(sol)
    (problem,) = generate(sol, ex, check=True)
    assert "holds your work" in problem and "answers in 02-" in problem
    assert (ex / NB02).read_bytes() == before            # --check writes nothing
    assert exercises.main(["--check", "--solutions", str(sol), "--exercises", str(ex)]) == 1
    advice = capsys.readouterr().err
    assert "keeps your answer cells" in advice and "exercises/backup/" in advice
    assert "git restore" not in advice and "reset" not in advice

    assert generate(sol, ex) == []
    (copy,) = (ex / "backup").glob("02_gpu_memory-*.ipynb")
    assert copy.read_bytes() == before                   # the learner's file, as it was
    nb = nbformat.read(ex / NB02, as_version=4)
    assert any(added in c.source for c in nb.cells)      # the course's new prose
    kept = {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    assert kept == answers                               # every answer carried over
    assert generate(sol, ex, check=True) == []
    assert not list(ex.glob("backup/*.ipynb"))[1:]       # one backup, not one per run


def test_a_pristine_stale_exercise_is_regenerated(course):
    sol, ex = course
    added = _change_the_course(sol)
    assert generate(sol, ex, check=True) == [f"{ex / NB02} is stale"]
    assert generate(sol, ex) == [] and added in (ex / NB02).read_text()
    assert not (ex / "backup").exists()                  # nothing of a learner's to keep
    assert generate(sol, ex, check=True) == []


def test_a_changed_checker_cell_beside_answers_is_stale(course):
    """The learner's own copy of a checker cell is not theirs to change: an edited checker
    cell (or one the course changed) is a difference of the course's cells."""
    sol, ex = course
    _do_the_exercises(ex, sol)
    nb = nbformat.read(ex / NB02, as_version=4)
    checker = next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade"))
    checker.source = "print('✓ kv_bytes_per_token: 9 random cases passed')"
    nbformat.write(nb, ex / NB02)
    (problem,) = generate(sol, ex, check=True)
    assert "holds your work" in problem


def test_a_teachers_reset_writes_every_notebook_pristine(course):
    """`make reset-exercises` (llminfra.course.teach) is the one command that discards a
    learner's answers, on purpose, for a new class: no backup, no answers carried over."""
    sol, ex = course
    pristine = (ex / NB02).read_bytes()
    _do_the_exercises(ex, sol)
    assert generate(sol, ex, keep_work=False) == []
    assert (ex / NB02).read_bytes() == pristine and not (ex / "backup").exists()


def test_success_says_what_was_checked_or_written(course, capsys):
    """Both commands said nothing when they succeeded (issue 53, learner's path 4)."""
    sol, ex = course
    assert exercises.main(["--check", "--solutions", str(sol), "--exercises", str(ex)]) == 0
    assert "all 1 exercise notebooks match" in capsys.readouterr().out
    assert exercises.main(["--solutions", str(sol), "--exercises", str(ex)]) == 0
    assert "already up to date; nothing written" in capsys.readouterr().out
    (ex / NB02).unlink()
    assert exercises.main(["--solutions", str(sol), "--exercises", str(ex)]) == 0
    assert f"wrote 1 notebook(s) from {sol}/ ({ex / NB02})" in capsys.readouterr().out


def test_the_stub_is_what_the_checkers_read_as_not_attempted():
    from llminfra.course.checking import STUB_MESSAGE
    assert STUB == f'raise NotImplementedError("{STUB_MESSAGE}")'
