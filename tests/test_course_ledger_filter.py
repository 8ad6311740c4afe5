"""Appendix A1's filter: a claim id is one unbroken word in its cell ("000-11", which the
narrow id column wrapped as "000-" over "11"; issue 42, the learner's path)."""

import re

from llminfra.widgets.ledger import LedgerWidget, ledger_html, _frame, ALL


def test_every_id_cell_never_wraps_and_the_others_may():
    text = ledger_html(_frame(ALL, ALL))
    rows = re.findall(r"<tr>(.*?)</tr>", text)[1:]
    assert len(rows) >= 50
    for row in rows:
        cells = re.findall(r"<td style='([^']*)'>", row)
        assert "white-space:nowrap" in cells[0], row[:120]
        assert all("nowrap" not in style for style in cells[1:]), row[:200]   # prose wraps


def test_the_widget_shows_the_same_table():
    w = LedgerWidget()
    w.verdict.value = "wrong"
    assert w.table.value == ledger_html(_frame("wrong", ALL))
    assert "white-space:nowrap" in w.table.value
