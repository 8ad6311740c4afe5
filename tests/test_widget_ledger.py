"""Appendix A1's filter when nothing matches: a line saying so, not a table that is only its
header (issue 53, the learner's path)."""

from llminfra.ledger import VERDICTS
from llminfra.widgets.ledger import ALL, LedgerWidget, _frame, chapters, ledger_html


def _an_empty_filter() -> tuple[str, str]:
    """A verdict and a chapter with no claim between them, found from the ledger itself."""
    return next((v, c) for v in VERDICTS for c in chapters() if _frame(v, c).empty)


def test_an_empty_filter_says_nothing_matched():
    verdict, chapter = _an_empty_filter()
    w = LedgerWidget(verdict=verdict, chapter=chapter)
    assert w.count.value.startswith("0 of ")
    assert "<table" not in w.table.value and "<th" not in w.table.value
    assert f"No claim matches verdict '{verdict}' and chapter {chapter}" in w.table.value
    w.chapter.value = ALL                     # widening the filter brings the table back
    assert "<table" in w.table.value and "No claim matches" not in w.table.value


def test_a_filter_with_rows_shows_no_empty_line():
    text = ledger_html(_frame("wrong", ALL))
    assert "<table" in text and "No claim matches" not in text
