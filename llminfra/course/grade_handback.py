"""What a teacher hands back to each student after ``make grade``: a Gradescope-style
``results.json`` and a short ``feedback.md`` (used by :mod:`llminfra.course.grade`).

``results.json`` follows the format of the results file a Gradescope autograder writes
(``/autograder/results/results.json``; the README's teacher section says how to use it)::

    {"score": 7, "max_score": 9, "output": "7 of 9 exercises passed …", "output_format": "md",
     "visibility": "visible", "stdout_visibility": "hidden",
     "tests": [{"name": "07-bubble", "number": "07.3", "score": 0, "max_score": 1,
                "status": "failed", "output": "<the checker's message>",
                "visibility": "visible", "tags": ["07_tensor_and_pipeline_parallelism"]}, …]}

one test per exercise, in notebook order, its ``output`` the checker's message (or "not
attempted", a tamper note). ``feedback.md`` says the same for a person: per notebook, each
exercise passed, its checker's message, "not attempted", and what the grader found tampered
with (each once). :func:`write_handback` writes both as ``DIR/<student>/``.
"""

from __future__ import annotations

import json
from pathlib import Path

from llminfra.course.grade_report import MARKS, Result

#: Gradescope's visibility values; "visible": the student sees each test at once
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
#: what a student reads for each status
STATUS_WORDS = {"passed": "passed", "failed": "not yet right", "not attempted": "not attempted",
                "errored": "could not be checked"}


def _test_output(r: Result) -> str:
    parts = []
    if r.status == "not attempted":
        parts.append("not attempted" + (f": {r.message}" if r.message else ""))
    elif r.message:
        parts.append(r.message)
    elif r.status == "passed":
        parts.append("passed")
    if r.tampered:
        parts.append(f"tampering found (graded with the course's own checker all the same): "
                     f"{r.tampered}")
    return "\n".join(parts)


def _numbered(results: list[Result]) -> list[tuple[str, Result]]:
    """``("07.3", result)``: the chapter, then the exercise's place in its notebook."""
    seen: dict[str, int] = {}
    out = []
    for r in results:
        seen[r.notebook] = seen.get(r.notebook, 0) + 1
        out.append((f"{r.notebook[:2]}.{seen[r.notebook]}", r))
    return out


def gradescope_results(results: list[Result], visibility: str = "visible") -> dict:
    """One student's results as Gradescope's ``results.json`` (the module docstring); one point
    per exercise."""
    if visibility not in VISIBILITIES:
        raise ValueError(f"unknown visibility {visibility!r}; Gradescope's are {VISIBILITIES}")
    students = {r.student for r in results}
    if len(students) > 1:
        raise ValueError(f"results of one student expected, got {sorted(students)}")
    results = sorted(results, key=lambda r: r.notebook)       # stable: each notebook's order
    tests = [{"name": r.exercise if r.exercise != "*" else r.notebook, "number": number,
              "score": r.points, "max_score": 1,
              "status": "passed" if r.status == "passed" else "failed",
              "output": _test_output(r), "visibility": visibility,
              "tags": [r.notebook.removesuffix(".ipynb")]}
             for number, r in _numbered(results)]
    score = sum(t["score"] for t in tests)
    tampered = sum(bool(r.tampered) for r in results)
    output = f"{score} of {len(tests)} exercises passed."
    if tampered:
        output += (f" The grader found tampering in {tampered} (each graded with the course's "
                   "own checker and package all the same).")
    return {"score": score, "max_score": len(tests), "output": output, "output_format": "md",
            "visibility": visibility, "stdout_visibility": "hidden", "tests": tests}


def feedback_markdown(results: list[Result]) -> str:
    """One student's feedback as short Markdown: a line per exercise under each notebook."""
    student = results[0].student if results else ""
    score = sum(r.points for r in results)
    lines = [f"# Feedback for {student}", "", f"**{score} of {len(results)} exercises passed.**"]
    notebooks: dict[str, list[Result]] = {}
    for r in results:
        notebooks.setdefault(r.notebook, []).append(r)
    for notebook in sorted(notebooks):
        lines += ["", f"## {notebook}", ""]
        for r in notebooks[notebook]:
            mark = MARKS[r.status]
            name = r.exercise if r.exercise != "*" else "the notebook"
            line = f"- {mark} **{name}** — {STATUS_WORDS[r.status]}"
            message = r.message.strip()
            if message:
                quoted = message.replace("\n", "\n  > ")
                line += f"\n  > {quoted}"
            if r.tampered:
                line += (f"\n  - **tampering found** (graded with the course's own checker all "
                         f"the same): {r.tampered}")
            lines.append(line)
    return "\n".join(lines) + "\n"


def _folder_name(student: str) -> str:
    """A student's name as one safe folder name (no separators, no leading dot)."""
    safe = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in student).lstrip(".")
    return safe or "_"


def write_handback(results: list[Result], out_dir: Path, visibility: str = "visible"
                   ) -> list[Path]:
    """``out_dir/<student>/results.json`` and ``feedback.md`` for every student; returns the
    students' folders."""
    out_dir = Path(out_dir)
    folders = []
    for student in sorted({r.student for r in results}):
        mine = [r for r in results if r.student == student]
        folder = out_dir / _folder_name(student)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(
            json.dumps(gradescope_results(mine, visibility), indent=1, ensure_ascii=False) + "\n",
            encoding="utf-8")
        (folder / "feedback.md").write_text(feedback_markdown(mine), encoding="utf-8")
        folders.append(folder)
    return folders
