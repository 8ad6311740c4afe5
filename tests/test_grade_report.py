"""What the grader hands a teacher (llminfra/course/grade_report.py): the per-student report,
the class summary for 30 students on a ~100-column screen, the CSV; and that ``make grade``
needs only the course install (no test tool is imported). No kernel runs here."""

import csv
import random
import subprocess
import sys
from pathlib import Path

import pytest

from llminfra.course import grade
from llminfra.course.grade_report import (MARKS, TAMPER_MARK, Result, fit_name, report, summary,
                                          write_csv)

ROOT = Path(__file__).resolve().parents[1]
#: the course's chapters with exercises and how many each has (as in exercises/)
CHAPTERS = {"01": 4, "02": 3, "03": 3, "04": 3, "05": 5, "06": 2, "07": 3, "08": 2, "09": 3,
            "10": 2, "11": 3}


def _class_of_30(seed: int = 0) -> list[Result]:
    rng = random.Random(seed)
    students = [f"student_{k:02d}" for k in range(28)] + [
        "alexandra.konstantinopoulou-smith", "alexandra.konstantinopoulou-jones"]
    results = []
    for student in students:
        for chapter, n in CHAPTERS.items():
            for k in range(n):
                status = rng.choice(grade.STATUSES)
                results.append(Result(student, f"{chapter}_topic.ipynb", f"{chapter}-ex{k}",
                                      status, "why" if status != "passed" else ""))
    return results


def test_the_summary_of_30_students_fits_100_columns():
    results = _class_of_30()
    lines = summary(results).splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    header = lines[0].split()
    assert header == ["student"] + list(CHAPTERS) + ["points"]
    rows = lines[1:31]
    assert len({row[:20] for row in rows}) == 30          # cut names still tell students apart
    possible = sum(CHAPTERS.values())
    for row in rows:
        name = row[:20]
        student = next(s for s in {r.student for r in results} if fit_name(s) == name)
        mine = [r for r in results if r.student == student]
        marks = row[21:].split()[:len(CHAPTERS)]
        assert "".join(marks) == "".join(MARKS[r.status] for r in mine)   # notebook order
        assert row.endswith(f"{sum(r.points for r in mine)} / {possible}")
    assert lines[31].startswith("✓ passed")
    assert lines[32] == (f"class: {sum(r.points for r in results)} of {30 * possible} points "
                         "(30 students)")
    assert lines[33:] == [f"{c}: " + ", ".join(f"ex{k}" for k in range(n))
                          for c, n in CHAPTERS.items()]


def test_the_summary_marks_each_status_and_leaves_ungraded_blank():
    results = [Result("ada", "07_x.ipynb", "07-column_shard", "passed"),
               Result("ada", "07_x.ipynb", "07-row_shard", "errored", "x"),
               Result("ada", "07_x.ipynb", "07-bubble", "not attempted"),
               Result("bo", "07_x.ipynb", "07-column_shard", "failed"),
               Result("bo", "02_y.ipynb", "02-kv", "passed")]
    lines = summary(results).splitlines()
    assert lines[0].split() == ["student", "02", "07", "points"]
    assert lines[1].split() == ["ada", "✓!·", "1", "/", "4"]     # no 02 result: blank
    assert lines[2].split() == ["bo", "✓", "✗", "1", "/", "4"]
    assert lines[2].index("✗") == lines[1].index("✓!·")          # aligned under 07
    assert lines[-2:] == ["02: kv", "07: column_shard, row_shard, bubble"]


def test_tampering_is_marked_in_the_table_listed_below_it_and_in_the_report():
    """A tampered result keeps its status and point; its chapter's marks get a † (the table
    stays aligned and within 100 columns), each tampered exercise is listed under the table,
    the report prints the note on the exercise's line and counts them."""
    results = _class_of_30()
    k = next(i for i, r in enumerate(results) if r.student == "student_03" and
             r.exercise == "05-ex2")
    r = results[k]
    results[k] = Result(r.student, r.notebook, r.exercise, r.status, r.message,
                        "its checker cell had been edited or replaced")
    lines = summary(results).splitlines()
    assert max(len(line) for line in lines) <= 100
    header = lines[0]
    row = next(line for line in lines if line.startswith("student_03"))
    other = next(line for line in lines if line.startswith("student_04"))
    col = header.index("05")
    marks = row[col:].split()[0]
    assert marks.endswith(TAMPER_MARK) and len(marks) == CHAPTERS["05"] + 1
    assert TAMPER_MARK not in other
    for line in (row, other):                           # every column still starts under its title
        for title in header.split()[1:-1]:
            at = header.index(f" {title}") + 1
            assert line[at - 1] == " " and line[at] != " ", (title, line)
    assert row.endswith(f"{sum(x.points for x in results if x.student == 'student_03')} / "
                        f"{sum(CHAPTERS.values())}")
    below = lines[lines.index(next(x for x in lines if x.startswith(f"{TAMPER_MARK} tampered"))):]
    assert below[1:] == ["  student_03, 05-ex2: its checker cell had been edited or replaced"]
    text = report(results)
    assert f"{TAMPER_MARK} tampered: its checker cell had been edited" in text
    assert text.splitlines()[-1].endswith("; 1 tampered with")
    assert TAMPER_MARK not in summary(_class_of_30())


