"""The glossary: search in English and Korean, the rendered docs in sync, links from the
chapters that resolve, and each entry's chapter of first use consistent with the notebooks."""

import json
import re
from pathlib import Path

import pytest

from llminfra.course.glossary import (GLOSSARY, glossary_html, glossary_markdown,
                                      link_first_uses, search, slug)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DOCS = ROOT / "docs" / "glossary.md"


def _markdown(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_search_english_korean_and_empty():
    assert [e.term for e in search("프리필")] == ["prefill", "chunked prefill",
                                                  "prefill/decode disaggregation"]
    assert search("kv cache")[0].term == "KV cache"          # exact name first
    assert len(search("kv cache")) > 1                         # then definitions that mention it
    assert "time to first token (TTFT)" in [e.term for e in search("ttft")]
    assert len(search("")) == len(GLOSSARY)
    assert search("no such term xyz") == []
    with pytest.raises(ValueError, match="string"):
        search(3)


def test_entries_are_complete_and_unique():
    anchors = [e.anchor for e in GLOSSARY]
    assert len(set(anchors)) == len(anchors), "two terms share an anchor"
    for e in GLOSSARY:
        assert e.term and e.ko and e.definition.endswith(".")
        assert re.fullmatch(r"\d\d|A\d", e.chapter), e
        assert e.ko_source in (None, "000", "004")
    assert slug("time to first token (TTFT)") == "time-to-first-token-ttft"


def test_korean_terms_marked_as_from_a_source_are_in_it():
    """A Korean term credited to a source text must occur in that text (its first part, before
    any parenthesis, e.g. '첫 토큰까지 걸리는 시간')."""
    # shared/ lies beside the checkout (CI, the course's machines); one level up from a worktree
    sources = next((p / "shared" / "sources" for p in (ROOT.parent, ROOT.parent.parent)
                    if (p / "shared" / "sources").is_dir()), ROOT.parent / "shared" / "sources")
    texts = {p.name[:3]: p.read_text(encoding="utf-8") for p in sources.glob("0*.txt")}
    if not texts:
        pytest.skip(f"source texts not found at {sources} (they are not part of the repository)")
    for e in GLOSSARY:
        if e.ko_source:
            word = e.ko.split(" (")[0]
            assert word in texts[e.ko_source], (e.term, word, e.ko_source)


def test_html_table_lists_matches_with_links():
    html = glossary_html(search("bubble"), "../docs/glossary.md")
    assert "<table>" in html and "파이프라인 버블" in html
    assert "href='../docs/glossary.md#pipeline-bubble'" in html
    assert "no term matches" in glossary_html([])


def test_docs_file_in_sync():
    assert DOCS.read_text(encoding="utf-8") == glossary_markdown(), \
        "docs/glossary.md is stale: python -m llminfra.course.glossary docs"


def test_link_first_uses_once_and_idempotent():
    cells = [{"cell_type": "markdown", "id": "a", "source": "# KV cache\nThe `KV cache` and the KV cache."},
             {"cell_type": "code", "id": "b", "source": "KV cache"},
             {"cell_type": "markdown", "id": "c", "source": "Another KV cache, and prefill."}]
    two = tuple(e for e in GLOSSARY if e.term in ("KV cache", "prefill"))
    assert link_first_uses(cells, "g.md", two) == 2
    assert cells[0]["source"] == "# KV cache\nThe `KV cache` and the [KV cache](g.md#kv-cache)."
    assert cells[1]["source"] == "KV cache"                       # code is never touched
    assert cells[2]["source"] == "Another KV cache, and [prefill](g.md#prefill)."
    before = [c["source"] for c in cells]
    assert link_first_uses(cells, "g.md", two) == 0               # idempotent
    assert [c["source"] for c in cells] == before
    title = [{"cell_type": "markdown", "id": "t", "source": "See *A Long Title About Prefill Here* on prefill."}]
    assert link_first_uses(title, "g.md", two) == 1               # not inside a cited title
    assert title[0]["source"] == "See *A Long Title About Prefill Here* on [prefill](g.md#prefill)."
    locked = [{"cell_type": "markdown", "id": "x", "source": "prefill"},
              {"cell_type": "markdown", "id": "y", "source": "prefill"}]
    assert link_first_uses(locked, "g.md", two, only_cells={"y"}) == 0   # first use is in a locked cell


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_glossary_links_in_chapters_resolve(path):
    anchors = {e.anchor for e in GLOSSARY}
    docs = DOCS.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(\.\./docs/glossary\.md#([^)]+)\)", _markdown(path)):
        assert target in anchors and f'<a id="{target}"></a>' in docs, (path.name, target)


def test_first_use_chapter_matches_the_notebooks():
    """Where the stated chapter exists, it uses the term, and no earlier chapter does (chapter 00
    introduces the glossary itself, so naming a term there does not count as a use)."""
    present = {p.name[:2]: _markdown(p) for p in CHAPTERS}
    for e in GLOSSARY:
        names = [e.term, *e.aliases]
        pattern = re.compile("|".join(rf"(?<![\w/-]){re.escape(n)}(?![\w/-])" for n in names),
                             re.IGNORECASE)
        earlier = [ch for ch, text in present.items()
                   if "00" < ch < e.chapter and pattern.search(text)]
        assert not earlier, f"{e.term!r} is used in chapter {earlier[0]}, before {e.chapter}"
        if e.chapter in present:
            assert pattern.search(present[e.chapter]), f"{e.term!r} not in chapter {e.chapter}"


def test_a_name_spelled_with_inner_capitals_is_linked_only_as_spelled():
    """ "ZeRO" is linked, "zero point" (chapter 03's quantization) is not; other names still
    match in any case."""
    from llminfra.course.glossary import link_first_uses
    cells = [{"cell_type": "markdown", "id": "a", "source": "absmax and zero point, per tensor"},
             {"cell_type": "markdown", "id": "b", "source": "ZeRO shards the optimizer state; "
                                                            "the kv cache grows"}]
    link_first_uses(cells)
    assert cells[0]["source"] == "absmax and zero point, per tensor"
    assert cells[1]["source"].startswith("[ZeRO](../docs/glossary.md#zero--fsdp) shards")
    assert "[kv cache](../docs/glossary.md#" in cells[1]["source"]
