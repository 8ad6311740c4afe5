"""The install files agree with each other: environment.yml (conda / Binder, the learner's
install) lists exactly pyproject.toml's dependencies and its ``course`` extra; the test tools stay
out of the learner's install; the Makefile registers the kernel the notebooks name."""

import json
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


def learner_requirements() -> set[str]:
    p = project()
    return set(p["dependencies"]) | set(p["optional-dependencies"]["course"])


def environment_pip_requirements() -> set[str]:
    text = (ROOT / "environment.yml").read_text()
    pip_block = text.split("- pip:", 1)[1]
    # the packages (an option line such as Binder's CPU index for torch is not one)
    return {m.group(1).strip() for m in re.finditer(r"^\s+-\s+(.+)$", pip_block, re.M)
            if not m.group(1).startswith("-")}


def _make_variable(name: str) -> str:
    m = re.search(rf"^{name}\s*:?=\s*(.*)$", MAKEFILE, re.M)
    assert m, f"Makefile defines no {name}"
    return m.group(1).strip()


def test_environment_yml_matches_the_learner_install():
    py, env = learner_requirements(), environment_pip_requirements()
    assert py == env, f"only in pyproject: {sorted(py - env)}; only in environment.yml: {sorted(env - py)}"


def test_learner_install_pulls_no_test_tools():
    test_tools = {_name(r) for r in project()["optional-dependencies"]["test"]}
    assert {"pytest", "nbval", "playwright"} <= test_tools
    leaked = test_tools & {_name(r) for r in learner_requirements()}
    assert not leaked, f"test tools in the learner's install (dependencies / course): {sorted(leaked)}"


def test_make_course_installs_course_and_make_test_adds_test():
    assert re.search(r'pip install [^\n]*-e "\.\[course\]"', MAKEFILE)
    assert re.search(r'pip install [^\n]*-e "\.\[course,test\]"', MAKEFILE)
    for line in MAKEFILE.splitlines():  # pip's progress stays visible for the big steps
        if "pip install" in line and ("TORCH" in line or "-e " in line):
            assert "--quiet" not in line and " -q" not in line, line


def test_license_is_an_spdx_string():
    """A ``{text = …}`` table is deprecated by setuptools >= 77 (PEP 639) and warns at install."""
    assert isinstance(project()["license"], str)
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(7[7-9]|[89]\d|\d{3,})(\.\d+)*", r) for r in build), build


def test_torch_is_pinned_for_the_readme_commands():
    """CI must not pull a CUDA build: the Makefile installs the pinned release first."""
    assert "TORCH ?= torch==2.13.0" in MAKEFILE


def test_installed_kernel_is_the_one_the_notebooks_name():
    """JupyterLab rewrites a notebook's kernelspec on open when the registered display name
    differs from the stored one; every committed notebook names exactly what `make` registers."""
    name, display = _make_variable("KERNEL_NAME"), _make_variable("KERNEL_DISPLAY_NAME")
    assert '--name $(KERNEL_NAME)' in MAKEFILE and '--display-name "$(KERNEL_DISPLAY_NAME)"' in MAKEFILE
    notebooks = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(ROOT.glob("solutions/*.ipynb")) \
        + sorted(ROOT.glob("exercises/*.ipynb"))
    assert notebooks
    for nb in notebooks:
        spec = json.loads(nb.read_text())["metadata"].get("kernelspec", {})
        assert (spec.get("name"), spec.get("display_name")) == (name, display), \
            f"{nb.relative_to(ROOT)} names kernel {spec}; make registers {name!r} / {display!r}"


def test_make_course_serves_the_repository_root():
    args = _make_variable("COURSE_LAB_ARGS")
    assert "--ServerApp.root_dir=." in args.split() and "notebooks/00_start_here.ipynb" in args.split()
    assert (ROOT / "notebooks" / "00_start_here.ipynb").exists()


def test_binder_postbuild_installs_the_package():
    assert "pip install --no-deps -e ." in (ROOT / "postBuild").read_text()
