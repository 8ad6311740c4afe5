"""The course map: which chapters exist, what each runs on this kind of machine, how long it took.

Read from the notebooks themselves, so the map never lists a chapter that is not there:

* the title is the notebook's first heading (``# 06 · FlashAttention from first principles``);
* a code cell *needs a GPU* when it moves work to CUDA (``.cuda(``, ``device="cuda"`` or
  ``.to("cuda")`` in its source); the course guards every such cell with ``torch.cuda.is_available()``, so on a
  CPU-only machine it prints one line and skips (never counted as a pass);
* the run time is what ``python -m llminfra.course.execute`` measured the last time it ran the
  notebook top to bottom, with the machine it ran on (``metadata.llminfra``); ``None`` if the
  notebook was never run that way.

Shown in chapter 00 (``notebooks/00_start_here.ipynb``).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

_GPU_USE = re.compile(r"\.cuda\(|device\s*=\s*[\"']cuda|\.to\([\"']cuda")
_CHAPTER_FILE = re.compile(r"^(\d\d|A\d)_.+\.ipynb$")


def _read_json(path: Path, attempts: int = 5) -> dict:
    """The notebook's JSON. JupyterLab saves a notebook by rewriting the file in place, so a
    chapter being saved (autosave) can read as broken for a moment: read again, then say which
    file is broken."""
    for attempt in range(1, attempts):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            time.sleep(0.2 * attempt)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a readable notebook ({e})") from None


def chapter_info(path: Path) -> dict:
    """``{"chapter", "notebook", "title", "gpu_cells", "code_cells", "run_time_s",
    "measured_on"}`` for one chapter notebook (see the module docstring)."""
    path = Path(path)
    nb = _read_json(path)
    cells = nb.get("cells", [])
    source = lambda c: "".join(c.get("source", []))  # noqa: E731
    title = next((line.lstrip("# ").strip() for c in cells if c["cell_type"] == "markdown"
                  for line in source(c).splitlines() if line.startswith("# ")), path.stem)
    if " · " in title:
        title = title.split(" · ", 1)[1]
    code = [c for c in cells if c["cell_type"] == "code"]
    meta = nb.get("metadata", {}).get("llminfra", {})
    return {"chapter": path.name.split("_", 1)[0], "notebook": path.name, "title": title,
            "gpu_cells": sum(bool(_GPU_USE.search(source(c))) for c in code),
            "code_cells": len(code), "run_time_s": meta.get("run_time_s"),
            "measured_on": meta.get("measured_on")}


def course_map(notebooks_dir: Path) -> list[dict]:
    """:func:`chapter_info` of every chapter notebook (``NN_name.ipynb``) in ``notebooks_dir``,
    in chapter order."""
    notebooks_dir = Path(notebooks_dir)
    if not notebooks_dir.is_dir():
        raise ValueError(f"not a folder of notebooks: {notebooks_dir}")
    return [chapter_info(p) for p in sorted(notebooks_dir.glob("*.ipynb"))
            if _CHAPTER_FILE.match(p.name)]


def runs_here(info: dict) -> str:
    """What a chapter runs on a CPU-only machine, in words: ``"CPU"`` or
    ``"CPU (2 GPU cells skip without CUDA)"``."""
    n = info["gpu_cells"]
    return "CPU" if n == 0 else f"CPU ({n} GPU cell{'s' if n > 1 else ''} skip without CUDA)"
