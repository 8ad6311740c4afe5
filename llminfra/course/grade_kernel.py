"""Run one learner's notebook for the grader: the guard cell, each checker cell split in two, a
quiet kernel in a sandbox, the time limit, the kernel's whole process group ended (used by
:mod:`llminfra.course.grade`).

The grader decides a pass from what the *kernel protocol* says about a cell that holds nothing
but the checker call, never from a line the notebook prints. A first cell
(:func:`guard_cell`) installs :mod:`llminfra.course.grade_guard`; each checker cell becomes two
cells (:func:`checker_cells`)::

    _llminfra_grader.before_check()     # the package put back; prints "llminfra-grader changed …"
    ch07 = _llminfra_grader.module('llminfra.course.checks.ch07')   # the pristine checker module
    try:
        check_bubble(bubble)            # the cell's checker call, as the course wrote it
    finally:
        _llminfra_grader.after_check()  # the learner's own changes re-applied
    ─── next cell ───
    print(...)                          # the cell's follow-up lines, as the course wrote them

and the checker passed when the first cell's ``execute_reply`` — which the kernel sends on its
shell channel after the cell has run, and which nbclient hands the grader — has status ``ok``
(and the checker printed its ``✓`` line). There is no secret in the kernel to steal: no marker
in ``globals()``, none on the guard, none in the cells' code. An answer that prints a ``✓`` line,
or anything else, passes nothing; an answer that makes its checker raise is failed whatever it
printed. (What it does not stop: code that rewrites the kernel's own messaging — IPython's
``run_cell``, ipykernel's session — from inside; a teacher reading such an answer sees it.)

The kernel starts in its sandbox (:mod:`llminfra.course.grade_sandbox`) with its start-up
warnings silenced (:data:`KERNEL_ARGUMENTS`, :data:`KERNEL_ENV`); when the notebook is done,
every process the kernel started is killed: its process group, and every descendant seen after
any cell (a child that left the group with ``setsid``). A kernel that dies part-way keeps the
outputs of the cells it ran (:class:`Run`).
"""

from __future__ import annotations

import ast
import os
import re
import signal
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from llminfra.course import grade_guard

TIMEOUT_ENAME = "CellTimeout"
#: the guard's name in the learner's namespace (no secret: the pass is read from the protocol)
GUARD = "_llminfra_grader"
#: the prefix of the guard's own lines in a checker cell's output ("… changed llminfra.x.f")
NOTE_PREFIX = "llminfra-grader"
#: the metadata key of the grader's cells: which learner cell each came from, in which role
ROLE_KEY = "llminfra_grade"
#: the kernel's own log at ERROR only: ipykernel 7 warns on every start that the kernel runs over
#: TCP without encryption (a local kernel on the grader's own machine)
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]
#: debugpy's "frozen modules may make the debugger miss breakpoints" (Python ≥ 3.11), which a
#: kernel prints on stderr when debugpy starts; the grader never debugs
KERNEL_ENV = {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}


def guard_cell(chapter: str) -> nbformat.NotebookNode:
    """The first cell: the guard's source executed in a private namespace, installed, and the
    chapter's checker module imported before any answer runs."""
    source = Path(grade_guard.__file__).read_text(encoding="utf-8")
    code = (f"_grader_ns = {{'__name__': '_llminfra_grade_guard'}}\n"
            f"exec(compile({source!r}, '<llminfra grader>', 'exec'), _grader_ns)\n"
            f"{GUARD} = _grader_ns['Guard']({NOTE_PREFIX!r}).install("
            f"['llminfra.course.checks.ch{chapter}'])\n"
            "del _grader_ns\n")
    return _role(nbformat.v4.new_code_cell(code), "guard", -1)


def _role(cell, role: str, index: int):
    cell.metadata[ROLE_KEY] = {"role": role, "index": index}
    return cell


def role_of(cell) -> tuple[str, int]:
    """``(role, learner cell index)`` of an executed cell: ``guard``, ``learner``, ``check`` or
    ``tail``."""
    meta = cell.get("metadata", {}).get(ROLE_KEY, {})
    return meta.get("role", "learner"), meta.get("index", -1)


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


