"""The course names its two source texts by title (and id), never by the file names a learner's
clone does not have (issue 24: "source texts by title, not file names")."""

import json
import re
from pathlib import Path

import pytest

from llminfra.ledger.claim import SOURCES

ROOT = Path(__file__).resolve().parents[1]
FILE_NAME = re.compile(r"\b\d{3}_[0-9a-f]{16}\.txt\b")
LEARNER_FILES = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("exercises/*.ipynb"),
                        *ROOT.glob("solutions/*.ipynb"), ROOT / "README.md",
                        *ROOT.glob("docs/*.md")])


@pytest.mark.parametrize("path", LEARNER_FILES, ids=lambda p: p.name)
def test_no_source_file_name_in_what_learners_read(path):
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = path.read_text()
    assert not FILE_NAME.findall(text), f"{path.name} names a source by its file name"


def test_the_file_names_are_what_the_pattern_finds():
    """The check above would see the real names (it cannot pass by matching nothing)."""
    assert all(FILE_NAME.fullmatch(name) for name, _ in SOURCES.values())
