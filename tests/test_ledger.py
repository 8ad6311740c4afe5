"""The claims ledger: every computed verdict still follows from the package's numbers, every
claim is well formed, and the filter widget shows what it says."""

from pathlib import Path

import pytest

from llminfra.ledger import (SOURCES, VERDICTS, Claim, Finding, all_claims, evaluate, get_claim,
                             ledger_frame, ratio_verdict, rel_error, verdict_counts)
from llminfra.widgets.ledger import ALL, LedgerWidget, chapters, ledger_html

CLAIMS = all_claims()
COMPUTED = [c for c in CLAIMS if c.computed]
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


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


def _a1_cells():
    import json
    from llminfra.course import ledger_links
    return json.loads((NOTEBOOKS / ledger_links.LEDGER).read_text())["cells"]


def test_chapters_and_ledger_link_both_ways():
    """Every chapter the ledger names ends with its links cell (in sync), and the ledger has a
    'Chapter NN' section, in the cell the chapter's link names, linking back to the chapter's
    notebook and showing the chapter's table."""
    from llminfra.course import ledger_links
    assert ledger_links.main(["--check", "--folder", str(NOTEBOOKS)]) == 0
    chapters = ledger_links.chapter_notebooks(NOTEBOOKS)
    cells = _a1_cells()
    by_id = {c["id"]: i for i, c in enumerate(cells)}
    named = {ch for c in CLAIMS for ch in c.chapters}
    assert named <= set(chapters), f"claims name chapters without a notebook: {named - set(chapters)}"
    for ch in named:
        assert ledger_links.link(ch) in ledger_links.links_markdown(ch)
        i = by_id[ledger_links.anchor(ch)]
        source = "".join(cells[i]["source"])
        assert cells[i]["cell_type"] == "markdown" and source.startswith(f"### Chapter {ch}\n")
        assert f"]({chapters[ch].name})" in source
        assert "".join(cells[i + 1]["source"]) == f'chapter_table("{ch}")'


def test_every_link_to_the_ledger_lands_on_an_anchor_of_its_stored_notebook():
    """Each link to A1 from a notebook, the docs or the README names an anchor A1 has: a cell id
    (``#cell-id=…``, what the chapters use), or a heading's id as JupyterLab builds it (its text,
    spaces as '-': ``#Chapter-08``), or an ``<a id=…>``. The chapters' links are counted, so the
    test cannot pass by finding none."""
    import json
    import re
    from llminfra.course import ledger_links
    cells = _a1_cells()
    anchors = {f"cell-id={c['id']}" for c in cells}
    for c in cells:
        if c["cell_type"] != "markdown":
            continue
        source = "".join(c["source"])
        for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", source, re.M):
            text = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", heading)
            text = re.sub(r"[*_`]", "", text)
            anchors |= {text.replace(" ", "-"), "heading=" + text.replace(" ", "-")}
        anchors |= set(re.findall(r'<a\s+(?:id|name)="([^"]+)"', source))
    root = NOTEBOOKS.parent
    files = [*root.glob("notebooks/*.ipynb"), *root.glob("docs/*.md"), root / "README.md"]
    links = []
    for path in files:
        if path.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                             if c["cell_type"] == "markdown")
        else:
            text = path.read_text()
        links += [(path.name, m) for m in re.findall(re.escape(ledger_links.LEDGER) + r"#([^)\s]+)", text)]
    missing = [(name, fragment) for name, fragment in links if fragment not in anchors]
    assert not missing, f"links to anchors A1 does not have: {missing}"
    from_chapters = {name for name, _ in links if name[:2].isdigit()}
    assert from_chapters >= {p.name for ch, p in ledger_links.chapter_notebooks(NOTEBOOKS).items()
                             if ledger_links.links_markdown(ch)}


def test_a1_has_a_table_for_every_section_that_holds_claims():
    """One heading and one table per section of each text (from the data), and no other."""
    from llminfra.ledger.table import source_sections
    cells = _a1_cells()
    tables = ["".join(c["source"]) for c in cells if "".join(c["source"]).startswith("section_table(")]
    expected = []
    for source in SOURCES:
        for n, ko, en, _ in source_sections(source):
            expected.append(f'section_table("{source}", {n})')
            heading = [c for c in cells if "".join(c["source"]).startswith(f"#### {source} §{n} · ")]
            assert len(heading) == 1 and en in "".join(heading[0]["source"])
            assert f"「{ko}」" in "".join(heading[0]["source"])
    assert tables == expected
    in_tables = [c.id for s in SOURCES for *_, claims in source_sections(s) for c in claims]
    assert sorted(in_tables) == sorted(c.id for c in CLAIMS), "a claim is in no section's table"


def test_links_check_fails_on_a_stale_cell(tmp_path):
    import shutil
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


# --- the texts' own words (issue 24: "A1 quotes each claim it checks with its section") -----

SOURCE_TEXTS = NOTEBOOKS.parents[1] / "shared" / "sources"
needs_texts = pytest.mark.skipif(not SOURCE_TEXTS.is_dir(),
                                 reason=f"the source texts are not here ({SOURCE_TEXTS})")


