"""``make course``'s JupyterLab set-up: the course notebooks trusted, the settings shipped."""

from __future__ import annotations

import json

import nbformat
from nbformat.sign import NotebookNotary

from llminfra.course.lab_setup import (FOLDERS, OVERRIDES, course_notebooks, install_overrides,
                                       trust_notebooks)


def test_every_course_notebook_is_signed_and_a_changed_one_is_not(tmp_path):
    paths = course_notebooks()
    assert {p.parent.name for p in paths} == set(FOLDERS) and len(paths) >= 3 * 10
    notary = NotebookNotary(data_dir=str(tmp_path), secret=b"course-test")
    assert trust_notebooks(paths[:3], notary) == 3
    for p in paths[:3]:
        assert notary.check_signature(nbformat.read(p, as_version=4))
    changed = nbformat.read(paths[0], as_version=4)
    changed.cells.append(nbformat.v4.new_markdown_cell("edited"))
    assert not notary.check_signature(changed)


def test_overrides_are_merged_into_what_is_there(tmp_path):
    path = tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "dark"},
                                "@jupyter-widgets/jupyterlab-manager:plugin": {"x": 1}}))
    assert install_overrides(tmp_path) == path
    got = json.loads(path.read_text())
    assert got["@jupyterlab/apputils-extension:themes"] == {"theme": "dark"}
    assert got["@jupyter-widgets/jupyterlab-manager:plugin"] == {"x": 1, "saveState": True}
    for plugin, settings in OVERRIDES.items():
        assert got[plugin].items() >= settings.items()
