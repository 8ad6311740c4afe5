"""The grader against notebooks written to attack it (issue 54): no student can change another's
grade, forge a pass, or leave a process behind.

One class, graded once by ``python -m llminfra.course.grade`` in a subprocess, on a throwaway
install of the course (a copy of ``llminfra/`` and an ``exercises/`` beside it, imported through
``PYTHONPATH``), so that the hostile notebooks rewrite that copy and never this checkout. Its one
exercise notebook is a chapter "99" of two tiny exercises whose checker module has no torch in
it, so each of the ten kernels starts in about a second. The students are graded one at a time
in name order, each attacker just before its victim:

* ``a1`` rewrites ``b1``'s notebook (its checker cells turned into prints): ``b1`` must be graded
  on what it handed in, not reported as tampering; the file is put back and ``a1`` reported;
* ``c1`` rewrites the checker module to pass everything: ``d1``'s wrong answers must still fail;
* ``e1`` rewrites the reference exercise (checker cells turned into prints): ``f1``'s wrong
  answers must still fail, untampered; the reference is put back and ``e1`` reported;
* ``g1`` looks for the grader's pass marker in ``globals()`` (and on the guard) and prints it
  with a ``✓`` line before its wrong answer fails;
* ``h1`` forks a sleeping child and starts another in its own session: both must be dead after;
* ``i1`` passes its first exercise, then kills its kernel: the first grade must be kept;
* ``j1`` raises an exception with a 20 MB message: the report must hold a short one.

On the grader before this change each of the tests below fails (checked by running them against
``git archive HEAD``)."""

import csv
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.slow   # kernels run the notebooks

ROOT = Path(__file__).resolve().parents[1]
NB = "99_hostile.ipynb"
CHECKER = '''
"""A tiny chapter-99 checker module, no torch: the hostile notebooks' target."""


class CheckFailed(Exception):
    pass


class NotAttempted(CheckFailed):
    pass


def _judge(name, fn, x, expected):
    try:
        got = fn(x)
    except NotImplementedError:
        raise NotAttempted(f"{name}: not implemented yet") from None
    if got != expected:
        raise CheckFailed(f"{name}({x}) returned {got!r}, expected {expected!r}")
    print(f"✓ {name}: 1 case passed")


def check_double(fn):
    _judge("double", fn, 3, 6)


def check_square(fn):
    _judge("square", fn, 3, 9)
'''
STUB = 'raise NotImplementedError("your code here")'
RIGHT = {"double": "return 2 * x", "square": "return x * x"}
WRONG = {"double": "return 2 * x + 1", "square": "return x + x"}


def _notebook(double: str, square: str, before_square: str | None = None,
              before_double: str | None = None, printed_checks: bool = False):
    """The chapter-99 notebook: an import cell, then per exercise an answer cell (``def`` with
    the given body) and its checker cell; optional extra cells before a checker cell."""
    nb = nbformat.v4.new_notebook()
    cells = [nbformat.v4.new_code_cell("from llminfra.course.checks.ch99 import check_double, "
                                       "check_square")]
    for name, body, extra in (("double", double, before_double),
                              ("square", square, before_square)):
        answer = nbformat.v4.new_code_cell(f"def {name}(x):\n" + textwrap.indent(body, "    "))
        answer.metadata["nbgrader"] = {"grade": False, "grade_id": f"99-{name}-answer",
                                       "solution": True}
        cells.append(answer)
        if extra is not None:
            cells.append(nbformat.v4.new_code_cell(extra))
        source = (f"print('✓ {name}: 1 case passed')" if printed_checks
                  else f"check_{name}({name})")
        check = nbformat.v4.new_code_cell(source)
        check.metadata["nbgrader"] = {"grade": True, "grade_id": f"99-{name}", "points": 1}
        cells.append(check)
    nb.cells = cells
    return nb


def _rewrite(path: Path, text: str) -> str:
    """An answer body that overwrites ``path`` with ``text``, then answers right."""
    return f"open({str(path)!r}, 'w').write({text!r})\nreturn 2 * x"


FORGE = """
found = []
for value in list(globals().values()):
    for attr in ("marker", "_marker", "token", "secret"):
        secret = getattr(value, attr, None)
        if isinstance(secret, str) and secret:
            found.append(secret)
    if isinstance(value, str) and value.startswith("grader-"):
        found.append(value)
for secret in found:
    print("✓ double: 1 case passed")
    print(f"{secret} returned")
print("forged:", found)
return 2 * x + 1
"""

FORK = """
import os, subprocess, sys, time
pid = os.fork()
if pid == 0:                    # lets go of the grader's pipes, so only a kill ends it early
    os.closerange(0, 4096)
    time.sleep(300)
    os._exit(0)
other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],
                         start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open({pids!r}, 'w').write(f"{{pid}} {{other.pid}}")
"""

