"""The claims-ledger filter: choose a verdict and a chapter, see the matching rows.

:func:`ledger_html` renders the rows of :func:`llminfra.ledger.ledger_frame` as an HTML table
(a pure function, tested from Python); :class:`LedgerWidget` wires two dropdowns to it through
``observe`` (an ``HTML`` value and a ``Label`` count; no ``interact``, no printing), so it
behaves the same in JupyterLab, in a test and under nbval.

Taught in appendix A1.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import pandas as pd

from llminfra.widgets.panel import Panel
from llminfra.ledger import VERDICTS, all_claims, ledger_frame

ALL = "all"
#: columns shown in the filtered table
SHOWN = ["id", "says", "verdict", "figure", "reason"]
#: a table cell's CSS; the id's cell never wraps
CELL_STYLE = "text-align:left"
ID_STYLE = "text-align:left; white-space:nowrap"


def chapters() -> list[str]:
    """Every chapter some claim comes up in, sorted."""
    return sorted({ch for c in all_claims() for ch in c.chapters})


def _frame(verdict: str, chapter: str) -> pd.DataFrame:
    return ledger_frame(None if verdict == ALL else verdict, None if chapter == ALL else chapter)


def nothing_matched(verdict: str, chapter: str) -> str:
    """The line shown in place of an empty table: which filter matched nothing, what to do."""
    which = " and ".join(part for part in (
        f"verdict '{verdict}'" if verdict != ALL else "",
        f"chapter {chapter}" if chapter != ALL else "") if part) or "this filter"
    return f"No claim matches {which}: choose another verdict or chapter."


def ledger_html(frame: pd.DataFrame, empty: str = "No claim matches this filter.") -> str:
    """The rows of ``frame`` (columns :data:`SHOWN`) as an HTML table, each id an anchor
    ``#claim-<id>`` that chapters link to; an id never wraps (``000-11``, not ``000-`` over
    ``11``: the narrow id column broke at its hyphen). No rows: the line ``empty`` instead of
    a table that is only its header."""
    if frame.empty:
        return f"<p class='llminfra-ledger-empty'><i>{html.escape(empty, quote=False)}</i></p>"
    rows = []
    for _, r in frame.iterrows():
        cells = [f'<a id="claim-{r["id"]}"></a><b>{html.escape(r["id"])}</b>'] + [
            html.escape(str(r[k])) for k in SHOWN[1:]]
        styles = [ID_STYLE] + [CELL_STYLE] * (len(cells) - 1)
        rows.append("<tr>" + "".join(f"<td style='{st}'>{c}</td>"
                                     for st, c in zip(styles, cells)) + "</tr>")
    head = "".join(f"<th style='text-align:left'>{h}</th>" for h in SHOWN)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


class LedgerWidget:
    """Two dropdowns (verdict, chapter) over the ledger; ``count`` says how many rows match,
    ``table`` shows them, ``widget`` is the ``VBox`` to display.

    ``w = LedgerWidget(); w.verdict.value = "wrong"; w.count.value`` → ``"6 of 99 claims"``
    (the numbers are the ledger's).
    """

    def __init__(self, verdict: str = ALL, chapter: str = ALL):
        self.verdict = widgets.Dropdown(options=[ALL, *VERDICTS], value=verdict,
                                        description="verdict")
        self.chapter = widgets.Dropdown(options=[ALL, *chapters()], value=chapter,
                                        description="chapter")
        self.count = widgets.Label()
        self.table = widgets.HTML()
        self.total = len(all_claims())
        for w in (self.verdict, self.chapter):
            w.observe(self._update, names="value")
        self._update()
        self.widget = Panel([widgets.HBox([self.verdict, self.chapter]), self.count,
                             self.table], title="Claims ledger",
                            how="filter the source texts' claims by verdict and by chapter")

    def _update(self, _change=None) -> None:
        frame = _frame(self.verdict.value, self.chapter.value)
        self.count.value = f"{len(frame)} of {self.total} claims"
        self.table.value = ledger_html(frame, nothing_matched(self.verdict.value,
                                                              self.chapter.value))
