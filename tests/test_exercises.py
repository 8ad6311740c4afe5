"""Exercises: generated from solutions, in sync, and every checker fails on the stubs."""

import re
from pathlib import Path

import nbformat
import pytest

from llminfra.course.exercises import (BEGIN, END, STUB, annotate, checked_names, generate,
                                       make_exercise, nbgrader_metadata, strip_solution)

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


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
    assert generate(sol, ex, check=True) == [f"{sol / '01_a.ipynb'} lacks its nbgrader metadata",
                                             f"{ex / '01_a.ipynb'} is missing"]
    assert generate(sol, ex) == []
    meta = nbformat.read(sol / "01_a.ipynb", as_version=4).cells[0].metadata["nbgrader"]
    assert meta["solution"] and meta["grade_id"] == "01-answer-answer"
    assert generate(sol, ex, check=True) == []
    # the course's own cells changing makes the exercise stale
    nb = nbformat.read(sol / "01_a.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("new prose"))
    nbformat.write(nb, sol / "01_a.ipynb")
    assert generate(sol, ex, check=True) == [f"{ex / '01_a.ipynb'} is stale"]
    assert generate(sol, ex) == [] and generate(sol, ex, check=True) == []
    # a learner's answer in the exercise is their work, not staleness
    (ex / "01_a.ipynb").write_text((ex / "01_a.ipynb").read_text().replace("NotImpl", "Impl"))
    assert generate(sol, ex, check=True) == []
    # and a course change beside it is reported as such, the work named
    nb.cells.append(nbformat.v4.new_markdown_cell("more prose"))
    nbformat.write(nb, sol / "01_a.ipynb")
    (msg,) = generate(sol, ex, check=True)
    assert msg.startswith(f"{ex / '01_a.ipynb'} holds your work"), msg


def test_exercises_are_in_sync_with_solutions():
    assert generate(ROOT / "solutions", ROOT / "exercises", check=True) == []


def test_chapters_01_and_02_have_three_exercises_each():
    for chapter in ("01", "02"):
        paths = list((ROOT / "solutions").glob(f"{chapter}_*.ipynb"))
        assert paths, f"no solutions/{chapter}_*.ipynb"
        text = paths[0].read_text()
        assert text.count(BEGIN) >= 3, f"{paths[0].name}: fewer than 3 exercises"


@pytest.mark.slow   # a kernel per notebook
@pytest.mark.parametrize("path", EXERCISES, ids=[p.name for p in EXERCISES])
def test_stubs_fail_every_checker(path):
    """Run the exercise notebook: every error must be the stub's NotImplementedError or a
    checker's NotAttempted, at least one checker must have run, and none may pass."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors, passed, long = [], [], []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                errors.append(out.ename)
                # a checker's verdict is its message alone (CheckFailed._render_traceback_)
                if out.ename == "NotAttempted" and (len(out.traceback) != 1 or any(
                        "checking.py" in t or "/checks/" in t for t in out.traceback)):
                    long.append(out.traceback)
            text = out.get("text", "") if out.output_type == "stream" else ""
            if "random cases passed" in text:
                passed.append(cell.source[:80])
    assert not passed, f"a checker passed on a stub: {passed}"
    assert not long, f"a checker's message came with a traceback: {long[0]}"
    assert "NotAttempted" in errors, "no checker ran against a stub"
    unexpected = [e for e in errors if e not in ("NotImplementedError", "NotAttempted")]
    assert not unexpected, f"errors other than the stubs': {unexpected}"


def _exercises(nb):
    """``(heading index, answer indices, hint indices, checker index)`` per exercise: an
    exercise runs from a ``## Exercise`` heading to the next one."""
    starts = [i for i, c in enumerate(nb.cells)
              if c.cell_type == "markdown" and c.source.startswith("## Exercise")]
    out = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(nb.cells)
        cells = range(start, end)
        out.append((start, [i for i in cells if BEGIN in nb.cells[i].source],
                    [i for i in cells if "<details>" in nb.cells[i].source],
                    [i for i in cells if nb.cells[i].cell_type == "code"
                     and checked_names(nb.cells[i].source)]))
    return out


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_teaching_aids(path):
    """Objectives and time up front; per exercise a worked example before the answer, at least
    two hints (collapsed, one <details> each) before the checker, the checker after both."""
    nb = nbformat.read(path, as_version=4)
    head = nb.cells[0].source
    assert "**You will learn to**" in head and "**Estimated time:**" in head
    exercises = _exercises(nb)
    assert exercises, "no '## Exercise' heading"
    for start, answers, hints, checks in exercises:
        title = nb.cells[start].source.splitlines()[0]
        assert "**Worked example.**" in nb.cells[start].source, title
        assert answers and checks, f"{title}: no answer cell or no checker cell"
        assert hints and all(nb.cells[i].source.count("<details>") >= 2 for i in hints), title
        assert max(answers) < min(hints) < min(checks), f"{title}: answer, hints, checker order"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_no_answer_shown_above_its_exercise(path):
    """show_source(...) of the package prints the answer: only after the last checker cell."""
    nb = nbformat.read(path, as_version=4)
    last_check = max(i for i, c in enumerate(nb.cells)
                     if c.cell_type == "code" and checked_names(c.source))
    early = [i for i, c in enumerate(nb.cells[:last_check])
             if c.cell_type == "code" and "show_source(" in c.source]
    assert not early, f"show_source in cells {early}, above the checker in cell {last_check}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_nbgrader_metadata(path):
    """Answer cells are nbgrader solution cells, checker cells locked autograder cells worth a
    point, grade ids unique; the exercise twin carries the same metadata cell for cell."""
    nb = nbformat.read(path, as_version=4)
    twin = nbformat.read(ROOT / "exercises" / path.name, as_version=4)
    chapter = path.name.split("_", 1)[0]
    ids = []
    for cell, ex_cell in zip(nb.cells, twin.cells, strict=True):
        want = nbgrader_metadata(cell, chapter)
        assert cell.metadata.get("nbgrader") == want == ex_cell.metadata.get("nbgrader"), cell.source[:60]
        if want:
            ids.append(want["grade_id"])
    assert len(ids) == len(set(ids)) and ids
    grades = [c.metadata["nbgrader"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert grades and all(g["locked"] and g["points"] == 1 for g in grades)


def test_one_check_per_cell():
    cell = nbformat.v4.new_code_cell("check_a(f)\ncheck_b(g)")
    with pytest.raises(ValueError, match="own cell"):
        nbgrader_metadata(cell, "07")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"def f():\n    {BEGIN}\n    pass\n    {END}"),
                nbformat.v4.new_code_cell("ch01.check_f(f)")]
    annotate(nb, "01")
    assert nb.cells[0].metadata["nbgrader"]["grade_id"] == "01-f-answer"
    assert nb.cells[1].metadata["nbgrader"]["grade_id"] == "01-f"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_a_checker_cells_example_prints_any_answer_the_checker_accepts(path):
    """The checker accepts a float for an int, a ``Fraction``, a NumPy or 0-d tensor scalar; the
    example print after it must too: a learner's value is formatted through ``int(...)`` or
    ``float(...)`` (``f"{x:,d}"`` raises for 2.0, ``f"{Fraction(1, 3):.4g}"`` before Python 3.12)."""
    nb = nbformat.read(path, as_version=4)
    bare = re.compile(r"\{(?!int\(|float\()([A-Za-z_][\w.]*\([^{}]*\))[^{}]*:[^{}]*[dgf,]\}")
    found = [m.group(0) for c in nb.cells if c.cell_type == "code" and checked_names(c.source)
             for line in c.source.splitlines() if "check_" not in line
             for m in bare.finditer(line)
             if m.group(1).split("(")[0] in _learner_functions(nb)]
    assert not found, f"{path.name}: a learner's value printed without int() / float(): {found}"


def _learner_functions(nb) -> set[str]:
    """Names the notebook's answer cells define (``def name(``)."""
    return {m.group(1) for c in nb.cells if c.cell_type == "code" and BEGIN in c.source
            for m in re.finditer(r"^def (\w+)\(", c.source, re.M)}
