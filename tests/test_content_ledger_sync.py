"""The claims ledger quotes chapters' printed figures in its reasons; these keep the two in step.

Chapter 09 computes the own-vs-rent figures from its dated example prices and prints them; the
ledger's reasons for 000-49 and 004-52 repeat them in words. When a price or the cost model
changes, chapter 09's stored output moves and the ledger must follow (issue 42: A1 said "about
45 %" while chapter 09 printed 57.4 %). Chapter 04's pool figures and 000-22/23's check are
the same simulation (one pool, one trace).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llminfra.ledger import get_claim

ROOT = Path(__file__).resolve().parents[1]


def printed(notebook: str) -> str:
    """Everything ``notebook`` printed or displayed, as one text (HTML included)."""
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            data = out.get("data", {})
            parts.append("".join(data.get("text/plain", "")) + "".join(data.get("text/html", "")))
    return "\n".join(parts)


def one(pattern: str, text: str) -> str:
    found = set(re.findall(pattern, text))
    assert len(found) == 1, f"expected one value for {pattern!r} in the stored output, got {found}"
    return found.pop()


@pytest.fixture(scope="module")
def ch09() -> str:
    return printed("09_deployment_and_cost.ipynb")


def test_004_52_quotes_chapter_09s_break_even_share(ch09):
    """004-52's reason names the share of hours above which owning beats renting, at both
    purchase prices, as chapter 09 prints them."""
    m = re.search(r"only above ([\d.]+) % of all hours in use \(([\d.]+) % at the low price\)",
                  ch09)
    assert m, "chapter 09 no longer prints its break-even share of hours"
    reason = get_claim("004-52").reason
    assert f"{m.group(1)} % of the hours" in reason, (m.group(1), reason)
    assert f"{m.group(2)} % at the" in reason, (m.group(2), reason)


def test_000_49_quotes_chapter_09s_pay_back_months(ch09):
    """000-49's reason gives the pay-back months chapter 09 prints, rounded to whole months:
    at full use (both prices) and at 25 % use."""
    full = float(one(r"pays back after ([\d.]+) months of full-time use", ch09))
    low = float(one(r"pay-back after ([\d.]+) months", ch09))
    quarter = one(r"at 25 % use the purchase needs ([\d.,]+) months", ch09)
    reason = get_claim("000-49").reason
    assert f"about {round(full)} months at full use" in reason, (full, reason)
    assert f"about {quarter} months at 25 % use" in reason, (quarter, reason)
    assert f"({round(low)} and" in reason, (low, reason)


def test_000_22_23_use_chapter_04s_pool():
    """The ledger's check of 000-22/23 prints the token shares chapter 04 prints."""
    ch04 = printed("04_kv_cache_and_paged_attention.ipynb")
    cont = one(r"contiguous: measured ([\d.]+)% \(max\)", ch04)
    paged = one(r"paged, B = 16: measured ([\d.]+)%", ch04)
    for cid in ("000-22", "000-23"):
        figure = get_claim(cid).check().figure
        assert f"{cont}% holds tokens" in figure and f"(block 16) {paged}%" in figure, figure
