"""Run one learner's notebook for the grader: the guard cell, the checker cells rewritten, a
quiet kernel, the time limit (used by :mod:`llminfra.course.grade`).

Each graded notebook gets a fresh random ``marker``. A first cell (:func:`guard_cell`) installs
:mod:`llminfra.course.grade_guard` in the kernel; each checker cell becomes
(:func:`checker_cell`)::

    <guard>.before_check()          # the package put back; prints "<marker> changed …"
    ch07 = <the pristine ch07>       # (a bare check_x is re-bound from it the same way)
    try:
        check_bubble(bubble)         # the cell's checker call, as the course wrote it
    finally:
        <guard>.after_check()        # the learner's own changes re-applied
    <guard>.passed()                 # prints "<marker> returned": the checker did not raise
    print(...)                       # the cell's follow-up lines, as the course wrote them

so the grader knows whether the *checker* passed even when a follow-up line raised, and an
answer cannot print the marker (it does not know it). The kernel is started with its
start-up warnings silenced (:data:`KERNEL_ARGUMENTS`, :data:`KERNEL_ENV`): they are the same for
every notebook and say nothing about the learner's work.
"""

from __future__ import annotations

import ast
import os
import re
import secrets
from pathlib import Path

import nbformat

from llminfra.course import grade_guard

TIMEOUT_ENAME = "CellTimeout"
#: the kernel's own log at ERROR only: ipykernel 7 warns on every start that the kernel runs over
#: TCP without encryption (a local kernel on the grader's own machine)
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]
#: debugpy's "frozen modules may make the debugger miss breakpoints" (Python ≥ 3.11), which a
#: kernel prints on stderr when debugpy starts; the grader never debugs
KERNEL_ENV = {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}


def new_marker() -> str:
    """A token no answer can know in advance: it prefixes the grader's own output lines."""
    return "grader-" + secrets.token_hex(8)


def guard_name(marker: str) -> str:
    """The guard's name in the learner's namespace (unguessable, like the marker)."""
    return "_" + marker.replace("-", "_")


def guard_cell(marker: str, chapter: str) -> nbformat.NotebookNode:
    """The first cell: the guard's source executed in a private namespace, installed, and the
    chapter's checker module imported before any answer runs."""
    source = Path(grade_guard.__file__).read_text(encoding="utf-8")
    code = (f"_grader_ns = {{'__name__': '_llminfra_grade_guard'}}\n"
            f"exec(compile({source!r}, '<llminfra grader>', 'exec'), _grader_ns)\n"
            f"{guard_name(marker)} = _grader_ns['Guard']({marker!r}).install("
            f"['llminfra.course.checks.ch{chapter}'])\n"
            "del _grader_ns\n")
    return nbformat.v4.new_code_cell(code)


def _checker_statement(tree: ast.Module):
    """The first top-level statement that calls a ``check_…`` function, or None."""
    for stmt in tree.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name.startswith("check_"):
                    return stmt
    return None


def checker_cell(source: str, chapter: str, marker: str) -> str:
    """``source`` rewritten as the module docstring shows. A cell whose checker call cannot be
    told apart from the rest (a syntax error, two statements on its line) is wrapped whole, so
    it passes only when every line of it ran."""
    g = guard_name(marker)
    modules = sorted(set(re.findall(r"\b(ch\d\d)\.check_", source)))
    bare = sorted(set(re.findall(r"(?<![.\w])(check_\w+)\s*\(", source)))
    prelude = [f"{g}.before_check()"]
    prelude += [f"{m} = {g}.module('llminfra.course.checks.{m}')" for m in modules]
    checks = f"llminfra.course.checks.ch{chapter}"
    prelude += [f"if {g}.has({checks!r}, {name!r}):\n    {name} = {g}.module({checks!r}).{name}"
                for name in bare]
    lines = source.splitlines()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    stmt = _checker_statement(tree) if tree is not None else None
    if stmt is None or stmt.col_offset != 0 or _shares_lines(tree, stmt):
        head, call, tail = [], lines, []
    else:
        head, call, tail = (lines[:stmt.lineno - 1], lines[stmt.lineno - 1:stmt.end_lineno],
                            lines[stmt.end_lineno:])
    body = (prelude + head + ["try:"] + ["    " + line for line in call or ["pass"]]
            + ["finally:", f"    {g}.after_check()", f"{g}.passed()"] + tail)
    return "\n".join(body) + "\n"


def _shares_lines(tree: ast.Module, stmt) -> bool:
    return any(other is not stmt and other.lineno <= stmt.end_lineno
               and other.end_lineno >= stmt.lineno for other in tree.body)


def read_stdout(cell, marker: str) -> tuple[str, list[str], bool]:
    """``(printed, notes, returned)`` from a checker cell's stdout: what the cell printed before
    the grader's "returned" line (all of it when there is none), the grader's other lines
    without the marker, and whether the checker call returned. No ``marker``: all is printed."""
    text = "".join(out.get("text", "") for out in cell.get("outputs", [])
                   if out.get("output_type") == "stream" and out.get("name") == "stdout")
    printed, notes, returned = [], [], False
    for line in text.splitlines():
        if marker and line.startswith(marker + " "):
            note = line[len(marker) + 1:]
            returned = returned or note == "returned"
            if note != "returned":
                notes.append(note)
        elif not returned:
            printed.append(line)
    return "\n".join(printed), notes, returned


def interrupted(cell) -> bool:
    """Did ``cell`` end at the time limit (or in a ``KeyboardInterrupt``)?"""
    return any(out.get("output_type") == "error"
               and out.get("ename") in (TIMEOUT_ENAME, "KeyboardInterrupt")
               for out in cell.get("outputs", []))


class _KernelStuck(Exception):
    """A cell swallowed the time limit's interrupt: its kernel cannot run another cell."""


def run_notebook(nb, cwd: Path, timeout_s: int, kernel: str = "python3"):
    """Execute ``nb`` (in memory; nothing is written) in a fresh, quiet kernel started in
    ``cwd``; return it with its outputs, or raise when the kernel cannot run it."""
    from nbclient import NotebookClient

    error = {"ename": TIMEOUT_ENAME, "evalue": f"the cell ran longer than {timeout_s} s and was "
             "interrupted", "traceback": []}

    def on_cell_executed(cell, cell_index, execute_reply):
        # a cell that swallows the interrupt (a bare ``except:``) sends no error output: the
        # time-out is only in nbclient's stand-in reply, so it is written into the cell here;
        # its kernel is still busy in that cell, so every later cell would only wait out its
        # own time limit: stop here (the grader marks the later checkers errored)
        if ((execute_reply or {}).get("content", {}).get("ename") == TIMEOUT_ENAME
                and not interrupted(cell)):
            cell.outputs.append(nbformat.v4.new_output("error", **error))
            raise _KernelStuck(cell_index)

    client = NotebookClient(
        nb, timeout=timeout_s, kernel_name=kernel, allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout=error, on_cell_executed=on_cell_executed,
        # a kernel that starts slowly on a loaded machine (a class graded at once) is no
        # learner's fault: wait for it as long as for a cell (nbclient's default is 60 s)
        startup_timeout=max(60, timeout_s),
        extra_arguments=list(KERNEL_ARGUMENTS), resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute(env={**os.environ, **KERNEL_ENV})
    except _KernelStuck:
        pass                         # nbclient has shut the kernel down on the way out
    return nb
