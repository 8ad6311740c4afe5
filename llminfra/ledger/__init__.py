"""The claims ledger: every checkable statement of the course's two source texts, recomputed
with the package or settled by a primary source, with a verdict.

``all_claims()`` lists them in source order; ``evaluate(claim)`` runs its computation;
``ledger_frame()`` is the whole ledger as a pandas DataFrame; ``verdict_counts()`` counts the
verdicts. Each claim quotes the text's own words under its heading
(:mod:`llminfra.ledger.quotes`); :mod:`llminfra.ledger.display` draws the tables appendix A1
shows. Taught in appendix A1 (``notebooks/A1_claims_ledger.ipynb``).
"""

from llminfra.ledger.claim import SOURCES, VERDICTS, Claim, Finding, ratio_verdict, rel_error
from llminfra.ledger.table import all_claims, evaluate, get_claim, ledger_frame, verdict_counts

__all__ = ["SOURCES", "VERDICTS", "Claim", "Finding", "all_claims", "evaluate", "get_claim",
           "ledger_frame", "ratio_verdict", "rel_error", "verdict_counts"]