def checked_argument(source: str) -> str:
    """The name of the learner's function a checker cell passes to its checker
    (``ch01.check_param_count(count_params)`` -> ``count_params``), or ''."""
    try:
        stmt = _checker_statement(ast.parse(source))
    except SyntaxError:
        return ""
    for node in ast.walk(stmt) if stmt is not None else ():
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name.startswith("check_") and node.args and isinstance(node.args[0], ast.Name):
                return node.args[0].id
    return ""


def checker_cells(source: str, chapter: str) -> tuple[str, str]:
    """``(check, tail)``: ``source`` split as the module docstring shows. A cell whose checker
    call cannot be told apart from the rest (a syntax error, two statements on its line) is
    wrapped whole, so it passes only when every line of it ran; its tail is empty."""
    modules = sorted(set(re.findall(r"\b(ch\d\d)\.check_", source)))
    bare = sorted(set(re.findall(r"(?<![.\w])(check_\w+)\s*\(", source)))
    prelude = [f"{GUARD}.before_check()"]
    prelude += [f"{m} = {GUARD}.module('llminfra.course.checks.{m}')" for m in modules]
    checks = f"llminfra.course.checks.ch{chapter}"
    prelude += [f"if {GUARD}.has({checks!r}, {name!r}):\n    {name} = "
                f"{GUARD}.module({checks!r}).{name}" for name in bare]
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
            + ["finally:", f"    {GUARD}.after_check()"])
    return "\n".join(body) + "\n", "\n".join(tail)


def _shares_lines(tree: ast.Module, stmt) -> bool:
    return any(other is not stmt and other.lineno <= stmt.end_lineno
               and other.end_lineno >= stmt.lineno for other in tree.body)


def grading_notebook(nb, checkers: list[int], chapter: str):
    """The notebook the kernel runs: the guard cell, then the learner's cells in order, each
    checker cell (indices ``checkers``) as its check cell and its tail cell; every cell tagged
    with :func:`role_of`."""
    out = nbformat.v4.new_notebook(metadata=nb.metadata)
    out.cells.append(guard_cell(chapter))
    for i, cell in enumerate(nb.cells):
        if i not in checkers:
            copy = nbformat.from_dict(deepcopy(dict(cell)))
            out.cells.append(_role(copy, "learner", i))
            continue
        check, tail = checker_cells(cell.source, chapter)
        out.cells.append(_role(nbformat.v4.new_code_cell(check), "check", i))
        if tail.strip():
            out.cells.append(_role(nbformat.v4.new_code_cell(tail), "tail", i))
    return out


def read_stdout(cell) -> tuple[str, list[str]]:
    """``(printed, notes)`` from a check cell's stdout: what the cell printed, and the guard's
    own lines without their :data:`NOTE_PREFIX`."""
    text = "".join(out.get("text", "") for out in cell.get("outputs", [])
                   if out.get("output_type") == "stream" and out.get("name") == "stdout")
    printed, notes = [], []
    for line in text.splitlines():
        if line.startswith(NOTE_PREFIX + " "):
            notes.append(line[len(NOTE_PREFIX) + 1:])
        else:
            printed.append(line)
    return "\n".join(printed), notes


def interrupted(cell) -> bool:
    """Did ``cell`` end at the time limit (or in a ``KeyboardInterrupt``)?"""
    return any(out.get("output_type") == "error"
               and out.get("ename") in (TIMEOUT_ENAME, "KeyboardInterrupt")
               for out in cell.get("outputs", []))


@dataclass
class Run:
    """A notebook as the kernel ran it: ``nb`` with its outputs (in place), the ``execute_reply``
    content of each cell that got one (``status``, ``ename``, ``evalue``: by cell index), and,
    when the kernel died, the index of the cell it died in and why."""

    nb: object
    replies: dict[int, dict] = field(default_factory=dict)
    died_at: int | None = None
    died: str = ""


class _KernelStuck(Exception):
    """A cell swallowed the time limit's interrupt: its kernel cannot run another cell."""


