"""Exercises: generated from solutions, in sync, and every checker fails on the stubs."""

from pathlib import Path

import nbformat
import pytest

from llminfra.course.exercises import BEGIN, END, STUB, generate, make_exercise, strip_solution

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def test_strip_solution_keeps_indentation_and_code_around():
    src = f"def f(x):\n    y = 1\n    {BEGIN}\n    return x + y\n    {END}\n\nprint(f)"
    assert strip_solution(src) == f"def f(x):\n    y = 1\n    {STUB}\n\nprint(f)"
    assert strip_solution("x = 1") == "x = 1"


@pytest.mark.parametrize("src", [f"{BEGIN}\nx", f"{END}\nx", f"{BEGIN}\n{BEGIN}\n{END}"])
def test_unbalanced_markers_are_errors(src):
    with pytest.raises(ValueError):
        strip_solution(src)


def test_make_exercise_clears_outputs():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(f"def f():\n    {BEGIN}\n    return 1\n    {END}")
    cell.outputs = [nbformat.v4.new_output("stream", text="hi")]
    cell.execution_count = 3
    nb.cells = [cell, nbformat.v4.new_markdown_cell("text")]
    ex = make_exercise(nb)
    assert ex.cells[0].outputs == [] and ex.cells[0].execution_count is None
    assert STUB in ex.cells[0].source and "return 1" not in ex.cells[0].source
    assert nb.cells[0].outputs, "the solution itself must not be modified"


def test_check_mode_reports_stale_and_missing(tmp_path):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"{BEGIN}\nx = 1\n{END}")]
    nbformat.write(nb, sol / "01_a.ipynb")
    assert generate(sol, ex, check=True) == [f"{ex / '01_a.ipynb'} is missing"]
    assert generate(sol, ex) == []
    assert generate(sol, ex, check=True) == []
    (ex / "01_a.ipynb").write_text((ex / "01_a.ipynb").read_text().replace("NotImpl", "Impl"))
    assert generate(sol, ex, check=True) == [f"{ex / '01_a.ipynb'} is stale"]


def test_exercises_are_in_sync_with_solutions():
    assert generate(ROOT / "solutions", ROOT / "exercises", check=True) == []


def test_chapters_01_and_02_have_three_exercises_each():
    for chapter in ("01", "02"):
        paths = list((ROOT / "solutions").glob(f"{chapter}_*.ipynb"))
        assert paths, f"no solutions/{chapter}_*.ipynb"
        text = paths[0].read_text()
        assert text.count(BEGIN) >= 3, f"{paths[0].name}: fewer than 3 exercises"


@pytest.mark.parametrize("path", EXERCISES, ids=[p.name for p in EXERCISES])
def test_stubs_fail_every_checker(path):
    """Run the exercise notebook: every error must be the stub's NotImplementedError or a
    checker's CheckFailed, at least one checker must have run, and none may pass."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors, passed = [], []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                errors.append(out.ename)
            text = out.get("text", "") if out.output_type == "stream" else ""
            if "random cases passed" in text:
                passed.append(cell.source[:80])
    assert not passed, f"a checker passed on a stub: {passed}"
    assert "CheckFailed" in errors, "no checker ran against a stub"
    unexpected = [e for e in errors if e not in ("NotImplementedError", "CheckFailed")]
    assert not unexpected, f"errors other than the stubs': {unexpected}"
