"""The course map read from the notebooks, the notebook runner's order and stored run time, and
the widgets' stable reprs and natural image size."""

import json
import struct
from pathlib import Path

import ipywidgets as widgets
import pytest

from llminfra.course.chapters import chapter_info, course_map, runs_here
from llminfra.course.execute import run_order
from llminfra.widgets.panel import Panel, natural_size, png_size


def _nb(path: Path, cells, meta=None):
    path.write_text(json.dumps({"cells": cells, "metadata": meta or {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def test_chapter_info_reads_title_gpu_cells_and_time(tmp_path):
    p = _nb(tmp_path / "06_x.ipynb", [
        {"cell_type": "markdown", "source": ["# 06 · Flash things\n", "text"]},
        {"cell_type": "code", "source": "x = 1"},
        {"cell_type": "code", "source": "if torch.cuda.is_available():\n    q = q.cuda()"},
        {"cell_type": "code", "source": "t = torch.ones(1, device=\"cuda\")"},
        {"cell_type": "code", "source": "print(report[\"cuda\"], torch.cuda.is_available())"},
    ], {"llminfra": {"run_time_s": 12.5, "measured_on": "x86_64, 2 CPU cores, CPU only"}})
    info = chapter_info(p)
    assert info == {"chapter": "06", "notebook": "06_x.ipynb", "title": "Flash things",
                    "gpu_cells": 2, "code_cells": 4, "run_time_s": 12.5,
                    "measured_on": "x86_64, 2 CPU cores, CPU only"}
    assert runs_here(info) == "CPU (2 GPU cells skip without CUDA)"
    assert runs_here({**info, "gpu_cells": 0}) == "CPU"


def test_course_map_lists_only_chapters_present(tmp_path):
    _nb(tmp_path / "01_a.ipynb", [{"cell_type": "markdown", "source": "# 01 · A"}])
    _nb(tmp_path / "00_b.ipynb", [{"cell_type": "markdown", "source": "# 00 · B"}])
    (tmp_path / "notes.ipynb").write_text("{}")
    assert [i["chapter"] for i in course_map(tmp_path)] == ["00", "01"]
    assert course_map(tmp_path)[0]["run_time_s"] is None
    with pytest.raises(ValueError, match="not a folder"):
        course_map(tmp_path / "missing")


def test_runner_executes_chapter_00_last():
    paths = [Path("notebooks/00_start_here.ipynb"), Path("notebooks/03_x.ipynb"), Path("a/01_y.ipynb")]
    assert [p.name for p in run_order(paths)] == ["03_x.ipynb", "01_y.ipynb", "00_start_here.ipynb"]


def test_panel_repr_is_stable_and_says_what_it_is():
    slider = widgets.IntSlider(value=3)
    p = Panel([slider], title="Thing", how="move it")
    before = repr(p)
    slider.value = 7
    assert repr(p) == before == ("[interactive widget] Thing — move it. "
                                 "Run this cell (a live Python kernel) to bring it to life.")
    assert "children" not in before
    with pytest.raises(ValueError, match="title"):
        Panel([], title="")


def test_natural_size_reads_the_png_header():
    png = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", 560, 192) + b"\x08\x02"
    assert png_size(png) == (560, 192)
    img = natural_size(widgets.Image(value=png, format="png"))
    assert (img.layout.width, img.layout.height) == ("560px", "192px")
    with pytest.raises(ValueError, match="PNG"):
        png_size(b"GIF89a" + bytes(30))


def test_a_notebook_that_stays_broken_is_named(tmp_path):
    """A chapter mid-save reads again (JupyterLab rewrites the file in place); one that stays
    broken gives a ValueError naming it, not a bare JSONDecodeError."""
    (tmp_path / "03_broken.ipynb").write_text('{"cells": []}{"cells": []}')
    with pytest.raises(ValueError, match="03_broken.ipynb: not a readable notebook"):
        course_map(tmp_path)
