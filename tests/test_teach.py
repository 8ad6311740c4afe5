"""The teacher's commands: check-machines (time and result per notebook) and reset-exercises."""

import io
import shutil
from pathlib import Path

import nbformat

from llminfra.course import teach
from llminfra.course.exercises import generate

ROOT = Path(__file__).resolve().parents[1]


def _notebook(path: Path, *sources: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)


def test_check_machines_reports_time_and_result_per_notebook(tmp_path):
    """Two tiny notebooks (no torch: two quick kernels), one of which fails."""
    _notebook(tmp_path / "01_ok.ipynb", "x = 1", "print(x + 1)")
    _notebook(tmp_path / "02_bad.ipynb", "1 / 0", "print('still runs')")
    out = io.StringIO()
    assert teach.check_machines([tmp_path], timeout_s=60, out=out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:3] == ["chapter", "notebook", "time"]
    ok = next(line for line in lines if "01_ok" in line)
    bad = next(line for line in lines if "02_bad" in line)
    assert ok.startswith("01") and ok.rstrip().endswith("pass")
    assert bad.startswith("02") and "FAIL cell 0: ZeroDivisionError" in bad
    assert float(ok.split()[2]) > 0
    assert lines[-1].startswith("1 of 2 notebooks ran without an error")
    assert nbformat.read(tmp_path / "01_ok.ipynb", as_version=4).cells[0].outputs == [], \
        "the notebooks themselves are not modified"


def test_reset_exercises_restores_pristine(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    shutil.copytree(ROOT / "solutions", solutions)
    shutil.copytree(ROOT / "exercises", exercises)
    name = sorted(p.name for p in exercises.glob("*.ipynb"))[0]
    pristine = (exercises / name).read_text()
    (exercises / name).write_text(pristine.replace("NotImplementedError", "print"))
    (exercises / ".ipynb_checkpoints").mkdir()
    out = io.StringIO()
    teach.reset_exercises(solutions, exercises, yes=False, out=out)
    assert f"would restore 1 of" in out.getvalue() and name in out.getvalue()
    assert (exercises / name).read_text() != pristine, "nothing changes without --yes"
    teach.reset_exercises(solutions, exercises, yes=True, out=out)
    assert (exercises / name).read_text() == pristine
    assert not (exercises / ".ipynb_checkpoints").exists()
    assert generate(solutions, exercises, check=True) == []


def test_cli_refuses_missing_folders(tmp_path, capsys):
    assert teach.main(["check-machines", str(tmp_path / "nope")]) == 2
    assert teach.main(["reset-exercises", "--solutions", str(tmp_path / "nope")]) == 2
