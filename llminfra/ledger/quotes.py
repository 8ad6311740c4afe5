"""The source texts' own words for each claim: a short quote and the section it stands under.

A :class:`Quote` is a claim's sentence (or the part of it that states the figure) exactly as the
source text writes it, in Korean, with ``" … "`` (:data:`ELLIPSIS`) where words are left out,
and the heading of the section it stands under: the nearest heading above it, in Korean and in
the course's English translation. The claim's ``says`` is the English gloss of the quote.

The quotes live in the package's data (``llminfra/data/ledger_quotes.json``), so a clone of the
course without the texts still shows them; ``tests/test_ledger.py`` checks each against the
text, under its heading, wherever the texts are present.

Taught in appendix A1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files

#: how a quote marks words left out
ELLIPSIS = " … "


@dataclass(frozen=True)
class Quote:
    """A claim in the text's words: ``text`` (Korean, verbatim but for :data:`ELLIPSIS`) under
    the heading ``section`` (Korean), which the course translates as ``section_en``."""

    text: str
    section: str
    section_en: str

    @property
    def parts(self) -> list[str]:
        """The verbatim pieces of ``text``, in order (one unless words were left out)."""
        return self.text.split(ELLIPSIS)


@lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads(files("llminfra").joinpath("data/ledger_quotes.json").read_text("utf-8"))


def headings(source: str) -> list[tuple[str, str]]:
    """The section headings of text ``source`` (``"000"`` or ``"004"``) in order, each as
    ``(Korean, English)``."""
    return [(h["ko"], h["en"]) for h in _data()["sources"][source]["headings"]]


def source_title(source: str) -> str:
    """The text's own title (Korean), its first line."""
    return _data()["sources"][source]["title"]


def translate_heading(source: str, heading: str) -> str:
    """The course's English for one of ``source``'s headings; ``KeyError`` if it has none."""
    for ko, en in headings(source):
        if ko == heading:
            return en
    raise KeyError(f"source {source} has no heading {heading!r}")


def quote(claim_id: str) -> Quote:
    """The quote and section of claim ``claim_id`` (e.g. ``"004-28"``); ``KeyError`` if the
    data has none."""
    try:
        entry = _data()["claims"][claim_id]
    except KeyError:
        raise KeyError(f"no quote for claim {claim_id!r} in ledger_quotes.json") from None
    source = claim_id.split("-")[0]
    return Quote(entry["quote"], entry["section"], translate_heading(source, entry["section"]))


def quoted_ids() -> list[str]:
    """Every claim id the data quotes."""
    return list(_data()["claims"])
