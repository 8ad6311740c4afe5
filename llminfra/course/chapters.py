"""The course map: which chapters exist, what each runs on this kind of machine, how long it took.

Read from the notebooks themselves, so the map never lists a chapter that is not there:

* the title is the notebook's first heading (``# 06 · FlashAttention from first principles``);
* a code cell *needs a GPU* when it moves work to CUDA (``.cuda(``, ``device="cuda"`` or
  ``.to("cuda")`` in its source); the course guards every such cell with ``torch.cuda.is_available()``, so on a
  CPU-only machine it prints one line and skips (never counted as a pass);
* the run time is what ``python -m llminfra.course.execute`` measured the last time it ran the
  notebook top to bottom, with the machine it ran on (``metadata.llminfra``); ``None`` if the
  notebook was never run that way.

Beside them, for the map: :func:`reading_minutes` (the chapter's prose at :data:`READING_WPM`) and
:func:`loaded_factors`, the slow-downs of chapters run again on a loaded machine
(``python -m llminfra.course.chapters NB…`` runs copies and writes :data:`LOADED_RECORD`).

Shown in chapter 00 (``notebooks/00_start_here.ipynb``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from llminfra.course.execute import execute, machine_description

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


#: silent reading speed assumed for a chapter's prose (words per minute). An assumption: below
#: the 238 words/min average for English non-fiction that Brysbaert (2019, "How many words do we
#: read per minute? A review and meta-analysis of reading rate", J. Memory and Language 109,
#: 104047) reports, because the chapters are technical and interleave code and tables.
READING_WPM = 200
#: the recorded run of :func:`time_chapters` that chapter 00's map reads its load factors from
LOADED_RECORD = Path(__file__).resolve().parents[1] / "data" / "chapter_times_loaded_cpu.json"


def reading_minutes(path: Path, wpm: int = READING_WPM) -> float:
    """Minutes to read a chapter's markdown cells at ``wpm`` words per minute (code and outputs
    not counted)."""
    if wpm <= 0:
        raise ValueError(f"wpm must be positive, got {wpm}")
    cells = _read_json(Path(path)).get("cells", [])
    words = sum(len("".join(c.get("source", [])).split()) for c in cells
                if c["cell_type"] == "markdown")
    return words / wpm


def loaded_factors(record: Path = LOADED_RECORD) -> dict[str, float]:
    """``{chapter: time in the record / the chapter's stored time}`` from a recorded
    :func:`time_chapters` run."""
    runs = json.loads(Path(record).read_text(encoding="utf-8"))["runs"]
    return {r["chapter"]: r["run_time_s"] / r["stored_run_time_s"] for r in runs}


def time_chapters(paths: list[Path]) -> dict:
    """Run copies of the chapter notebooks ``paths`` top to bottom (the chapters themselves are
    not written) and return a record: each one's wall time beside its stored time, the load
    average before and after, the CPU (``lscpu``) and the date."""
    runs = []
    for path in map(Path, paths):
        info = chapter_info(path)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)  # the repository's folders beside a copy of the chapter
            for entry in path.resolve().parents[1].iterdir():
                if entry.name != path.parent.name:
                    (root / entry.name).symlink_to(entry)
            (root / path.parent.name).mkdir()
            copy = root / path.parent.name / path.name
            shutil.copy(path, copy)
            load_before = os.getloadavg()
            elapsed = execute(copy)
            runs.append({"chapter": info["chapter"], "notebook": path.name,
                         "run_time_s": round(elapsed, 1), "stored_run_time_s": info["run_time_s"],
                         "stored_measured_on": info["measured_on"],
                         "load_average_1_5_15_before": list(load_before),
                         "load_average_1_5_15_after": list(os.getloadavg())})
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return {"what": "chapters run top to bottom (copies, by llminfra.course.execute) on the "
                    "project's shared 2-core machine while other sessions used it, beside the "
                    "run time stored in each chapter",
            "command": "python -m llminfra.course.chapters " + " ".join(str(p) for p in paths),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_description(), "python": platform.python_version(),
            "lscpu": {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in
                      lscpu.splitlines() if ":" in line)
                      if k.strip() in ("Architecture", "Model name", "CPU(s)", "Vendor ID",
                                       "Hypervisor vendor")},
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="time chapters (copies) and record the run")
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=LOADED_RECORD)
    args = p.parse_args(argv)
    record = time_chapters(args.notebooks)
    args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for r in record["runs"]:
        print(f"{r['notebook']}: {r['run_time_s']} s (stored: {r['stored_run_time_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