HUGE = 'raise ValueError("x" * 20_000_000)'


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The install, the class, the grading; returns ``(rows by (student, exercise), paths)``."""
    top = tmp_path_factory.mktemp("hostile")
    install = top / "install"
    shutil.copytree(ROOT / "llminfra", install / "llminfra",
                    ignore=shutil.ignore_patterns("data", ".pytest_cache"))
    checks = install / "llminfra" / "course" / "checks" / "ch99.py"
    checks.write_text(CHECKER)
    (install / "exercises").mkdir()
    reference = install / "exercises" / NB
    nbformat.write(_notebook(STUB, STUB), reference)
    root = top / "class"
    pids = top / "pids.txt"
    forged_checker = CHECKER.replace("    if got != expected:\n", "    if False:\n")
    forged_reference = nbformat.writes(_notebook(STUB, STUB, printed_checks=True))
    students = {
        "a1_notebook_vandal": _notebook(_rewrite(root / "b1_notebook_victim" / NB,
                                                 forged_reference), RIGHT["square"]),
        "b1_notebook_victim": _notebook(WRONG["double"], WRONG["square"]),
        "c1_checker_vandal": _notebook(_rewrite(checks, forged_checker), RIGHT["square"]),
        "d1_checker_victim": _notebook(WRONG["double"], WRONG["square"]),
        "e1_reference_vandal": _notebook(_rewrite(reference, forged_reference), RIGHT["square"]),
        "f1_reference_victim": _notebook(WRONG["double"], WRONG["square"]),
        "g1_forger": _notebook(FORGE, WRONG["square"]),
        "h1_forker": _notebook(RIGHT["double"], RIGHT["square"],
                               before_double=FORK.format(pids=str(pids))),
        "i1_crasher": _notebook(RIGHT["double"], RIGHT["square"],
                                before_square="import os\nos._exit(1)"),
        "j1_huge": _notebook(HUGE, RIGHT["square"]),
    }
    for student, nb in students.items():
        (root / student).mkdir(parents=True)
        nbformat.write(nb, root / student / NB)
    originals = {p: p.read_bytes() for p in (reference, root / "b1_notebook_victim" / NB)}
    csv_path = top / "report.csv"
    env = {**os.environ, "PYTHONPATH": str(install), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "llminfra.course.grade", str(root), "--csv",
                          str(csv_path), "--timeout", "60", "--jobs", "1"],
                         cwd=top, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(csv_path) as f:
        rows = {(r["student"], r["exercise"]): r for r in csv.DictReader(f)}
    return rows, dict(top=top, checks=checks, reference=reference, pids=pids,
                      originals=originals, csv=csv_path, stdout=run.stdout)


def _row(rows, student: str, exercise: str) -> dict:
    return rows[next(s for s, _ in rows if s.startswith(student)), f"99-{exercise}"]


def test_rewriting_another_students_notebook_changes_nothing_for_them(hostile):
    rows, paths = hostile
    for ex in ("double", "square"):
        victim = _row(rows, "b1", ex)
        assert (victim["status"], victim["tampered"]) == ("failed", ""), victim
    assert "b1_notebook_victim" in _row(rows, "a1", "double")["tampered"]
    assert _row(rows, "a1", "square")["tampered"] == ""          # reported once (issue 53)
    victim_path = next(p for p in paths["originals"] if "b1_" in str(p))
    assert victim_path.read_bytes() == paths["originals"][victim_path]        # put back


def test_rewriting_the_checker_module_passes_no_wrong_answer(hostile):
    rows, paths = hostile
    assert [_row(rows, "d1", ex)["status"] for ex in ("double", "square")] == ["failed"] * 2
    assert "checks/ch99.py" in _row(rows, "c1", "double")["tampered"]
    assert "if False:" in paths["checks"].read_text()        # reported, left for a reinstall


def test_rewriting_the_reference_exercise_passes_no_wrong_answer(hostile):
    rows, paths = hostile
    for ex in ("double", "square"):
        victim = _row(rows, "f1", ex)
        assert (victim["status"], victim["tampered"]) == ("failed", ""), victim
    assert NB in _row(rows, "e1", "double")["tampered"]
    reference = paths["reference"]
    assert reference.read_bytes() == paths["originals"][reference]            # put back


def test_no_pass_marker_to_forge_from_globals(hostile):
    rows, _ = hostile
    forger = _row(rows, "g1", "double")
    assert forger["status"] == "failed" and "double(3) returned 7" in forger["message"], forger


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")            # a zombie has finished


def test_no_child_of_a_kernel_outlives_grading(hostile):
    rows, paths = hostile
    assert _row(rows, "h1", "double")["status"] == "passed"
    pids = [int(p) for p in paths["pids"].read_text().split()]
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if _alive(p)]
    for pid in alive:                          # never leave them behind, even when failing
        os.kill(pid, 9)
    assert alive == [], f"still running after grading: {alive}"


def test_grades_earned_before_the_kernel_died_are_kept(hostile):
    rows, _ = hostile
    assert _row(rows, "i1", "double")["status"] == "passed"
    square = _row(rows, "i1", "square")
    assert square["status"] == "errored" and "kernel died" in square["message"], square


def test_a_huge_error_message_is_cut_in_the_report(hostile):
    rows, paths = hostile
    huge = _row(rows, "j1", "double")
    assert huge["status"] == "errored" and huge["message"].startswith("ValueError: xxx")
    assert len(huge["message"]) < 2100 and "more characters cut" in huge["message"]
    assert paths["csv"].stat().st_size < 100_000
    assert len(paths["stdout"]) < 100_000
    assert _row(rows, "j1", "square")["status"] == "passed"
