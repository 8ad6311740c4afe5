"""The glossary search widget of chapter 00: type in a box, see the matching terms as a table.

Thin wiring over :func:`llminfra.course.glossary.search` and
:func:`~llminfra.course.glossary.glossary_html`: the ``Text`` box's ``observe`` callback sets an
``HTML`` value (no printing), so it behaves the same in JupyterLab, in a test and under nbval.
English or Korean both work (``"KV"``, ``"프리필"``, ``"bubble"``).
"""

from __future__ import annotations

import ipywidgets as widgets

from llminfra.course.glossary import GLOSSARY, glossary_html, search
from llminfra.widgets.panel import Panel


class GlossarySearch:
    """``Text`` box -> filtered glossary table. Attributes: ``box`` (``Text``), ``table``
    (``HTML``), ``widget`` (display it), ``matches`` (the entries shown)."""

    def __init__(self, query: str = "", docs_href: str | None = "../docs/glossary.md"):
        self.docs_href = docs_href
        self.box = widgets.Text(value=query, placeholder="search: prefill, KV, 프리필 …",
                                description="search", continuous_update=True)
        self.count = widgets.Label()
        self.table = widgets.HTML()
        self.widget = Panel([widgets.HBox([self.box, self.count]), self.table],
                            title="Glossary search (English / 한국어)",
                            how="type part of a term in English or Korean; the table shows the "
                                "matching terms")
        self.box.observe(lambda change: self.update(), names="value")
        self.update()

    def update(self) -> list:
        """Filter for the box's text; refresh the table; return the matching entries."""
        self.matches = search(self.box.value)
        self.count.value = f"{len(self.matches)} of {len(GLOSSARY)} terms"
        self.table.value = glossary_html(self.matches, self.docs_href)
        return self.matches
