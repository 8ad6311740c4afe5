"""environment.yml (conda / Binder) installs the same packages as pyproject.toml."""

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs |= set(extra)
    return reqs


def environment_pip_requirements() -> set[str]:
    text = (ROOT / "environment.yml").read_text()
    pip_block = text.split("- pip:", 1)[1]
    return {m.group(1).strip() for m in re.finditer(r"^\s+-\s+(.+)$", pip_block, re.M)}


def test_environment_yml_matches_pyproject():
    py, env = pyproject_requirements(), environment_pip_requirements()
    assert py == env, f"only in pyproject: {sorted(py - env)}; only in environment.yml: {sorted(env - py)}"


def test_torch_is_pinned_for_the_readme_commands():
    """CI must not pull a CUDA build: the Makefile installs the pinned release first."""
    assert "TORCH ?= torch==2.13.0" in (ROOT / "Makefile").read_text()


def test_binder_postbuild_installs_the_package():
    assert "pip install --no-deps -e ." in (ROOT / "postBuild").read_text()
