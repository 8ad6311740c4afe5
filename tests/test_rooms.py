"""Rooms by concept (DESIGN.md §2): the simulation wing in ``llminfra.sim``, more than one engine
in ``llminfra.cluster``, the engine proper in ``llminfra.engine``, the HTTP front end in
``llminfra.serving`` — and the old import paths gone, not kept alive by shims.

Imports are read from the source with :mod:`ast` (at module level or inside a function: both
are dependencies), so a room that reaches upward fails here even on a code path no test runs.
"""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llminfra"

SIM = {"simulator", "disagg", "timeline", "scheduling_rules", "workload", "goodput"}
CLUSTER = {"kv_transfer", "kv_link", "disagg", "disagg_process", "router", "router_run",
           "router_workload"}
#: where each moved module used to live (issue 41, item 3)
OLD_PATHS = ["llminfra.engine.simulator", "llminfra.engine.disagg_sim",
             "llminfra.engine.timeline", "llminfra.engine.scheduling_rules",
             "llminfra.engine.workload", "llminfra.engine.goodput",
             "llminfra.engine.kv_transfer", "llminfra.serving.router",
             "llminfra.serving.router_run", "llminfra.serving.router_workload",
             "llminfra.serving.disagg", "llminfra.serving.disagg_process"]


@pytest.mark.parametrize("name", OLD_PATHS)
def test_the_old_paths_are_gone(name):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


@pytest.mark.parametrize("room, modules", [("sim", SIM), ("cluster", CLUSTER)])
def test_the_rooms_hold_their_modules(room, modules):
    folder = PACKAGE / room
    assert (folder / "__init__.py").is_file()
    found = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert found == modules
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
    assert doc and all(f":mod:`.{m}`" in doc for m in modules), \
        f"llminfra/{room}/__init__.py names each of its modules"


@pytest.mark.parametrize("name", [f"llminfra.sim.{m}" for m in sorted(SIM)]
                         + [f"llminfra.cluster.{m}" for m in sorted(CLUSTER)])
def test_the_new_paths_import(name):
    assert importlib.import_module(name).__doc__


def _llminfra_imports(source: str, module: str) -> set[str]:
    """The llminfra modules that ``source``, the text of ``module`` (``"llminfra.engine.x"``;
    a package's ``__init__`` as ``"llminfra.engine.__init__"``), imports: absolute or relative,
    anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[:-node.level]
                base = ".".join(parent + ([base] if base else []))
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("llminfra.")}


def _reaching(room: str, above: tuple[str, ...]) -> list[str]:
    return sorted(f"{p.relative_to(ROOT)} imports {m}"
                  for p in (PACKAGE / room).rglob("*.py")
                  for m in _llminfra_imports(p.read_text(encoding="utf-8"),
                                             ".".join(p.relative_to(ROOT).with_suffix("").parts))
                  if m.split(".")[1] in above)


def test_the_engine_imports_no_room_above_it():
    wrong = _reaching("engine", ("sim", "cluster", "serving"))
    assert not wrong, "llminfra.engine knows nothing built on it:\n" + "\n".join(wrong)


def test_the_simulation_and_the_front_end_stay_below_the_cluster():
    wrong = _reaching("sim", ("cluster", "serving")) + _reaching("serving", ("cluster",))
    assert not wrong, "\n".join(wrong)


def test_the_import_reader_sees_relative_and_absolute_imports():
    source = ("from ..sim import simulator\nimport llminfra.cluster.router\n"
              "def f():\n    from .sequence import Sequence\n")
    found = _llminfra_imports(source, "llminfra.engine.probe")
    assert {"llminfra.sim.simulator", "llminfra.cluster.router",
            "llminfra.engine.sequence"} <= found
    assert _llminfra_imports("from . import engine\n", "llminfra.engine.__init__") >= \
        {"llminfra.engine.engine"}


def test_the_vllm_paper_s_figures_have_one_home():
    """Chapter 04 and ``bench kvcache`` read the paper's figures and the KV budget from the
    package room (:mod:`llminfra.kvcache.simulate`), not one from the other."""
    from llminfra.bench import kvcache as suite
    from llminfra.kvcache import simulate
    assert suite.PAPER is simulate.PAPER and suite.kv_budget_tokens is simulate.kv_budget_tokens
    nb = json.loads((ROOT / "notebooks" / "04_kv_cache_and_paged_attention.ipynb")
                    .read_text(encoding="utf-8"))
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "llminfra.bench.kvcache" not in code and "kv_budget_tokens" in code
