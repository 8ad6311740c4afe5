"""The claims ledger: every computed verdict still follows from the package's numbers, every
claim is well formed, and the filter widget shows what it says."""

import pytest

from llminfra.ledger import (SOURCES, VERDICTS, Claim, Finding, all_claims, evaluate, get_claim,
                             ledger_frame, ratio_verdict, rel_error, verdict_counts)
from llminfra.widgets.ledger import ALL, LedgerWidget, chapters, ledger_html

CLAIMS = all_claims()
COMPUTED = [c for c in CLAIMS if c.computed]


@pytest.mark.parametrize("claim", COMPUTED, ids=[c.id for c in COMPUTED])
def test_computed_verdict_still_holds(claim):
    """If the package's numbers move so that a verdict no longer follows, this fails."""
    f = evaluate(claim)
    assert isinstance(f, Finding) and f.figure
    assert f.supports, f"{claim.id} ({claim.verdict}): the package now computes {f.figure!r}"


def test_ledger_is_well_formed():
    ids = [c.id for c in CLAIMS]
    assert len(ids) == len(set(ids)) and len(CLAIMS) >= 90
    for c in CLAIMS:
        assert c.source in SOURCES and c.verdict in VERDICTS and c.chapters
        assert all(len(ch) == 2 for ch in c.chapters), c.id
    assert {c.source for c in CLAIMS} == set(SOURCES)
    counts = verdict_counts()
    assert sum(counts.values()) == len(CLAIMS) and all(counts[v] > 0 for v in VERDICTS)


def test_ratio_verdict_worked_examples():
    """140 GB stated vs 137.95 GB computed: +1.5 % → approximately; 1.555 vs 2.039: −24 % → wrong;
    3.35 vs 3.35 → holds."""
    assert ratio_verdict(140e9, 137.95e9) == "approximately"
    assert ratio_verdict(1.555, 2.039) == "wrong"
    assert ratio_verdict(3.35, 3.35) == "holds"
    assert rel_error(140, 137.95) == pytest.approx(0.01486, abs=1e-4)
    with pytest.raises(ValueError, match="computed value is 0"):
        ratio_verdict(1, 0)


def test_claim_validation_names_the_bad_value():
    with pytest.raises(ValueError, match="verdict 'true'"):
        Claim("000-99", "s", "x", "y", "true", "r", ("01",), "e")
    with pytest.raises(ValueError, match="id must start with"):
        Claim("123-01", "s", "x", "y", "holds", "r", ("01",), "e")
    with pytest.raises(KeyError, match="no claim '000-999'"):
        get_claim("000-999")


def test_known_rows():
    """A few rows checked by hand against the source texts."""
    assert get_claim("004-28").verdict == "wrong"           # A100 80GB is 2.039 TB/s, not 1.555
    assert get_claim("004-04").verdict == "wrong"           # KV grows linearly, not exponentially
    assert get_claim("000-11").verdict == "misleading"      # 31 GB = 28.9 GiB
    assert "1.555" in evaluate(get_claim("004-28")).figure


def test_frame_filters():
    wrong = ledger_frame("wrong")
    assert set(wrong["verdict"]) == {"wrong"} and len(wrong) == verdict_counts()["wrong"]
    ch08 = ledger_frame(chapter="08")
    assert len(ch08) == sum("08" in c.chapters for c in CLAIMS)
    with pytest.raises(ValueError, match="verdict 'bogus'"):
        ledger_frame("bogus")


def test_widget_filters_and_counts():
    w = LedgerWidget()
    assert w.count.value == f"{len(CLAIMS)} of {len(CLAIMS)} claims"
    w.verdict.value = "wrong"
    n = verdict_counts()["wrong"]
    assert w.count.value == f"{n} of {len(CLAIMS)} claims"
    assert w.table.value.count("<tr>") == n + 1          # header + rows
    w.chapter.value = "08"
    expected = sum(c.verdict == "wrong" and "08" in c.chapters for c in CLAIMS)
    assert w.count.value == f"{expected} of {len(CLAIMS)} claims"
    w.verdict.value = ALL
    assert "08" in chapters() and 'id="claim-004-28"' in w.table.value


def test_html_escapes():
    import pandas as pd
    frame = pd.DataFrame([{"id": "000-01", "says": "<b>x</b>", "verdict": "holds",
                           "figure": "1 < 2", "reason": "r"}])
    out = ledger_html(frame)
    assert "&lt;b&gt;x&lt;/b&gt;" in out and "1 &lt; 2" in out


def test_chapters_and_ledger_link_both_ways():
    """Every chapter the ledger names ends with its links cell (in sync), and the ledger has a
    'Chapter NN' section linking back to that chapter's notebook."""
    import json
    from pathlib import Path
    from llminfra.course import ledger_links
    root = Path(__file__).resolve().parents[1] / "notebooks"
    assert ledger_links.main(["--check", "--folder", str(root)]) == 0
    chapters = ledger_links.chapter_notebooks(root)
    a1 = json.loads((root / ledger_links.LEDGER).read_text())
    text = "\n".join("".join(c["source"]) for c in a1["cells"] if c["cell_type"] == "markdown")
    named = {ch for c in CLAIMS for ch in c.chapters}
    assert named <= set(chapters), f"claims name chapters without a notebook: {named - set(chapters)}"
    for ch in named:
        assert f"### Chapter {ch}" in text and f"]({chapters[ch].name})" in text
        assert "A1_claims_ledger.ipynb#Chapter-" + ch in ledger_links.links_markdown(ch)


def test_links_check_fails_on_a_stale_cell(tmp_path):
    import shutil
    from pathlib import Path
    import nbformat
    from llminfra.course import ledger_links
    src = Path(__file__).resolve().parents[1] / "notebooks" / "02_gpu_memory.ipynb"
    shutil.copy(src, tmp_path / src.name)
    nb = nbformat.read(tmp_path / src.name, as_version=4)
    nb.cells[-1].source = "stale"
    nbformat.write(nb, tmp_path / src.name)
    assert ledger_links.main(["--check", "--folder", str(tmp_path)]) == 1
    assert ledger_links.main(["--apply", "--folder", str(tmp_path)]) == 0
    assert ledger_links.main(["--check", "--folder", str(tmp_path)]) == 0