def _process_table() -> dict[int, tuple[int, int]]:
    """``pid -> (parent pid, start time)`` of every process, from ``/proc`` (Linux; empty
    elsewhere: only the process group is then killed)."""
    table = {}
    for entry in Path("/proc").glob("[0-9]*/stat") if Path("/proc").is_dir() else ():
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
            table[int(entry.parent.name)] = (int(fields[1]), int(fields[19]))
        except (OSError, IndexError, ValueError):
            continue
    return table


class _Processes:
    """The kernel's process group and every descendant seen, to kill when the notebook ends."""

    def __init__(self):
        self.pgid: int | None = None
        self.seen: dict[int, int] = {}            # pid -> start time (a reused pid is spared)

    def start(self, pid: int | None) -> None:
        if pid is None:
            return
        try:
            self.pgid = os.getpgid(pid)
        except OSError:
            self.pgid = None
        self.note(pid)

    def note(self, pid: int | None) -> None:
        """Remember ``pid`` and its descendants as they are now."""
        if pid is None:
            return
        table = _process_table()
        todo, visited = [pid], set()
        while todo:
            p = todo.pop()
            if p in table and p not in visited:
                visited.add(p)
                self.seen[p] = table[p][1]
                todo += [c for c, (parent, _) in table.items() if parent == p]

    def kill(self) -> None:
        """SIGKILL the process group and every remembered descendant still alive."""
        if self.pgid is not None and self.pgid != os.getpgid(0):
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except OSError:
                pass
        table = _process_table()
        for pid, started in self.seen.items():
            if pid in table and table[pid][1] == started and pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _kernel_pid(client) -> int | None:
    provisioner = getattr(getattr(client, "km", None), "provisioner", None)
    return getattr(provisioner, "pid", None) or getattr(getattr(provisioner, "process", None),
                                                        "pid", None)


def run_notebook(nb, cwd: Path, timeout_s: int, kernel: str = "python3",
                 env: dict | None = None) -> Run:
    """Execute ``nb`` (in memory; nothing is written) in a fresh, quiet kernel started in
    ``cwd`` with ``env`` added to the environment; never raises for what the notebook did (a
    kernel that dies is :attr:`Run.died`). Every process the kernel started is killed after."""
    from nbclient import NotebookClient

    error = {"ename": TIMEOUT_ENAME, "evalue": f"the cell ran longer than {timeout_s} s and was "
             "interrupted", "traceback": []}
    run = Run(nb)
    processes = _Processes()
    current = {"index": None}

    def on_notebook_start(notebook):
        processes.start(_kernel_pid(client))

    def on_cell_start(cell, cell_index):
        current["index"] = cell_index

    def on_cell_executed(cell, cell_index, execute_reply):
        content = (execute_reply or {}).get("content", {})
        run.replies[cell_index] = {k: content.get(k) for k in ("status", "ename", "evalue")}
        processes.note(_kernel_pid(client))
        # a cell that swallows the interrupt (a bare ``except:``) sends no error output: the
        # time-out is only in nbclient's stand-in reply, so it is written into the cell here;
        # its kernel is still busy in that cell, so every later cell would only wait out its
        # own time limit: stop here (the grader marks the later checkers errored)
        if content.get("ename") == TIMEOUT_ENAME and not interrupted(cell):
            cell.outputs.append(nbformat.v4.new_output("error", **error))
            raise _KernelStuck(cell_index)

    client = NotebookClient(
        nb, timeout=timeout_s, kernel_name=kernel, allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout=error, on_cell_executed=on_cell_executed, on_cell_start=on_cell_start,
        on_notebook_start=on_notebook_start,
        # a kernel that starts slowly on a loaded machine (a class graded at once) is no
        # learner's fault: wait for it as long as for a cell (nbclient's default is 60 s)
        startup_timeout=max(60, timeout_s), shutdown_kernel="immediate",
        extra_arguments=list(KERNEL_ARGUMENTS), resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute(env={**os.environ, **KERNEL_ENV, **(env or {})})
    except _KernelStuck:
        pass                         # nbclient has shut the kernel down on the way out
    except Exception as e:  # noqa: BLE001 - a dead kernel: the cells it ran keep their outputs
        run.died_at = current["index"] if current["index"] is not None else 0
        run.died = f"{type(e).__name__}: {e}"
    finally:
        processes.kill()
    return run
