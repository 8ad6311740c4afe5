"""What a teacher hands back (llminfra/course/grade_handback.py, issue 53): each student's
Gradescope-style results.json and feedback.md, the CSV one row per student beside the long form,
and every message cut to a size a report can hold — on the fake class of 30 students of
test_grade_report.py. No kernel runs here."""

import csv
import json

import pytest

from llminfra.course import grade
from llminfra.course.grade_handback import (feedback_markdown, gradescope_results,
                                            write_handback)
from llminfra.course.grade_report import (MESSAGE_LIMIT, Result, write_csv,
                                          write_csv_by_student)
from test_grade_report import CHAPTERS, _class_of_30

TAMPER = "its checker cell had been edited or replaced"


def _with_tamper(results):
    """student_03's 05-ex2 marked as tampered with (its status and point unchanged)."""
    k = next(i for i, r in enumerate(results)
             if r.student == "student_03" and r.exercise == "05-ex2")
    r = results[k]
    results[k] = Result(r.student, r.notebook, r.exercise, r.status, r.message, TAMPER)
    return results


def test_results_json_is_gradescopes_format_with_one_test_per_exercise():
    results = _class_of_30(seed=1)
    for student in ("student_00", "alexandra.konstantinopoulou-smith"):
        mine = [r for r in results if r.student == student]
        doc = json.loads(json.dumps(gradescope_results(mine)))       # plain JSON values only
        assert doc["score"] == sum(r.points for r in mine) == sum(t["score"] for t in doc["tests"])
        assert doc["max_score"] == sum(CHAPTERS.values()) == len(doc["tests"])
        assert [t["name"] for t in doc["tests"]] == [r.exercise for r in mine]   # notebook order
        for t, r in zip(doc["tests"], mine):
            assert (t["score"], t["max_score"], t["visibility"]) == (r.points, 1, "visible")
            assert t["status"] == ("passed" if r.status == "passed" else "failed")
            assert set(t) >= {"name", "score", "max_score", "output", "visibility"}
            if r.status == "not attempted":
                assert t["output"].startswith("not attempted")
            elif r.status in ("failed", "errored"):
                assert t["output"] == r.message            # the checker's message
        assert f"{doc['score']} of {doc['max_score']} exercises passed" in doc["output"]
    numbers = [t["number"] for t in gradescope_results(
        [r for r in results if r.student == "student_00"])["tests"]]
    assert numbers[:5] == ["01.1", "01.2", "01.3", "01.4", "02.1"]


def test_results_json_refuses_a_wrong_visibility_or_two_students():
    results = _class_of_30()
    with pytest.raises(ValueError, match="'public'.*after_due_date"):
        gradescope_results([r for r in results if r.student == "student_00"], "public")
    with pytest.raises(ValueError, match="one student"):
        gradescope_results(results)


def test_feedback_names_each_exercise_its_message_and_tampering_once():
    results = _with_tamper(_class_of_30(seed=2))
    mine = [r for r in results if r.student == "student_03"]
    text = feedback_markdown(mine)
    assert text.startswith("# Feedback for student_03\n")
    assert f"**{sum(r.points for r in mine)} of {len(mine)} exercises passed.**" in text
    for nb in {r.notebook for r in mine}:
        assert f"## {nb}" in text
    lines = text.splitlines()
    for r in mine:
        (line,) = [x for x in lines if f"**{r.exercise}**" in x]
        word = {"passed": "passed", "failed": "not yet right", "not attempted": "not attempted",
                "errored": "could not be checked"}[r.status]
        assert line.endswith(word), line
        if r.message:
            assert lines[lines.index(line) + 1] == f"  > {r.message}"
    assert text.count("tampering found") == 1 and TAMPER in text


def test_write_handback_writes_both_files_per_student(tmp_path):
    results = _with_tamper(_class_of_30(seed=3))
    folders = write_handback(results, tmp_path / "handback")
    assert len(folders) == 30 and {f.name for f in folders} >= {"student_00",
                                                                "alexandra.konstantinopoulou-smith"}
    for folder in folders:
        doc = json.loads((folder / "results.json").read_text())
        mine = [r for r in results if r.student == folder.name]
        assert doc["score"] == sum(r.points for r in mine)
        assert (folder / "feedback.md").read_text().startswith(f"# Feedback for {folder.name}")
    doc = json.loads((tmp_path / "handback" / "student_03" / "results.json").read_text())
    assert [t["name"] for t in doc["tests"] if TAMPER in t["output"]] == ["05-ex2"]
    assert "tampering in 1" in doc["output"]


def test_a_student_name_cannot_escape_the_handback_folder(tmp_path):
    (folder,) = write_handback([Result("../../evil", "07_x.ipynb", "07-a", "passed")], tmp_path)
    assert folder.parent == tmp_path and (folder / "results.json").exists()


def test_the_csv_has_one_row_per_student_beside_the_long_form(tmp_path):
    results = _class_of_30(seed=4)
    results.append(Result("student_00", "12_unreadable.ipynb", "*", "errored", "cannot read"))
    write_csv(results, tmp_path / "long.csv")
    write_csv_by_student(results, tmp_path / "wide.csv")
    with open(tmp_path / "long.csv") as f:
        long = list(csv.DictReader(f))
    with open(tmp_path / "wide.csv") as f:
        wide = list(csv.DictReader(f))
    exercises = [f"{c}-ex{k}" for c, n in CHAPTERS.items() for k in range(n)]
    assert list(wide[0]) == ["student", *exercises, "12_unreadable.ipynb", "points",
                             "max_points", "tampered"]
    assert [row["student"] for row in wide] == sorted({r.student for r in results})
    for row in wide:
        mine = {r["exercise"]: r["points"] for r in long if r["student"] == row["student"]}
        assert all(row[ex] == mine[ex] for ex in exercises)
        assert int(row["points"]) == sum(int(p) for p in mine.values())
    assert wide[-1]["12_unreadable.ipynb"] == "" and wide[-1]["max_points"] == str(
        len(exercises) + 1)


def test_a_huge_message_is_cut(tmp_path):
    r = Result("a", "07_x.ipynb", "07-a", "errored", "ValueError: " + "x" * 20_000_000,
               "y" * 50_000)
    assert len(r.message) < MESSAGE_LIMIT + 60 and r.message.endswith("more characters cut)")
    assert "20,000,012" not in r.message and "19,998,012 more characters cut" in r.message
    assert len(r.tampered) < MESSAGE_LIMIT + 60
    write_csv([r], tmp_path / "r.csv")
    assert (tmp_path / "r.csv").stat().st_size < 3 * MESSAGE_LIMIT


def test_main_writes_the_wide_csv_and_the_handback(tmp_path, monkeypatch, capsys):
    results = _class_of_30(seed=5)[:60]
    monkeypatch.setattr(grade, "grade", lambda *a, **k: results)
    (tmp_path / "x.ipynb").write_text("{}")
    csv_path = tmp_path / "report.csv"
    assert grade.main([str(tmp_path), "--csv", str(csv_path), "--handback",
                       str(tmp_path / "back")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "report-by-student.csv").exists() and "report-by-student.csv" in out
    students = sorted({r.student for r in results})
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == students
    assert f"for {len(students)} students" in out
