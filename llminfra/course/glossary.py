"""The course glossary, English and Korean: search, rendering, and links from the chapters.

The entries are data in :mod:`llminfra.course.glossary_terms` (English term, the Korean term of
the course's source texts, a one-line definition, the chapter of first use).

* :func:`search` — entries whose English or Korean term, alias or definition contains a query;
* :func:`glossary_html` — entries as an HTML table (chapter 00's search widget shows it);
* :func:`glossary_markdown` — ``docs/glossary.md``, one anchored heading per term;
* :func:`link_first_uses` — in a chapter's markdown, link the first use of each term to its
  anchor in ``docs/glossary.md``.

Command line::

    python -m llminfra.course.glossary docs            # (re)write docs/glossary.md
    python -m llminfra.course.glossary docs --check    # fail if docs/glossary.md is stale
    python -m llminfra.course.glossary link NB.ipynb…  # link first uses (idempotent)

Shown and searched in chapter 00 (``notebooks/00_start_here.ipynb``).
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

from llminfra.course.glossary_terms import GLOSSARY, Term, slug

__all__ = ["GLOSSARY", "Term", "slug", "search", "glossary_html", "glossary_markdown",
           "link_first_uses"]


def search(query: str, entries: tuple[Term, ...] = GLOSSARY) -> list[Term]:
    """Entries whose term, Korean term, aliases or definition contain ``query`` (case-
    insensitive; an empty query returns every entry), best first: the term or an alias equal to
    the query, then names containing it, then definitions mentioning it.
    ``search("프리필")`` -> ``[prefill, chunked prefill]``."""
    if not isinstance(query, str):
        raise ValueError(f"query must be a string, got {type(query).__name__}")
    q = query.strip().lower()
    if not q:
        return list(entries)

    def rank(e: Term) -> int:
        names = [n.lower() for n in (e.term, e.ko, *e.aliases)]
        if q in names:
            return 0
        if any(q in n for n in names):
            return 1
        return 2 if q in e.definition.lower() else 3
    return sorted((e for e in entries if rank(e) < 3), key=rank)


def glossary_html(entries: list[Term] | tuple[Term, ...], docs_href: str | None = None) -> str:
    """An HTML table (term, Korean, meaning, first used in chapter); each term links to its
    anchor in ``docs_href`` (e.g. ``"../docs/glossary.md"``) when given."""
    def cell(e: Term) -> str:
        name = html.escape(e.term)
        return f"<a href='{docs_href}#{e.anchor}'>{name}</a>" if docs_href else name
    rows = "".join(f"<tr><td>{cell(e)}</td><td>{html.escape(e.ko)}</td>"
                   f"<td style='text-align:left'>{html.escape(e.definition)}</td>"
                   f"<td>{e.chapter}</td></tr>" for e in entries)
    head = ("<tr><th>term</th><th>한국어 (Korean)</th><th style='text-align:left'>meaning</th>"
            "<th>first used in chapter</th></tr>")
    return f"<table>{head}{rows}</table>" if entries else "<i>no term matches</i>"


def glossary_markdown(entries: tuple[Term, ...] = GLOSSARY) -> str:
    """``docs/glossary.md``: one ``###`` heading per term (GitHub's anchor is :attr:`Term.anchor`,
    repeated as an explicit ``<a id>`` for JupyterLab), alphabetical."""
    out = ["# Glossary · 용어집", "",
           "English and Korean terms of the course. The Korean term is the one the course's "
           "source texts use (`000_*.txt`, `004_*.txt` in the course's `sources`), marked "
           "*(usual rendering)* where neither text has one. Generated from "
           "`llminfra/course/glossary_terms.py` by `python -m llminfra.course.glossary docs`; "
           "search it in chapter 00.", ""]
    for e in sorted(entries, key=lambda e: e.term.lower()):
        src = f"source text {e.ko_source}" if e.ko_source else "usual rendering"
        out += [f'<a id="{e.anchor}"></a>', "", f"### {e.term}", "",
                f"**{e.ko}** *({src})* — {e.definition} First used in chapter {e.chapter}.", ""]
    return "\n".join(out)


#: markdown spans never linked into: code, math, links, HTML tags, and heading lines
_PROTECTED = re.compile(r"`[^`]*`|\$[^$]*\$|\[[^\]]*\]\([^)]*\)|<[^>]+>|^#.*$", re.MULTILINE)


#: italic spans; those of four words or more are titles of cited works, never linked into
_ITALIC = re.compile(r"(?<![*\w])\*[^*\n]+\*(?![*\w])")


def _pattern(e: Term) -> re.Pattern:
    """Any of the term's names, case ignored — except names spelled with a capital after a small
    letter ("ZeRO", "vLLM"), which match only as spelled: "zero point" is not ZeRO."""
    names = sorted({e.term, *e.aliases}, key=len, reverse=True)
    alts = "|".join(f"(?-i:{re.escape(n)})" if re.search(r"[a-z][A-Z]", n) else re.escape(n)
                    for n in names)
    return re.compile(rf"(?<![\w/-])({alts})(?![\w/-])", re.IGNORECASE)


def _link_once(text: str, e: Term, href: str) -> tuple[str, bool]:
    """Link the first unprotected match of ``e`` in ``text``; ``(new text, linked?)``."""
    protected = [m.span() for m in _PROTECTED.finditer(text)]
    protected += [m.span() for m in _ITALIC.finditer(text) if len(m.group().split()) >= 4]  # titles
    for m in _pattern(e).finditer(text):
        if any(a <= m.start() < b for a, b in protected):
            continue
        link = f"[{m.group(1)}]({href}#{e.anchor})"
        return text[:m.start()] + link + text[m.end():], True
    return text, False


def link_first_uses(cells: list[dict], href: str = "../docs/glossary.md",
                    entries: tuple[Term, ...] = GLOSSARY, only_cells: set | None = None) -> int:
    """In notebook ``cells`` (nbformat dicts), turn the first use of each term in markdown into
    a link to ``href#anchor``; terms already linked anywhere in the notebook are skipped, so
    running it twice changes nothing. ``only_cells``: cell ids allowed to change (None: all).
    Returns the number of links added."""
    def src(c):
        return "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    added = 0
    for e in entries:
        if any(f"{href}#{e.anchor})" in src(c) for c in cells if c["cell_type"] == "markdown"):
            continue
        for c in cells:
            if c["cell_type"] != "markdown":
                continue
            if not _pattern(e).search(src(c)):
                continue
            if only_cells is not None and c.get("id") not in only_cells:
                break  # the first use is in a cell we may not change: leave it
            new, done = _link_once(src(c), e, href)
            if done:
                c["source"] = new
                added += 1
                break
    return added


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the course glossary: write docs, link chapters")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("docs", help="write docs/glossary.md")
    d.add_argument("--path", type=Path, default=Path("docs/glossary.md"))
    d.add_argument("--check", action="store_true", help="fail if the file is stale")
    lk = sub.add_parser("link", help="link each term's first use in these notebooks")
    lk.add_argument("notebooks", nargs="+", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "docs":
        text = glossary_markdown()
        if args.check:
            ok = args.path.exists() and args.path.read_text(encoding="utf-8") == text
            print(f"{args.path}: {'up to date' if ok else 'STALE: run python -m llminfra.course.glossary docs'}")
            return 0 if ok else 1
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(text, encoding="utf-8")
        print(f"wrote {args.path} ({len(GLOSSARY)} terms)")
        return 0
    import nbformat
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        n = link_first_uses(nb.cells)
        if n:
            nbformat.write(nb, path)
        print(f"{path}: {n} glossary links added")
    return 0


if __name__ == "__main__":
    sys.exit(main())
