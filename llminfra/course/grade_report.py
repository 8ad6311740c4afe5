"""What the grader hands a teacher: one :class:`Result` per student and exercise, as a plain
report, a class summary that fits a ~100-column terminal, and CSV — long (a row per exercise)
and wide (a row per student) — (used by :mod:`llminfra.course.grade`; each student's
``results.json`` and feedback: :mod:`llminfra.course.grade_handback`). Every message and tamper
note is cut at :data:`MESSAGE_LIMIT` characters.

The summary has one line per student and one column per chapter; each chapter's column is a
string of marks, one per exercise in notebook order (``✓✓✗·``), under the chapter's number::

    student              01   02  03  …  11   points
    ada                  ✓✓✓✓ ✓✓✗ ✓·· …  ✓✓!  24 / 33

Names longer than :data:`NAME_WIDTH` are cut in the middle (``alexandra…nova``) so that two
similar names stay apart; below the table, each chapter's exercises are named in column order.

Tampering — a checker cell edited or replaced (a ``print('✓ …')`` in its place), the package
patched by an answer cell — never changes a grade (the grader restores the checker and the
package first, :mod:`llminfra.course.grade`), but a teacher should know: such a result carries
a ``tampered`` note, its chapter's marks are followed by :data:`TAMPER_MARK` in the summary
(``✓✓✗†``), the summary lists every tampered exercise below the table, the report prints the
note on the exercise's line, and the CSV has a ``tampered`` column.
"""

from __future__ import annotations

import csv
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

STATUSES = ("passed", "failed", "not attempted", "errored")
COLUMNS = ("student", "notebook", "exercise", "status", "points", "message", "tampered")
#: points per status (one per passed exercise) and each status's mark in the summary
POINTS = {"passed": 1, "failed": 0, "not attempted": 0, "errored": 0}
MARKS = {"passed": "✓", "failed": "✗", "not attempted": "·", "errored": "!"}
#: after a chapter's marks in the summary: one of its exercises was tampered with
TAMPER_MARK = "†"
#: the widest student name the summary shows whole
NAME_WIDTH = 20
#: the legend's lines are wrapped at this width
LINE_WIDTH = 100
#: the most characters of a message or tamper note a report keeps (a 20 MB exception message
#: from an answer must not become a 20 MB CSV cell); the rest is cut, saying how much
MESSAGE_LIMIT = 2000


