"""The browser test's output check (``browser_lab.output_mismatches``), which stands in for nbval
on the chapters the browser runs: it must see what nbval sees and forgive what nbval forgives."""

from __future__ import annotations

import copy

import nbformat
import pytest

from browser_lab import ROOT, output_mismatches, unsaved_widgets

CHAPTER = ROOT / "notebooks" / "05_serving_and_continuous_batching.ipynb"


@pytest.fixture(scope="module")
def stored():
    return nbformat.read(CHAPTER, as_version=4)


def _first_printing_cell(nb, tagged: bool):
    for cell in nb.cells:
        ignored = "nbval-ignore-output" in cell.get("metadata", {}).get("tags", [])
        if cell.cell_type == "code" and ignored == tagged and any(
                o.output_type == "stream" for o in cell.outputs):
            return cell
    raise AssertionError("no such cell")


def test_the_stored_run_agrees_with_itself(stored):
    assert output_mismatches(copy.deepcopy(stored), stored) == []


def test_a_changed_printed_number_is_a_mismatch(stored):
    ran = copy.deepcopy(stored)
    cell = _first_printing_cell(ran, tagged=False)
    out = next(o for o in cell.outputs if o.output_type == "stream")
    out.text = out.text + "0.1234\n"
    problems = output_mismatches(ran, stored)
    assert len(problems) == 1 and "stdout" in problems[0] and "0.1234" in problems[0]


def test_a_missing_output_and_changed_code_are_mismatches(stored):
    ran = copy.deepcopy(stored)
    _first_printing_cell(ran, tagged=False).outputs = []
    assert "stdout" in output_mismatches(ran, stored)[0]
    ran = copy.deepcopy(stored)
    next(c for c in ran.cells if c.cell_type == "code").source += "\nx = 1"
    assert output_mismatches(ran, stored) == ["the code cells differ from the stored notebook's"]


def test_what_nbval_forgives_is_forgiven(stored):
    """A cell tagged nbval-ignore-output, durations (the sanitize file), split streams, and
    execution counts do not count."""
    ran = copy.deepcopy(stored)
    tagged = _first_printing_cell(ran, tagged=True)
    next(o for o in tagged.outputs if o.output_type == "stream").text += "anything\n"
    cell = _first_printing_cell(ran, tagged=False)
    out = next(o for o in cell.outputs if o.output_type == "stream")
    half = len(out.text) // 2
    cell.outputs.insert(cell.outputs.index(out) + 1,
                        nbformat.v4.new_output("stream", name="stdout", text=out.text[half:]))
    out.text = out.text[:half]
    for c in ran.cells:
        if c.cell_type == "code":
            c.execution_count = (c.execution_count or 0) + 100
    assert output_mismatches(ran, stored) == []
    timed = copy.deepcopy(stored)
    cell = _first_printing_cell(timed, tagged=False)
    next(o for o in cell.outputs if o.output_type == "stream").text += "took 1.5 s\n"
    base = copy.deepcopy(stored)
    next(o for o in _first_printing_cell(base, tagged=False).outputs
         if o.output_type == "stream").text += "took 27 ms\n"
    assert output_mismatches(timed, base) == []


def test_a_widget_shown_but_not_saved_is_named():
    """The browser test's save waits until every widget an output shows is in the saved widget
    state: an output whose model is missing would say "model not found" when opened again."""
    nb = nbformat.v4.new_notebook()
    view = {"application/vnd.jupyter.widget-view+json": {"model_id": "a", "version_major": 2,
                                                         "version_minor": 0},
            "text/plain": "[interactive widget]"}
    nb.cells = [nbformat.v4.new_code_cell("w", outputs=[nbformat.v4.new_output(
        "display_data", data=view)])]
    assert unsaved_widgets(nb) == ["a"]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"a": {}}}}
    assert unsaved_widgets(nb) == []