def test_every_claim_has_a_quote_and_a_section():
    from llminfra.ledger.quotes import ELLIPSIS, quote, quoted_ids
    assert sorted(quoted_ids()) == sorted(c.id for c in CLAIMS)
    for c in CLAIMS:
        q = quote(c.id)
        assert q.section.strip() and q.section_en.strip(), c.id
        assert all(part.strip() for part in q.parts), f"{c.id}: an empty part in {q.text!r}"
        assert ELLIPSIS.strip() not in "".join(q.parts), c.id
        assert 8 <= len(q.text) <= 200, f"{c.id}: a quote should be short, not {len(q.text)} chars"
        assert c.section == q.section_en, f"{c.id}: section {c.section!r} is not the heading's English"
    frame = ledger_frame()
    assert (frame["quote"].str.len() > 0).all() and (frame["section (text)"].str.len() > 0).all()
    assert set(frame["source"]) == set(SOURCES)


def _heading_like(line: str) -> bool:
    """A line of the texts that reads as a heading: short, not a sentence, a bullet or a row."""
    line = line.strip()
    return bool(line) and len(line) < 80 and not line.endswith(".") and line[0] not in "-|"


@needs_texts
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_the_headings_are_the_texts(source):
    """The data lists exactly the text's headings, in order, and its title."""
    from llminfra.ledger.quotes import headings, source_title
    lines = (SOURCE_TEXTS / SOURCES[source][0]).read_text(encoding="utf-8").splitlines()
    assert source_title(source) == lines[0]
    assert [ko for ko, _ in headings(source)] == [x for x in lines[1:] if _heading_like(x)]


@needs_texts
@pytest.mark.parametrize("claim", CLAIMS, ids=[c.id for c in CLAIMS])
def test_the_quote_is_in_the_text_under_its_heading(claim):
    """Each part of the quote occurs in the text, in order, between the claim's heading and the
    next heading."""
    from llminfra.ledger.quotes import headings, quote
    text = (SOURCE_TEXTS / SOURCES[claim.source][0]).read_text(encoding="utf-8")
    lines = text.splitlines()
    starts = [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines))]
    heads = [(starts[i], x) for i, x in enumerate(lines) if x in {ko for ko, _ in headings(claim.source)}]
    q = quote(claim.id)
    begin = [pos for pos, x in heads if x == q.section]
    assert len(begin) == 1, f"{claim.id}: heading {q.section!r} is not one line of the text"
    end = min([pos for pos, _ in heads if pos > begin[0]], default=len(text))
    at = begin[0]
    for part in q.parts:
        found = text.find(part, at)
        assert found >= 0, f"{claim.id}: {part!r} is not in the text after {q.section!r}"
        assert found + len(part) <= end, f"{claim.id}: {part!r} is not under {q.section!r}"
        at = found + len(part)


# --- the tables A1 shows ------------------------------------------------------------------

def test_wrap_counts_hangul_as_two_columns():
    from llminfra.ledger.display import text_width, wrap
    assert text_width("가나 ab") == 7
    lines = wrap("가나다 abc 메모리 bandwidth", 6)
    assert lines == ["가나다", "abc", "메모리", "bandwi", "dth"]
    assert all(text_width(x) <= 6 for x in lines)
    assert wrap("", 5) == [""]


def test_ledger_table_html_and_text_show_the_same_rows():
    import re
    from llminfra.ledger.display import TEXT_COLUMNS, chapter_table, text_width
    from llminfra.ledger.quotes import quote
    table = chapter_table("08")
    ids = [c.id for c in CLAIMS if "08" in c.chapters]
    html, text = table._repr_html_(), repr(table)
    assert len(table) == len(ids) and html.count("<tr>") == len(ids) + 1
    assert "text-align:left" in html and "width:100%" in html
    for cid in ids:
        assert f">{cid}<" in html and cid in text
    first = quote(ids[0]).parts[0]
    assert '<span lang="ko">' in html and first.split()[0] in html
    assert max(text_width(x) for x in text.splitlines()) <= TEXT_COLUMNS
    assert re.search(r"^id\s+the text says", text)


def test_ledger_table_escapes_and_refuses_unknown_columns():
    import pandas as pd
    from llminfra.ledger.display import LedgerTable, section_table
    frame = pd.DataFrame([{"id": "000-01", "quote": "<b>가</b>", "says": "1 < 2", "verdict": "holds",
                           "reason": "r & s", "figure": ""}])
    html = LedgerTable(frame, ["id", "the text says", "verdict", "reason"])._repr_html_()
    assert "&lt;b&gt;가&lt;/b&gt;" in html and "1 &lt; 2" in html and "r &amp; s" in html
    with pytest.raises(ValueError, match="unknown columns"):
        LedgerTable(frame, ["id", "colour"])
    with pytest.raises(KeyError, match="no claims under its heading §1"):
        section_table("004", 1)

