"""The grader's guard (llminfra/course/grade_guard.py) on a small package of its own, in this
process: every way an answer cell can change what a checker computes with is put back before
the check, named, and re-applied after it; the package still imports and reads its files
through the guard's finder; the checker cell the grader runs around it. (The whole path, in a
kernel, is in test_grade.py.)"""

import importlib
import inspect
import math
import sys
import textwrap

import pytest

from llminfra.course import grade_guard
from llminfra.course.grade_kernel import GUARD, checker_cells

PKG = "graderprobe"
FILES = {
    "__init__.py": "",
    "data.txt": "pristine data\n",
    "ref.py": """
        import importlib.resources

        TABLE = {"bf16": 2, "fp32": 4}
        ORDER = [1, 2, 3]


        def reference(x, scale=2):
            return round(x * scale)


        def wrap(fn):
            def wrapped(*args):
                return fn(*args)
            return wrapped


        doubled = wrap(reference)


        class Pool:
            def allocate(self):
                return 0


        class Child(Pool):
            pass


        class Exhausted(Exception):
            pass


        def data():
            return (importlib.resources.files(__package__) / "data.txt").read_text()
    """,
    "check.py": """
        from graderprobe.ref import TABLE, reference


        def check(fn, x):
            expected = reference(x) + TABLE["bf16"]
            return fn(x) == expected
    """,
}


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """The package on sys.path (not imported yet), a guard for it installed, and everything
    undone afterwards."""
    root = tmp_path / PKG
    root.mkdir()
    for name, text in FILES.items():
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(grade_guard, "PACKAGE", PKG)
    guard = grade_guard.Guard("MARK").install()
    try:
        yield guard
    finally:
        guard.uninstall()
        for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
            del sys.modules[name]


def test_modules_imported_after_install_are_remembered_and_still_work(probe):
    ref = importlib.import_module(f"{PKG}.ref")
    assert f"{PKG}.ref" in probe.snapshots and f"{PKG}.check" not in probe.snapshots
    assert isinstance(ref.__loader__, grade_guard._Loader)
    assert ref.data() == "pristine data\n"                       # importlib.resources
    assert "return round(x * scale)" in inspect.getsource(ref.reference)
    assert probe.restore() == []                                  # nothing changed yet


def test_a_replaced_reference_function_is_put_back_named_and_reapplied(probe):
    check = importlib.import_module(f"{PKG}.check")
    ref = sys.modules[f"{PKG}.ref"]
    wrong = lambda x: 2  # noqa: E731 - the learner's wrong answer
    fake = lambda x: 0  # noqa: E731 - a reference made to agree with it
    check.reference = fake                  # the checker's own binding
    ref.reference = fake                    # and the package's
    assert check.check(wrong, 3)
    changed = probe.restore()
    assert changed == [f"{PKG}.ref.reference", f"{PKG}.check.reference"]
    assert not check.check(wrong, 3) and check.check(lambda x: round(2 * x) + 2, 3)
    probe.reapply()                         # the rest of the notebook runs as written
    assert check.reference is fake and ref.reference is fake


def test_code_defaults_and_closures_are_put_back(probe):
    ref = importlib.import_module(f"{PKG}.ref")
    original = ref.reference
    ref.reference.__code__ = (lambda x, scale=2: 0).__code__
    ref.reference.__defaults__ = (0,)
    ref.doubled.__closure__[0].cell_contents = lambda x: -1
    changed = probe.restore()
    assert ref.reference is original and ref.reference(3) == 6 and ref.doubled(3) == 6
    assert f"{PKG}.ref.reference (its code, defaults or closure)" in changed
    assert f"{PKG}.ref.wrap.<locals>.wrapped (its code, defaults or closure)" in changed
    probe.reapply()
    assert ref.reference(3) == 0 and ref.doubled(3) == -1


