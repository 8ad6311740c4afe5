"""One checkable statement of a source text, its evidence and its verdict.

A :class:`Claim` records where a statement is (source text and section), what it says (in the
course's own words; the text's own words are in :mod:`llminfra.ledger.quotes`), what it depends on, and a verdict with a one- or two-sentence reason. A
claim is settled either by a computation with the package (``check``) or by a primary source
named in ``evidence`` where nothing can be computed. ``check()`` returns a :class:`Finding`: the
figure the package computes and whether that figure still supports the recorded verdict, so a
test fails the day the package's numbers change under a verdict.

Verdicts (:data:`VERDICTS`): ``holds``; ``approximately`` (say how far); ``misleading`` (say what
it leaves out); ``wrong`` (give the right figure); ``not checkable`` (say why).

Taught in appendix A1 (``notebooks/A1_claims_ledger.ipynb``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

VERDICTS = ("holds", "approximately", "misleading", "wrong", "not checkable")

#: source id -> the text's file among the course's source texts (not in a learner's clone; the
#: tests read it when present) and its title in English
SOURCES = {
    "000": ("000_e1d4657a95998448.txt",
            "LLM infrastructure basics: GPU memory, serving and cost at a glance"),
    "004": ("004_e6789b9c79022570.txt",
            "GPU optimization strategies for LLM deployment: beyond the VRAM limit"),
}


@dataclass(frozen=True)
class Finding:
    """What the package computes for a claim (``figure``, formatted for people) and whether it
    supports the recorded verdict (``supports``)."""

    figure: str
    supports: bool


@dataclass(frozen=True)
class Claim:
    """One row of the ledger. ``id`` is ``"<source>-<nn>"``; ``chapters`` lists the course
    chapters (``"02"``, ``"08"``, …) where the figure comes up."""

    id: str
    section: str
    says: str
    depends_on: str
    verdict: str
    reason: str
    chapters: tuple[str, ...]
    evidence: str
    check: Callable[[], Finding] | None = None

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"claim {self.id}: verdict {self.verdict!r} not one of {VERDICTS}")
        if self.source not in SOURCES:
            raise ValueError(f"claim {self.id}: id must start with one of {sorted(SOURCES)}")
        if not self.reason.strip() or not self.evidence.strip():
            raise ValueError(f"claim {self.id}: reason and evidence must not be empty")

    @property
    def source(self) -> str:
        """The source id (``"000"`` or ``"004"``)."""
        return self.id.split("-")[0]

    @property
    def computed(self) -> bool:
        """True when the package recomputes the figure (else a primary source settles it)."""
        return self.check is not None


def ratio_verdict(stated: float, computed: float, exact_rel: float = 0.005,
                  approx_rel: float = 0.10) -> str:
    """Verdict for a stated number against the computed one, by relative error
    e = |stated − computed| / |computed|: ``holds`` if e ≤ ``exact_rel`` (0.5 %),
    ``approximately`` if e ≤ ``approx_rel`` (10 %), else ``wrong``.

    Worked example: "140 GB" for Llama-2-70B in bf16, computed 137.95 GB: e = 1.5 % →
    approximately.
    """
    if computed == 0:
        raise ValueError("computed value is 0; a relative error is undefined")
    e = abs(stated - computed) / abs(computed)
    if e <= exact_rel:
        return "holds"
    return "approximately" if e <= approx_rel else "wrong"


def rel_error(stated: float, computed: float) -> float:
    """(stated − computed) / computed, signed: +0.015 means the text is 1.5 % high."""
    return (stated - computed) / computed
