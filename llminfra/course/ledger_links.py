"""Links between the chapters and the claims ledger (appendix A1), kept in sync by a command.

Each chapter whose figures the ledger checks ends with one markdown cell (tagged
``ledger-links``) listing those claims with their verdicts and linking to the chapter's section
of ``A1_claims_ledger.ipynb``: the markdown cell with the heading ``Chapter NN`` and the cell id
``chapter-NN`` (:func:`anchor`); the ledger's section links back to the chapter.
``python -m llminfra.course.ledger_links --apply`` writes the cells (source only, cell ids
kept), ``--check`` fails when one is stale.

The link names the cell by its id (``A1_claims_ledger.ipynb#cell-id=chapter-08``, JupyterLab's
fragment for a cell, since 4.0), not by its heading (``#Chapter-08``): measured in JupyterLab
4.6 with Chromium, a heading fragment left a freshly opened A1 at its top in every windowing
mode, because the fragment is looked up before the notebook's markdown is drawn, while the cell
id is found in the notebook's model and scrolled to.

Taught in appendix A1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from llminfra.ledger import all_claims

TAG = "ledger-links"
LEDGER = "A1_claims_ledger.ipynb"


def chapter_notebooks(folder: Path) -> dict[str, Path]:
    """``{"02": notebooks/02_gpu_memory.ipynb, …}`` for the numbered chapters in ``folder``."""
    return {p.name[:2]: p for p in sorted(folder.glob("[0-9][0-9]_*.ipynb"))}


def anchor(chapter: str) -> str:
    """The cell id of chapter ``chapter``'s section of the ledger (``"08"`` → ``"chapter-08"``),
    which the chapter's link names."""
    return f"chapter-{chapter}"


def link(chapter: str) -> str:
    """The link from a chapter to its section of the ledger (relative to ``notebooks/``)."""
    return f"{LEDGER}#cell-id={anchor(chapter)}"


def links_markdown(chapter: str) -> str | None:
    """The chapter's closing cell: the ledger's claims that come up in it (None if there are
    none)."""
    claims = [c for c in all_claims() if chapter in c.chapters]
    if not claims:
        return None
    items = ", ".join(f"{c.id} ({c.verdict})" for c in claims)
    return (f"**The source texts' figures in this chapter**, each recomputed or sourced with a "
            f"verdict in the claims ledger — [appendix A1, chapter {chapter}'s rows]"
            f"({link(chapter)}): {items}.")


def _sync(path: Path, chapter: str, write: bool) -> bool:
    """True if the notebook's links cell is (or, with ``write``, now is) up to date."""
    nb = nbformat.read(path, as_version=4)
    text = links_markdown(chapter)
    cells = [c for c in nb.cells if TAG in c.get("metadata", {}).get("tags", [])]
    current = cells[0].source if cells else None
    if current == text:
        return True
    if not write:
        return False
    if cells and text is None:
        nb.cells.remove(cells[0])
    elif cells:
        cells[0].source = text
    else:
        cell = nbformat.v4.new_markdown_cell(text)
        cell.metadata["tags"] = [TAG]
        nb.cells.append(cell)
    nbformat.write(nb, path)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--apply", action="store_true", help="write the cells")
    p.add_argument("--check", action="store_true", help="fail if a cell is stale")
    p.add_argument("--folder", type=Path, default=Path("notebooks"))
    args = p.parse_args(argv)
    stale = [str(path) for ch, path in chapter_notebooks(args.folder).items()
             if not _sync(path, ch, write=args.apply)]
    if stale and not args.apply:
        print("ledger links out of date (run python -m llminfra.course.ledger_links --apply): "
              + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