def test_class_attributes_containers_and_shadowing_names_are_put_back(probe):
    ref = importlib.import_module(f"{PKG}.ref")
    table, order = ref.TABLE, ref.ORDER
    ref.Pool.allocate = lambda self: 99
    ref.Child.allocate = lambda self: 98    # added: shadows the inherited method
    ref.TABLE["bf16"] = 3
    ref.ORDER.append(4)
    ref.round = lambda x: 7                 # added: shadows the builtin inside ref's code
    ref.cache = {"kept": 1}                 # added data: not the package's behaviour, left
    changed = probe.restore()
    assert ref.Pool().allocate() == 0 and ref.Child().allocate() == 0
    assert ref.TABLE is table and table == {"bf16": 2, "fp32": 4} and order == [1, 2, 3]
    assert ref.reference(3) == 6 and ref.cache == {"kept": 1}
    assert set(changed) == {f"{PKG}.ref.Pool.allocate", f"{PKG}.ref.Child.allocate",
                            f"{PKG}.ref.TABLE (its contents)", f"{PKG}.ref.ORDER (its contents)",
                            f"{PKG}.ref.round"}
    probe.reapply()
    assert ref.Child().allocate() == 98 and table["bf16"] == 3 and order[-1] == 4
    assert ref.reference(3) == 7


def test_identity_is_kept_so_the_answers_classes_are_the_checkers(probe):
    """Restoring in place, not re-importing: an exception class the answer raises is the one
    the checker catches."""
    ref = importlib.import_module(f"{PKG}.ref")
    exhausted = ref.Exhausted
    ref.Exhausted = type("Exhausted", (Exception,), {})
    probe.restore()
    assert ref.Exhausted is exhausted


def test_a_replaced_module_and_library_functions_are_put_back(probe, monkeypatch):
    check = importlib.import_module(f"{PKG}.check")
    fake_module = type(sys)(f"{PKG}.check")
    monkeypatch.setitem(sys.modules, f"{PKG}.check", fake_module)
    monkeypatch.setattr(math, "isclose", lambda *a, **k: True)
    changed = probe.restore()
    assert sys.modules[f"{PKG}.check"] is check and probe.module(f"{PKG}.check") is check
    assert math.isclose(1, 2) is False
    assert f"sys.modules['{PKG}.check']" in changed and "math.isclose" in changed


def test_before_check_prints_one_line_after_its_prefix(probe, capsys):
    """Nothing changed: the guard prints nothing; a change: one line, after the prefix. The
    guard holds no secret (the grader reads a pass from the kernel's reply, not a line)."""
    ref = importlib.import_module(f"{PKG}.ref")
    probe.before_check()
    probe.after_check()
    assert capsys.readouterr().out == ""
    ref.reference = None
    probe.before_check()
    assert capsys.readouterr().out == f"MARK changed {PKG}.ref.reference\n"
    assert not hasattr(probe, "marker") and not hasattr(probe, "passed")


def test_a_checker_cell_is_split_at_its_checker_call():
    """The checker call alone sits between the guard's calls in the check cell; the follow-up
    lines are the tail cell; a cell that cannot be split is wrapped whole, with no tail."""
    g = GUARD
    src = "_ = ch01.check_param_count(count_params)\nprint(f\"{count_params(1):,d}\")"
    check, tail = checker_cells(src, "01")
    assert check.splitlines() == [
        f"{g}.before_check()",
        f"ch01 = {g}.module('llminfra.course.checks.ch01')",
        "try:", "    _ = ch01.check_param_count(count_params)",
        "finally:", f"    {g}.after_check()"]
    assert tail == "print(f\"{count_params(1):,d}\")"
    bare, _ = checker_cells("check_bubble(bubble)", "07")
    assert (f"if {g}.has('llminfra.course.checks.ch07', 'check_bubble'):\n    check_bubble = "
            f"{g}.module('llminfra.course.checks.ch07').check_bubble\ntry:\n"
            "    check_bubble(bubble)\n") in bare
    for whole in ("x = 1; check_bubble(bubble)\nprint(x)", "check_bubble(bubble\nprint(1)"):
        check, tail = checker_cells(whole, "07")
        assert tail == "" and check.splitlines()[-1] == f"    {g}.after_check()"
        assert "    print(x)" in check.splitlines() or "    print(1)" in check.splitlines()