def capped(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` cut to about ``limit`` characters, ending in ``… (N more characters cut)``."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"… ({len(text) - limit:,} more characters cut)"


@dataclass(frozen=True)
class Result:
    """One exercise of one student: a row of the report."""

    student: str
    notebook: str
    exercise: str
    status: str
    message: str = ""
    #: what the learner's notebook had tampered with ("" when nothing): graded all the same
    tampered: str = ""

    def __post_init__(self):
        if self.status not in POINTS:
            raise ValueError(f"unknown status {self.status!r}; the statuses are {STATUSES}")
        object.__setattr__(self, "message", capped(self.message))      # frozen: set once here
        object.__setattr__(self, "tampered", capped(self.tampered))

    @property
    def points(self) -> int:
        return POINTS[self.status]


def report(results: list[Result]) -> str:
    """A plain-text report: per student, one line per exercise, then the student's total."""
    lines = []
    for student in sorted({r.student for r in results}):
        mine = [r for r in results if r.student == student]
        passed = sum(r.status == "passed" for r in mine)
        lines.append(f"{student}: {passed} of {len(mine)} exercises passed")
        for r in mine:
            first = r.message.strip().splitlines()[0] if r.message.strip() else ""
            lines.append(f"  {r.notebook:<45} {r.exercise:<32} {r.status:<14} {first[:100]}")
            if r.tampered:
                lines.append(f"  {TAMPER_MARK} tampered: {r.tampered}")
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    tampered = sum(bool(r.tampered) for r in results)
    lines.append("total: " + ", ".join(f"{n} {s}" for s, n in counts.items())
                 + f" ({len(results)} exercises, {len({r.student for r in results})} students)"
                 + (f"; {tampered} tampered with" if tampered else ""))
    return "\n".join(lines)


def fit_name(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` padded to ``width``, or cut in the middle with ``…`` (its start and its end
    kept: ``student_name_01`` and ``student_name_02`` stay apart)."""
    if len(name) <= width:
        return name.ljust(width)
    tail = (width - 1) // 2
    return name[:width - 1 - tail] + "…" + name[len(name) - tail:]


def _chapter(notebook: str) -> str:
    """The column title of a notebook: its number (``02``), else its name without ``.ipynb``."""
    stem = notebook.removesuffix(".ipynb")
    head = stem.split("_", 1)[0]
    return head if head else stem


def summary(results: list[Result]) -> str:
    """Students × chapters (see the module docstring): each chapter a string of marks
    (:data:`MARKS`) in exercise order, then the student's points and the points possible; a
    legend, the class's total and each chapter's exercises in column order below."""
    order: dict[str, list[str]] = {}            # notebook -> exercises, in first-seen order
    for r in results:
        exercises = order.setdefault(r.notebook, [])
        if r.exercise not in exercises:
            exercises.append(r.exercise)
    notebooks = sorted(order)
    titles = {nb: _chapter(nb) for nb in notebooks}
    tampered = [r for r in results if r.tampered]
    flagged = {(r.student, r.notebook) for r in tampered}
    widths = {nb: max(len(titles[nb]), len(order[nb]) + any(n == nb for _, n in flagged))
              for nb in notebooks}
    status = {(r.student, r.notebook, r.exercise): r.status for r in results}
    students = sorted({r.student for r in results})
    width = min(NAME_WIDTH, max([len("student")] + [len(s) for s in students]))
    possible = sum(len(ex) for ex in order.values())
    lines = [" ".join([fit_name("student", width)] + [titles[nb].ljust(widths[nb])
                                                       for nb in notebooks] + ["points"])]
    total = 0
    for student in students:
        cells = []
        for nb in notebooks:
            marks = "".join(MARKS[status[student, nb, ex]] if (student, nb, ex) in status
                            else " " for ex in order[nb])
            if (student, nb) in flagged:
                marks += TAMPER_MARK
            cells.append(marks.ljust(widths[nb]))
        points = sum(POINTS[s] for (who, _, _), s in status.items() if who == student)
        total += points
        lines.append(" ".join([fit_name(student, width)] + cells + [f"{points} / {possible}"]))
    lines.append("  ".join(f"{m} {s}" for s, m in MARKS.items())
                 + "; one point per passed exercise; blank: not graded")
    lines.append(f"class: {total} of {possible * len(students)} points "
                 f"({len(students)} students)")
    for nb in notebooks:
        names = [ex.removeprefix(titles[nb] + "-") for ex in order[nb]]
        lines.append(textwrap.fill(f"{titles[nb]}: " + ", ".join(names), LINE_WIDTH,
                                   subsequent_indent=" " * (len(titles[nb]) + 2)))
    if tampered:
        lines.append(f"{TAMPER_MARK} tampered with (graded with the course's own checker and "
                     "package all the same):")
        for r in sorted(tampered, key=lambda r: (r.student, r.notebook)):
            lines.append(textwrap.fill(f"{r.student}, {r.exercise}: {r.tampered}", LINE_WIDTH,
                                       initial_indent="  ", subsequent_indent="    "))
    return "\n".join(lines)


def write_csv(results: list[Result], path: Path) -> None:
    """The report as CSV with the columns :data:`COLUMNS` (the long form: a row per exercise)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow({**asdict(r), "points": r.points})


def exercise_order(results: list[Result]) -> list[tuple[str, str]]:
    """Every ``(notebook, exercise)``, by notebook name and then in the notebook's order."""
    order: dict[str, list[str]] = {}
    for r in results:
        exercises = order.setdefault(r.notebook, [])
        if r.exercise not in exercises:
            exercises.append(r.exercise)
    return [(nb, ex) for nb in sorted(order) for ex in order[nb]]


def exercise_label(notebook: str, exercise: str) -> str:
    """A column's title: the exercise id (``07-bubble``), the notebook's name for a notebook
    that could not be graded at all (exercise ``*``)."""
    return notebook if exercise == "*" else exercise


def write_csv_by_student(results: list[Result], path: Path) -> None:
    """The wide form: one row per student — ``student``, a column per exercise holding its
    points (``1`` / ``0``, empty where not graded), then ``points``, ``max_points`` and
    ``tampered`` (the student's tamper notes, ``; ``-joined) — for a spreadsheet or an LMS
    grade import."""
    keys = exercise_order(results)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *(exercise_label(*k) for k in keys), "points",
                         "max_points", "tampered"])
        for student in sorted({r.student for r in results}):
            mine = {(r.notebook, r.exercise): r for r in results if r.student == student}
            notes = [f"{r.exercise}: {r.tampered}" for r in mine.values() if r.tampered]
            writer.writerow([student, *(mine[k].points if k in mine else "" for k in keys),
                             sum(r.points for r in mine.values()), len(keys), "; ".join(notes)])
