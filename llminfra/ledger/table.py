"""The ledger as data: all claims, their evaluation, a DataFrame, the texts' sections and the
verdict counts.

Taught in appendix A1.
"""

from __future__ import annotations

from functools import lru_cache

import pandas as pd

from llminfra.ledger.claim import VERDICTS, Claim, Finding
from llminfra.ledger.claims_000 import CLAIMS as CLAIMS_000
from llminfra.ledger.claims_004 import CLAIMS as CLAIMS_004
from llminfra.ledger.quotes import headings, quote

#: ``section`` is the course's English for the text's heading, ``section (text)`` the heading
#: itself; ``quote`` is the text's own words (Korean) and ``says`` their English gloss
COLUMNS = ["id", "source", "section", "section (text)", "quote", "says", "depends on", "verdict",
           "reason", "computed", "figure", "evidence", "chapters"]


def all_claims() -> list[Claim]:
    """Every claim of both texts, in source order (000 then 004)."""
    claims = CLAIMS_000 + CLAIMS_004
    ids = [c.id for c in claims]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise RuntimeError(f"duplicate claim ids: {sorted(dup)}")
    return claims


def get_claim(claim_id: str) -> Claim:
    """The claim with id ``claim_id`` (e.g. ``"000-08"``); ``KeyError`` if there is none."""
    for c in all_claims():
        if c.id == claim_id:
            return c
    raise KeyError(f"no claim {claim_id!r}; ids run {all_claims()[0].id} … {all_claims()[-1].id}")


def evaluate(claim: Claim) -> Finding | None:
    """Run the claim's computation; ``None`` for a claim a primary source settles. The checks
    are pure functions of the package, so each runs once per process."""
    return None if claim.check is None else _finding(claim.id)


@lru_cache(maxsize=None)
def _finding(claim_id: str) -> Finding:
    return get_claim(claim_id).check()


def ledger_frame(verdict: str | None = None, chapter: str | None = None) -> pd.DataFrame:
    """The ledger as a DataFrame (one row per claim, :data:`COLUMNS`), optionally filtered by
    ``verdict`` (one of :data:`~llminfra.ledger.claim.VERDICTS`) and ``chapter`` (``"02"``…).

    ``figure`` is what the package computes now; a computed row whose figure no longer supports
    its verdict raises ``RuntimeError`` (the ledger never shows a stale verdict).
    """
    if verdict is not None and verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
    rows = []
    for c in all_claims():
        if verdict is not None and c.verdict != verdict:
            continue
        if chapter is not None and chapter not in c.chapters:
            continue
        f = evaluate(c)
        if f is not None and not f.supports:
            raise RuntimeError(f"claim {c.id}: the package now computes '{f.figure}', which no "
                               f"longer supports the verdict '{c.verdict}'")
        q = quote(c.id)
        rows.append({"id": c.id, "source": c.source, "section": c.section,
                     "section (text)": q.section, "quote": q.text, "says": c.says,
                     "depends on": c.depends_on, "verdict": c.verdict, "reason": c.reason,
                     "computed": f is not None, "figure": "" if f is None else f.figure,
                     "evidence": c.evidence, "chapters": ", ".join(c.chapters)})
    return pd.DataFrame(rows, columns=COLUMNS)


def source_sections(source: str) -> list[tuple[int, str, str, list[Claim]]]:
    """The sections of text ``source`` that hold claims, in the text's order: ``(number,
    heading in Korean, heading in English, claims)``, numbered over all the text's headings
    from 1 (so "§9" of text 004 is its ninth heading, whether or not §8 holds a claim)."""
    claims = [c for c in all_claims() if c.source == source]
    out = []
    for n, (ko, en) in enumerate(headings(source), start=1):
        under = [c for c in claims if quote(c.id).section == ko]
        if under:
            out.append((n, ko, en, under))
    return out


def verdict_counts(claims: list[Claim] | None = None) -> dict[str, int]:
    """How many claims carry each verdict, in :data:`VERDICTS` order."""
    claims = all_claims() if claims is None else claims
    return {v: sum(c.verdict == v for c in claims) for v in VERDICTS}
