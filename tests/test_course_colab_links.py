"""Issue 53, the learner's path, items 6 and 8: each chapter's *Open in Colab* link (written on a
copy), Binder's CPU-only torch, and the course map's reading times and loaded-machine factors."""

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from llminfra.course import colab
from llminfra.course.chapters import LOADED_RECORD, loaded_factors, reading_minutes

ROOT = Path(__file__).resolve().parents[1]


def test_colab_url_opens_the_notebook_from_the_repository():
    assert colab.colab_url("notebooks/05_x.ipynb", "https://github.com/owner/repo") == \
        "https://colab.research.google.com/github/owner/repo/blob/main/notebooks/05_x.ipynb"
    for url, notebook in (("https://example.org/owner/repo", "notebooks/a.ipynb"),
                          ("https://github.com/owner", "notebooks/a.ipynb"),
                          ("https://github.com/owner/repo", "notebooks/a.py")):
        with pytest.raises(ValueError, match=re.escape(repr(url))):
            colab.colab_url(notebook, url)


def test_apply_links_writes_one_link_under_each_title_and_nothing_else(tmp_path):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    paths = sorted((tmp_path / "notebooks").glob("*.ipynb"))
    fork = "https://github.com/someone/fork"
    assert colab.stale_links(tmp_path, fork) == paths       # no chapter links to the fork yet
    before = {p: nbformat.read(p, as_version=4) for p in paths}
    assert colab.apply_links(tmp_path, fork) == paths
    assert colab.stale_links(tmp_path, fork) == [] and colab.apply_links(tmp_path, fork) == []
    for path in paths:
        nb, old = nbformat.read(path, as_version=4), before[path]
        assert [c.source for c in nb.cells[1:]] == [c.source for c in old.cells[1:]]
        title = nb.cells[0].source.split("\n")
        assert title[0] == old.cells[0].source.split("\n")[0] and title[1] == ""
        assert title[2] == colab.colab_link(f"notebooks/{path.name}", fork)
        assert nb.cells[0].source.count("colab.research.google.com") == 1
    colab.apply_links(tmp_path)                             # back to the course's repository
    again = tmp_path / "notebooks" / "00_start_here.ipynb"
    assert nbformat.read(again, as_version=4).cells[0].source == \
        nbformat.read(ROOT / "notebooks" / "00_start_here.ipynb", as_version=4).cells[0].source


def test_a_chapter_without_a_title_cell_is_named(tmp_path):
    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(nb, tmp_path / "notebooks" / "03_x.ipynb")
    with pytest.raises(ValueError, match="03_x.ipynb"):
        colab.apply_links(tmp_path)


def test_chapter_00_links_to_colab():
    assert ROOT / "notebooks" / "00_start_here.ipynb" not in colab.stale_links(ROOT)


def test_binder_gets_the_cpu_wheel_of_torch():
    """PyPI's Linux torch wheel pulls the CUDA libraries; environment.yml's pip section names
    PyTorch's CPU index before torch, and postBuild installs no torch of its own."""
    pip = (ROOT / "environment.yml").read_text().split("- pip:", 1)[1].splitlines()
    items = [line.strip()[2:] for line in pip if line.strip().startswith("- ")]
    index = items.index("--extra-index-url https://download.pytorch.org/whl/cpu")
    assert index < next(i for i, r in enumerate(items) if r.startswith("torch"))
    installs = [line for line in (ROOT / "postBuild").read_text().splitlines() if "pip install" in line]
    assert installs and not any("torch" in line for line in installs)


def _notebook(path: Path, markdown: list[str], code: str = "") -> Path:
    cells = [{"cell_type": "markdown", "source": m} for m in markdown]
    cells.append({"cell_type": "code", "source": code})
    path.write_text(json.dumps({"cells": cells, "metadata": {}}))
    return path


def test_reading_minutes_count_the_text_cells_only(tmp_path):
    p = _notebook(tmp_path / "01_a.ipynb", ["# 01 · A\n" + "word " * 98, "two more"],
                  code="x = 1  " * 500)
    assert reading_minutes(p, wpm=50) == pytest.approx((4 + 98 + 2) / 50)  # "#", "01", "·", "A"
    with pytest.raises(ValueError, match="-3"):
        reading_minutes(p, wpm=-3)


def test_loaded_factors_divide_the_loaded_run_by_the_stored_time(tmp_path):
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"runs": [
        {"chapter": "05", "run_time_s": 90.0, "stored_run_time_s": 30.0},
        {"chapter": "03", "run_time_s": 50.0, "stored_run_time_s": 25.0}]}))
    assert loaded_factors(record) == {"05": 3.0, "03": 2.0}


def test_the_recorded_loaded_run_names_its_machine_and_real_chapters():
    record = json.loads(LOADED_RECORD.read_text())
    assert record["lscpu"]["Model name"] and record["date"] and record["runs"]
    chapters = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    for run in record["runs"]:
        assert run["notebook"] in chapters and run["run_time_s"] > 0 < run["stored_run_time_s"]
