"""Every verdict a chapter gives for a claim of the ledger equals the ledger's (issue 24:
"chapter and A1 verdict labels agree for every flagged claim").

A chapter flags a claim by naming its id (``004-26``) beside a verdict label (one of
:data:`~llminfra.ledger.claim.VERDICTS`). :func:`labelled_claims` reads the pairs from a
chapter's markdown and from the tables and text its cells print, in these forms:

- ``004-26 (misleading)`` — the id, then the label in parentheses (the closing note's list);
- ``*Misleading* (appendix A1, claim 004-26)`` — an emphasised label, then parentheses naming
  the id;
- ``**Verdict (000, the example; appendix A1, claim 000-34): holds.**`` — "Verdict", parentheses
  naming the id, then the label;
- ``**"GPUs use 40 % of the power" (appendix A1, claim 004-38): not checkable**`` — parentheses
  naming the id, a colon, then the label;
- a printed table row (HTML or text) holding exactly one id and a cell (or, in text, a word after
  the id) that starts with a label.

A label anywhere else (``it holds for inference``) is prose, not a flag. So that the test cannot
pass by finding nothing, each chapter's closing note must list all of the chapter's claims, and
the chapters named in :data:`MIN_FLAGS` must flag at least that many claims in their own prose.
"""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path

import pytest

from llminfra.course.ledger_links import TAG, chapter_notebooks
from llminfra.ledger import VERDICTS, all_claims, get_claim

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CHAPTERS = chapter_notebooks(NOTEBOOKS)

ID = r"\b(?:000|004)-\d{2}\b"
#: a verdict label; "not checkable" may break across a line
LABEL = "|".join(v.replace(" ", r"\s+") for v in sorted(VERDICTS, key=len, reverse=True))
_ID_THEN_LABEL = re.compile(rf"({ID})\s*\(\s*({LABEL})\b", re.I)
_EMPHASIS_THEN_ID = re.compile(
    rf"(?<![\w*])\*{{1,2}}\s*({LABEL})\b[^*\n]{{0,80}}?\*{{1,2}}[\s,]*\(([^()]*?{ID}[^()]*)\)", re.I)
_VERDICT_PAREN = re.compile(
    rf"\bVerdicts?\s*\(([^()]*?{ID}[^()]*)\)[\s*]*[:.]?[\s*]*({LABEL})\b", re.I)
_PAREN_COLON = re.compile(rf"\(([^()]*?{ID}[^()]*)\)\s*:[\s*]*({LABEL})\b", re.I)
_TAGS = re.compile(r"<[^>]+>")

#: chapters whose own prose (not the closing note) flags at least this many claims
MIN_FLAGS = {"01": 1, "02": 6, "07": 1, "08": 1, "09": 9, "11": 2}


def _ids_in(text: str) -> list[str]:
    return re.findall(ID, text)


def _one_id(text: str) -> str | None:
    ids = set(_ids_in(text))
    return ids.pop() if len(ids) == 1 else None


def markdown_flags(text: str) -> list[tuple[str, str]]:
    """``(claim id, label)`` pairs flagged in markdown ``text``, in the forms of the module
    docstring; a parenthesis naming several ids flags none of them (it is ambiguous)."""
    found = {}
    for m in _ID_THEN_LABEL.finditer(text):
        found[m.start(2)] = (m.group(1), m.group(2))
    for pattern, label_group, id_group in ((_EMPHASIS_THEN_ID, 1, 2), (_VERDICT_PAREN, 2, 1),
                                           (_PAREN_COLON, 2, 1)):
        for m in pattern.finditer(text):
            claim = _one_id(m.group(id_group))
            if claim is not None:
                found[m.start(label_group)] = (claim, m.group(label_group))
    return [(claim, _normal(label)) for _, (claim, label) in sorted(found.items())]


def _normal(label: str) -> str:
    return " ".join(label.lower().split())


def _leading_label(cell: str) -> str | None:
    m = re.match(rf"\s*({LABEL})\b", cell, re.I)
    return _normal(m.group(1)) if m else None


def html_flags(text: str) -> list[tuple[str, str]]:
    """Pairs in an HTML table: each row with exactly one id and one cell starting with a label."""
    out = []
    for row in re.findall(r"<tr\b.*?</tr>", text, re.S | re.I):
        cells = [html_lib.unescape(_TAGS.sub("", c))
                 for c in re.findall(r"<t[dh]\b[^>]*>(.*?)</t[dh]>", row, re.S | re.I)]
        claim = _one_id(" ".join(cells))
        labels = [lab for lab in map(_leading_label, cells) if lab]
        if claim is not None and len(labels) == 1:
            out.append((claim, labels[0]))
    return out


