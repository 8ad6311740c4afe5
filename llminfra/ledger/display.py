"""The ledger's tables as appendix A1 shows them: an HTML table and its plain-text twin.

A :class:`LedgerTable` holds some rows of :func:`~llminfra.ledger.table.ledger_frame` and a
choice of :data:`COLUMNS`. In JupyterLab it is an HTML table at the full width of the page, every
column left-aligned at a set share of the width, the source text's words (Korean) above their
English gloss. Everywhere else (a terminal, nbval's comparison, a text-only front end) it is
the same table in plain text, wrapped to the same proportions, so it is about as many lines
tall as the HTML is: JupyterLab sizes a cell it has not drawn yet from its text, which is how a
link to a heading below such tables lands at the heading.

:func:`chapter_table`, :func:`section_table` and :func:`verdict_table` are the three views A1
uses: the rows a chapter meets, the rows of one section of a text, the rows of one verdict.

Taught in appendix A1.
"""

from __future__ import annotations

import html
import unicodedata

import pandas as pd

from llminfra.ledger.table import ledger_frame, source_sections

#: column name -> (header, share of the width). "the text says" is the text's words (``quote``)
#: over their English gloss (``says``)
COLUMNS = {
    "id": ("id", 8),
    "the text says": ("the text says (its words, then in English)", 27),
    "depends on": ("depends on", 10),
    "verdict": ("verdict", 13),
    "reason": ("why", 23),
    "figure": ("figure computed now", 15),
    "evidence": ("evidence", 12),
    "chapters": ("chapters", 9),
}
#: width of the text version in monospace columns, shared like the HTML's width: about as many
#: characters as a line of the HTML table holds at 1440 px, so both are about as tall
TEXT_COLUMNS = 215
#: text widths of the columns that never wrap ("approximately", "not checkable", "00, 01, 02")
NARROW = {"id": 7, "verdict": 13, "chapters": 10}
#: the views' columns
CHAPTER_COLUMNS = ["id", "the text says", "verdict", "reason", "figure"]
SECTION_COLUMNS = ["id", "the text says", "depends on", "verdict", "reason", "figure",
                   "evidence", "chapters"]
VERDICT_COLUMNS = ["id", "the text says", "reason", "figure"]


def text_width(s: str) -> int:
    """Columns ``s`` takes in a monospace font: East Asian wide characters (Hangul) take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in s)


def wrap(s: str, width: int) -> list[str]:
    """Greedy word wrap of ``s`` to ``width`` columns (by :func:`text_width`); a word longer
    than a line is cut."""
    lines, line = [], ""
    for word in s.split():
        while text_width(word) > width:
            cut = max(i for i in range(1, len(word) + 1) if text_width(word[:i]) <= width)
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:cut])
            word = word[cut:]
        candidate = f"{line} {word}" if line else word
        if text_width(candidate) <= width:
            line = candidate
        else:
            lines.append(line)
            line = word
    return lines + [line] if line else lines or [""]


class LedgerTable:
    """Rows of the ledger (``frame``, from :func:`ledger_frame`) shown with ``columns`` (keys of
    :data:`COLUMNS`); ``_repr_html_`` for JupyterLab, ``repr`` for text."""

    def __init__(self, frame: pd.DataFrame, columns: list[str]):
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:
            raise ValueError(f"unknown columns {unknown}; choose from {list(COLUMNS)}")
        self.frame, self.columns = frame, columns

    def __len__(self) -> int:
        return len(self.frame)

    def _share(self) -> int:
        return sum(COLUMNS[c][1] for c in self.columns)

    def text_widths(self) -> list[int]:
        """Each column's width in the text version (two columns go between them): its share of
        :data:`TEXT_COLUMNS`, no wider than its longest word for the one-word columns."""
        room = TEXT_COLUMNS - 2 * (len(self.columns) - 1)
        return [min(room * COLUMNS[c][1] // self._share(), NARROW.get(c, room))
                for c in self.columns]

    def _cell_html(self, row, column: str) -> str:
        if column == "the text says":
            return (f'<span lang="ko">{html.escape(row["quote"])}</span><br>'
                    f'<i>{html.escape(row["says"])}</i>')
        value = html.escape(str(row[column]))
        return f'<b style="white-space:nowrap">{value}</b>' if column == "id" else value

    def _repr_html_(self) -> str:
        share = self._share()
        cols = "".join(f'<col style="width:{100 * COLUMNS[c][1] / share:.1f}%">'
                       for c in self.columns)
        cell = 'style="text-align:left;vertical-align:top;overflow-wrap:break-word"'
        head = "".join(f"<th {cell}>{html.escape(COLUMNS[c][0])}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td {cell}>{self._cell_html(r, c)}</td>"
                                        for c in self.columns) + "</tr>"
                       for _, r in self.frame.iterrows())
        return (f'<table style="width:100%;table-layout:fixed"><colgroup>{cols}</colgroup>'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def _cell_lines(self, row, column: str, width: int) -> list[str]:
        if column == "the text says":
            return wrap(f'"{row["quote"]}"', width) + wrap(row["says"], width)
        return wrap(str(row[column]), width)

    def __repr__(self) -> str:
        widths = self.text_widths()

        def line(cells: list[str]) -> str:
            return "  ".join(s + " " * (w - text_width(s)) for s, w in zip(cells, widths)).rstrip()

        out = [line([COLUMNS[c][0][:w] for c, w in zip(self.columns, widths)]),
               line(["-" * w for w in widths])]
        for _, r in self.frame.iterrows():
            cells = [self._cell_lines(r, c, w) for c, w in zip(self.columns, widths)]
            for i in range(max(len(c) for c in cells)):
                out.append(line([c[i] if i < len(c) else "" for c in cells]))
            out.append("")
        return "\n".join(out).rstrip("\n")


def chapter_table(chapter: str) -> LedgerTable:
    """The claims chapter ``chapter`` (``"08"``) meets: what the text says, the verdict, why,
    and the figure the package computes."""
    return LedgerTable(ledger_frame(chapter=chapter), CHAPTER_COLUMNS)


def section_table(source: str, number: int) -> LedgerTable:
    """Every claim under heading ``number`` (§, counted over all the text's headings, see
    :func:`~llminfra.ledger.table.source_sections`) of text ``source``, with all its columns."""
    ids = {c.id for n, _, _, claims in source_sections(source) if n == number for c in claims}
    if not ids:
        raise KeyError(f"text {source} has no claims under its heading §{number}")
    frame = ledger_frame()
    return LedgerTable(frame[frame["id"].isin(ids)], SECTION_COLUMNS)


def verdict_table(verdict: str) -> LedgerTable:
    """Every claim with ``verdict``: what the text says, why, and the figure."""
    return LedgerTable(ledger_frame(verdict), VERDICT_COLUMNS)