def test_summary_only_prints_the_table_alone(tmp_path, monkeypatch, capsys):
    results = [Result("ada", "07_x.ipynb", "07-column_shard", "passed", "", "its checker cell "
                      "had been edited or replaced"),
               Result("bo", "07_x.ipynb", "07-column_shard", "failed", "wrong")]
    monkeypatch.setattr(grade, "grade", lambda *a, **k: results)
    (tmp_path / "x.ipynb").write_text("{}")
    assert grade.main([str(tmp_path), "--summary-only"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["student", "07", "points"]
    assert "exercises passed" not in out and "ada, 07-column_shard: its checker cell" in out
    assert grade.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ada: 1 of 1 exercises passed" in out and "points" not in out


def test_fit_name_keeps_both_ends():
    assert fit_name("ada", 6) == "ada   "
    assert fit_name("student_name_01", 10) == "stude…e_01"
    assert len(fit_name("x" * 50)) == 20


def test_report_totals():
    results = [Result("a", "n", "e1", "passed"), Result("a", "n", "e2", "failed", "x\ny"),
               Result("b", "n", "e1", "not attempted")]
    text = report(results)
    assert "a: 1 of 2 exercises passed" in text and "b: 0 of 1 exercises passed" in text
    assert text.splitlines()[-1].startswith("total: 1 passed, 1 failed, 1 not attempted, 0 errored")


def test_csv_has_a_points_column(tmp_path):
    results = _class_of_30()[:40]
    write_csv(results, tmp_path / "r.csv")
    with open(tmp_path / "r.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(grade.COLUMNS) and list(rows[0])[-1] == "tampered"
    assert [int(r["points"]) for r in rows] == [r.points for r in results]


def test_an_unknown_status_is_refused():
    with pytest.raises(ValueError, match="'passd'.*passed"):
        Result("a", "n", "e", "passd")


def _test_extras() -> set[str]:
    """The import names of pyproject's ``test`` extra (pytest-xdist -> xdist)."""
    try:
        import tomllib
    except ModuleNotFoundError:          # Python 3.10
        import tomli as tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["test"]
    names = {e.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip() for e in extras}
    return {{"pytest-xdist": "xdist", "tomli": "tomli"}.get(n, n).replace("-", "_")
            for n in names} | {"_pytest"}


def test_make_grade_imports_no_test_tool(tmp_path):
    """``make grade`` runs with the course install only: with every test extra's package made
    unimportable, the grader still grades (an unreadable notebook: no kernel needed), prints
    its summary and writes its CSV; the teacher's other command imports too."""
    blocked = sorted(_test_extras())
    assert {"pytest", "nbval", "playwright"} <= set(blocked)
    (tmp_path / "ada").mkdir()
    (tmp_path / "ada" / "07_tensor_and_pipeline_parallelism.ipynb").write_text("{ not json")
    script = (
        "import sys\n"
        f"blocked = {blocked!r}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in blocked:\n"
        "            raise ImportError(f'{name} is a test tool')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from llminfra.course import grade, grade_guard, grade_kernel, teach  # noqa: F401\n"
        f"rc = grade.main([{str(tmp_path)!r}, '--summary', '--csv', {str(tmp_path / 'r.csv')!r}])\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in blocked)\n"
        "print('loaded test tools:', loaded)\n"
        "sys.exit(rc)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "loaded test tools: []" in run.stdout
    assert "class: 0 of 1 points (1 students)" in run.stdout
    assert (tmp_path / "r.csv").read_text().startswith("student,notebook,exercise,status,points")
