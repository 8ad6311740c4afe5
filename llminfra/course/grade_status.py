"""One exercise's status from what the kernel ran for it (used by :mod:`llminfra.course.grade`).

A check cell holds the checker call alone (:mod:`llminfra.course.grade_kernel`): it *passed*
when the kernel's ``execute_reply`` says ``ok`` and the checker printed its ``✓`` line; the
exception in that reply names a failure (``CheckFailed``), an untouched stub (``NotAttempted``,
kept only while the learner's function still holds its ``raise NotImplementedError``:
:func:`still_stub`), a time-out, or anything else (``errored``). The guard's own lines name what
the answers had changed in the package (:func:`changes_note`, once per notebook).
"""

from __future__ import annotations

from llminfra.course.grade_kernel import TIMEOUT_ENAME, checked_argument, read_stdout

#: what a checker cell prints when its checker passes (run_checks and every custom checker)
PASS_MARK = "✓"


def _error(cell, reply: dict | None) -> tuple[str, str] | None:
    """``(ename, evalue)`` of the exception a cell ended in: the kernel's reply says (an answer
    that hides its traceback's display still has it there), else its error output."""
    if reply is not None and reply.get("status") == "error":
        return reply.get("ename") or "", reply.get("evalue") or ""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return out.get("ename", ""), out.get("evalue", "")
    return None


def status_of(cell, reply: dict | None = None, tail=None, checker: bool = True,
              tail_reply: dict | None = None) -> tuple[str, str]:
    """``(status, message)`` of an executed cell. A check cell (``checker=True``, its checker
    call alone, :mod:`llminfra.course.grade_kernel`) passed when the kernel's ``reply`` says
    ``ok`` and the checker printed its ``✓`` line; an error in its ``tail`` (the follow-up
    lines) leaves it passed, with a note. Any other cell passes unless it raised."""
    error = _error(cell, reply)
    if error is not None:
        ename, evalue = error
        if ename in (TIMEOUT_ENAME, "KeyboardInterrupt"):
            return "errored", f"interrupted: the cell ran longer than the time limit ({evalue or ename})"
        if checker and ename == "NotAttempted":
            return "not attempted", evalue
        if checker and ename == "CheckFailed":
            return "failed", evalue
        return "errored", f"{ename}: {evalue}"
    if not checker:
        return "passed", ""
    if reply is None or cell.get("execution_count") is None:
        return "errored", "the cell did not run (the kernel stopped before it)"
    if PASS_MARK not in read_stdout(cell)[0]:
        return "errored", "the checker did not report a pass (no ✓ line in the cell's output)"
    later = _error(tail, tail_reply) if tail is not None else None
    if later is not None:
        return "passed", (f"the checker passed; a later line of its cell then raised "
                          f"{later[0]}: {later[1]}")
    return "passed", ""


def changes_note(cell, reported: set[str] | None = None) -> str:
    """The guard's note on a check cell: what the answers had changed in the package, leaving
    out (and adding to ``reported``) what an earlier exercise of the notebook already named."""
    changed = [item for note in read_stdout(cell)[1] if note.startswith("changed ")
               for item in note.removeprefix("changed ").split("; ")]
    if reported is not None:
        changed = [c for c in changed if c not in reported]
        reported.update(changed)
    if not changed:
        return ""
    return ("the answer cells had changed " + "; ".join(changed) + " — put back for the check, "
            "so it judged the answer against the package's own code")


def still_stub(nb, checker_index: int) -> bool:
    """Does the learner's function that checker cell ``checker_index`` checks still hold a
    ``raise NotImplementedError`` (the exercise's stub, :data:`llminfra.course.exercises.STUB`)?
    True when it cannot be told (no such ``def`` found): the checker's word is kept."""
    name = checked_argument(nb.cells[checker_index].source)
    if not name:
        return True
    defining = [c.source for c in nb.cells[:checker_index]
                if c.cell_type == "code" and f"def {name}(" in c.source]
    return not defining or "raise NotImplementedError" in defining[-1]
