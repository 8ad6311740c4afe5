"""The course's chapters are read-only in JupyterLab (llminfra/course/lab_contents.py): the
contents API reports them not writable and refuses to write them; everything else (a learner's
copy, exercises/) is as usual. The server is driven in-process (no browser: tests/test_browser.py
checks, with autosave on, that a chapter opened and left stays byte-identical)."""

import asyncio
import json
from pathlib import Path

import nbformat
import pytest
from tornado.web import HTTPError

from llminfra.course.lab_contents import CourseContentsManager, is_read_only
from llminfra.course.lab_setup import SERVER_CONFIG, install_server_config

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()


def test_every_chapter_and_solution_is_read_only_and_nothing_else():
    chapters = [p.relative_to(ROOT).as_posix() for folder in ("notebooks", "solutions")
                for p in sorted((ROOT / folder).glob("*.ipynb"))]
    assert len(chapters) >= 20 and all(is_read_only(p) for p in chapters), \
        [p for p in chapters if not is_read_only(p)]
    assert all(is_read_only("/" + p) for p in chapters)           # as the API may name them
    writable = ["exercises/02_gpu_memory.ipynb", "notebooks/my_02_gpu_memory.ipynb",
                "notebooks/02_gpu_memory-Copy1.ipynb", "notebooks/Untitled.ipynb",
                "solutions/my_02.ipynb", "notebooks/02_gpu_memory.py", "02_gpu_memory.ipynb",
                "notebooks/sub/02_gpu_memory.ipynb", "README.md"]
    assert not any(is_read_only(p) for p in writable)


@pytest.fixture()
def served(tmp_path):
    for name in ("notebooks/02_gpu_memory.ipynb", "exercises/02_gpu_memory.ipynb"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    return tmp_path, CourseContentsManager(root_dir=str(tmp_path))


def test_the_contents_api_reports_chapters_read_only_and_refuses_writes(served):
    root, manager = served
    run = asyncio.run
    chapter = "notebooks/02_gpu_memory.ipynb"
    assert run(manager.get(chapter, content=False))["writable"] is False
    assert run(manager.get("exercises/02_gpu_memory.ipynb", content=False))["writable"] is True
    listing = {c["path"]: c["writable"] for c in run(manager.get("notebooks"))["content"]}
    assert listing == {chapter: False}
    model = run(manager.get(chapter))
    before = (root / chapter).read_bytes()
    with pytest.raises(HTTPError) as e:
        run(manager.save(model, chapter))
    assert e.value.status_code == 403 and "Save Notebook As" in e.value.log_message
    assert (root / chapter).read_bytes() == before
    # Save As: a copy beside it is the learner's, writable; so is a learner's exercise
    run(manager.save(model, "notebooks/my_02_gpu_memory.ipynb"))
    assert run(manager.get("notebooks/my_02_gpu_memory.ipynb", content=False))["writable"]
    exercise = run(manager.get("exercises/02_gpu_memory.ipynb"))
    exercise["content"]["cells"].append(nbformat.v4.new_markdown_cell("my notes"))
    run(manager.save(exercise, "exercises/02_gpu_memory.ipynb"))
    assert "my notes" in (root / "exercises/02_gpu_memory.ipynb").read_text()


def test_make_course_and_the_environment_name_the_contents_manager(tmp_path):
    """make course's command line (which the browser test uses) and the environment's server
    configuration (a JupyterLab started otherwise: Binder) name the same class; the printed
    URL opens the start notebook, not the Launcher."""
    cls = "llminfra.course.lab_contents.CourseContentsManager"
    args = next(line for line in MAKEFILE.splitlines() if line.startswith("COURSE_LAB_ARGS"))
    assert f"--ServerApp.contents_manager_class={cls}" in args.split()
    assert "--LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb" in args.split()
    path = install_server_config(tmp_path)
    assert path == tmp_path / "etc/jupyter/jupyter_server_config.d/llminfra-course.json"
    assert json.loads(path.read_text()) == SERVER_CONFIG
    assert SERVER_CONFIG["ServerApp"]["contents_manager_class"] == cls