def text_flags(text: str) -> list[tuple[str, str]]:
    """Pairs in printed text: each line with exactly one id and a label word after it."""
    out = []
    for line in text.splitlines():
        claim = _one_id(line)
        if claim is None:
            continue
        m = re.search(rf"({LABEL})\b", line[line.index(claim) + len(claim):], re.I)
        if m:
            out.append((claim, _normal(m.group(1))))
    return out


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def labelled_claims(path: Path) -> dict[str, list[tuple[str, str]]]:
    """The flags of one notebook: ``{"note": closing note's, "prose": other markdown's,
    "printed": its outputs'}``."""
    flags = {"note": [], "prose": [], "printed": []}
    for cell in json.loads(path.read_text())["cells"]:
        source = _text(cell["source"])
        if cell["cell_type"] == "markdown":
            key = "note" if TAG in cell.get("metadata", {}).get("tags", []) else "prose"
            flags[key] += markdown_flags(source)
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/html" in data:
                flags["printed"] += html_flags(_text(data["text/html"]))
            else:
                flags["printed"] += text_flags(_text(out.get("text")) + _text(data.get("text/plain")))
    return flags


# --- the reader, on the forms it promises -------------------------------------------------

def test_markdown_forms():
    text = ("- **\"MI300X: up to 60 % faster\"**: bandwidth supports it. *Misleading* (as in\n"
            "  appendix A1, claim 004-26): it holds for memory-bound inference only.\n"
            "**Verdict (000, the volume example; appendix A1, claim 000-34): holds.** Exactly.\n"
            "**Verdict (appendix A1, claim 004-03).** *Misleading.* 16 bytes per parameter.\n"
            "**\"GPUs use 40 %\" (appendix A1, claim 004-38): not\n  checkable as stated.**\n"
            "Closing note: 004-28 (wrong), 000-43 (holds).")
    assert markdown_flags(text) == [("004-26", "misleading"), ("000-34", "holds"),
                                    ("004-03", "misleading"), ("004-38", "not checkable"),
                                    ("004-28", "wrong"), ("000-43", "holds")]


def test_prose_labels_are_not_flags():
    """A verdict word in a sentence, an id without a label, a parenthesis with two ids: none."""
    assert markdown_flags("It holds for inference (claim 004-26); 004-07 is discussed below.") == []
    assert markdown_flags("**Verdict (claims 000-11 and 000-15): misleading.**") == []
    assert markdown_flags("*Holds* for prefill, as section 6 says.") == []


def test_printed_forms():
    table = ("<table><tr><th>claim</th><th>verdict</th></tr>"
             "<tr><td>004-28</td><td>wrong: 1.555 is the 40 GB card</td></tr>"
             "<tr><td>004-29, 004-31</td><td>misleading</td></tr>"
             "<tr><td>000-08</td><td>Approximately (1.5 % high)</td></tr></table>")
    assert html_flags(table) == [("004-28", "wrong"), ("000-08", "approximately")]
    assert text_flags("004-28  A100 80GB 1.555 TB/s   wrong\nno id here  holds\n") == [
        ("004-28", "wrong")]


# --- the chapters ------------------------------------------------------------------------

@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_chapter_labels_equal_the_ledger(chapter):
    flags = labelled_claims(CHAPTERS[chapter])
    pairs = flags["note"] + flags["prose"] + flags["printed"]
    unknown = sorted({c for c, _ in pairs} - {c.id for c in all_claims()})
    assert not unknown, f"chapter {chapter} names claims the ledger does not have: {unknown}"
    wrong = [f"{c}: chapter says {label!r}, appendix A1 says {get_claim(c).verdict!r}"
             for c, label in pairs if label != get_claim(c).verdict]
    assert not wrong, f"chapter {chapter} disagrees with the ledger:\n" + "\n".join(wrong)


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_the_labels_are_really_found(chapter):
    """The closing note lists every claim the ledger places in the chapter, each with a label
    the reader finds; the chapters of :data:`MIN_FLAGS` flag claims in their own prose too."""
    flags = labelled_claims(CHAPTERS[chapter])
    expected = {c.id for c in all_claims() if chapter in c.chapters}
    assert {c for c, _ in flags["note"]} == expected
    prose = {c for c, _ in flags["prose"] + flags["printed"]}
    assert len(prose) >= MIN_FLAGS.get(chapter, 0), (
        f"chapter {chapter} flags {sorted(prose)} in its prose, fewer than "
        f"{MIN_FLAGS[chapter]}: has the wording of its verdicts changed?")
