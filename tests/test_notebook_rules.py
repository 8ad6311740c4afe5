"""Static rules for the committed notebooks (nbval checks their outputs separately)."""

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def package_function_names() -> set[str]:
    names = set()
    for path in (ROOT / "llminfra").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:  # module-level names, not methods
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                names.add(node.name)
    return names


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_design_chapters_exist():
    names = {p.stem for p in CHAPTERS}
    assert {"00_start_here", "01_training_vs_inference", "02_gpu_memory"} <= names


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_chapter_does_not_redefine_the_package(path):
    """A notebook that re-defines a package function drifts from what the tests ran."""
    package = package_function_names()
    clashes = []
    for cell in code_cells(path):
        src = "".join(cell["source"])
        # IPython magics are not Python: keep the block structure with a `pass` in their place
        src = "\n".join(l[: len(l) - len(l.lstrip())] + "pass" if l.lstrip().startswith(("%", "!"))
                        else l for l in src.splitlines())
        for node in ast.parse(src).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in package:
                clashes.append(node.name)
    assert not clashes, f"{path.name} re-defines package names: {clashes}"


@pytest.mark.parametrize("path", CHAPTERS + SOLUTIONS, ids=[p.name for p in CHAPTERS + SOLUTIONS])
def test_notebook_has_colab_cell_and_stored_outputs(path):
    cells = code_cells(path)
    assert "google.colab" in "".join(cells[0]["source"]), "first cell must be the Colab cell"
    assert "setup()" in "".join(cells[1]["source"]), "second cell must call setup()"
    with_source = [c for c in cells if "".join(c["source"]).strip()]
    assert all(c.get("execution_count") for c in with_source), "run it: some cells have no outputs"
    for c in cells:
        for out in c.get("outputs", []):
            assert out.get("name") != "stderr", f"{path.name}: stderr output stored (a warning?)"
            assert out.get("output_type") != "error", f"{path.name}: an error is stored"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_widgets_render_before_the_notebook_runs(path):
    """A chapter opened before it is run shows its widgets from the saved state, and where no
    widget manager runs, a sentence saying what the widget is — never a constructor repr or
    PNG bytes (``python -m llminfra.course.execute`` stores the state)."""
    nb = json.loads(path.read_text())
    state = nb["metadata"].get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    for cell in code_cells(path):
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            if view is None:
                continue
            assert view["model_id"] in state, f"{path.name}: widget {view['model_id']} has no saved state"
            plain = "".join(out["data"].get("text/plain", ""))
            assert plain.startswith("[interactive widget]"), f"{path.name}: raw widget repr {plain[:60]!r}"
