"""How ``make test`` shares the tests out among its workers (``pytest -n 2 --dist loadscope
--no-loadscope-reorder``, with the scopes defined here).

A test file is one unit of work: its module fixtures are built once, and a notebook's cells
(nbval) run in order in one kernel. Two exceptions:

* each real-browser test (``tests/test_browser.py``) is a unit of its own, so that its chapters,
  which take most of the run, are shared by the workers (each starts its own JupyterLab);
* the files of :data:`SHARED_WORKER` are one unit, so that they share session fixtures: the
  real-model tests load transformers' model once for both files.

The longest units are handed out first (browser tests, then the real-model tests), so that the
workers finish together. Without xdist, or under another ``--dist``, nothing changes.

A chapter is run once, not twice: when the real-browser test of a chapter runs (it is selected
and a browser is there), it checks the chapter's outputs against the stored ones as nbval does
(``tests/browser_lab.py::output_mismatches``), and nbval's own cells of that chapter are
deselected. Without a browser, nbval checks every chapter as before.
"""

from __future__ import annotations

import logging
import os

import pytest

BROWSER = "tests/test_browser.py"
#: file -> the unit it shares with other files
SHARED_WORKER = {"tests/test_pretrained.py": "smollm2", "tests/test_bench_real.py": "smollm2"}


#: ``make test`` sets this: the ATen CPU capability of the processes the tests start (notebook
#: kernels, JupyterLab, servers), while the test processes keep the CPU's own kernels
NOTEBOOK_CPU_CAPABILITY = "LLMINFRA_NOTEBOOK_CPU_CAPABILITY"


def split_cpu_capability() -> None:
    """With :data:`NOTEBOOK_CPU_CAPABILITY` set (``make test``), this process runs torch on the
    CPU's vectorized kernels, as a learner's does, and every process it starts inherits
    ``ATEN_CPU_CAPABILITY`` set to that value: the notebooks nbval and the browser test run are
    checked on ATen's plainest kernels, so a printed number that depends on the CPU fails, while
    the unit tests run at the kernels' real speed (PyTorch's int4 / int8 CPU matmuls are 10-25x
    slower on the plain path). ATen reads the variable once, on a process's first question: it
    is asked here with the variable unset, then set for the children."""
    capability = os.environ.get(NOTEBOOK_CPU_CAPABILITY)
    if not capability:
        return
    os.environ.pop("ATEN_CPU_CAPABILITY", None)
    import torch
    torch.backends.cpu.get_cpu_capability()
    os.environ["ATEN_CPU_CAPABILITY"] = capability


def pytest_configure(config):
    """Checkers draw fresh seeds in every run and log each at INFO
    (:func:`llminfra.course.checking.seeded`): pytest prints them under "Captured log call"
    beside a failure, so a seed that breaks a test can be replayed. Then
    :func:`split_cpu_capability`."""
    logging.getLogger("llminfra.course.checking").setLevel(logging.INFO)
    split_cpu_capability()


def _path(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to."""
    path = _path(nodeid)
    if path == BROWSER:
        return nodeid
    return SHARED_WORKER.get(path, path)


def _rank(item: pytest.Item) -> int:
    path = _path(item.nodeid)
    return 0 if path == BROWSER else 1 if path in SHARED_WORKER else 2


#: the browser test that runs a whole chapter (parametrized by the chapter's path)
CHAPTER_RUN = BROWSER + "::test_every_widget_moves_in_a_real_browser["


def _browser_present() -> bool:
    import importlib.util
    from pathlib import Path
    return Path("/usr/bin/chromium").exists() and importlib.util.find_spec("playwright") is not None


@pytest.hookimpl(trylast=True)           # after -m / -k have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    in_browser = {item.callspec.params["notebook"] for item in items
                  if item.nodeid.startswith(CHAPTER_RUN)}
    if in_browser and _browser_present():
        twice = [item for item in items if _path(item.nodeid) in in_browser]
        if twice:
            config.hook.pytest_deselected(items=twice)
            items[:] = [item for item in items if _path(item.nodeid) not in in_browser]
    items.sort(key=_rank)                # stable: each file keeps its order, files theirs


@pytest.hookimpl(optionalhook=True)      # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CourseScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return CourseScheduling(config, log)
