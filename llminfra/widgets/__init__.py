"""ipywidgets panels: thin wiring over pure functions that return data or figures.

Import each panel from its own module (``from llminfra.widgets.memory_calculator import
MemoryCalculator``), so that importing this package stays cheap.
"""
