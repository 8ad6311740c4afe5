"""Speculative decoding explorer: move α (the acceptance rate) and the step's cost, see what
each γ yields and which one the adaptive rule picks (chapter 05)."""

from __future__ import annotations

import ipywidgets as widgets

from llminfra.engine.spec_decode import (choose_gamma, expected_tokens_per_step,
                                         predicted_speedup)
from llminfra.plots.spec_decode import spec_speedup_png
from llminfra.widgets.panel import Panel, natural_size


def summary_html(alpha: float, cost_per_draft: float, cost_fixed: float,
                 gamma_max: int) -> str:
    """The adaptive rule's pick and what it predicts, as one line of HTML."""
    g = choose_gamma(alpha, gamma_max, cost_per_draft, cost_fixed)
    return (f"α = {alpha:.2f}: the rule picks <b>γ = {g}</b> — "
            f"{expected_tokens_per_step(alpha, g):.3g} tokens per step, predicted speedup "
            f"<b>{predicted_speedup(alpha, g, cost_per_draft, cost_fixed):.3g}×</b>"
            + (" (no γ beats plain decoding: it does not speculate)" if g == 0 else ""))


def spec_explorer(alpha: float = 0.8, cost_per_draft: float = 0.05, cost_fixed: float = 0.9,
                  gamma_max: int = 8) -> tuple[Panel, dict, widgets.HTML]:
    """``(panel, sliders, html)``: display ``panel``; ``sliders`` holds ``alpha``,
    ``cost_fixed`` and ``cost_per_draft`` (set ``.value`` to move one; the figure and ``html``
    follow)."""
    sliders = {
        "alpha": widgets.FloatSlider(value=alpha, min=0.0, max=1.0, step=0.01,
                                     description="α", continuous_update=False),
        "cost_fixed": widgets.FloatSlider(value=cost_fixed, min=0.0, max=2.0, step=0.05,
                                          description="c₀", continuous_update=False),
        "cost_per_draft": widgets.FloatSlider(value=cost_per_draft, min=0.0, max=1.0,
                                              step=0.01, description="c", continuous_update=False),
    }

    def values():
        return (sliders["alpha"].value, sliders["cost_per_draft"].value,
                sliders["cost_fixed"].value, gamma_max)

    image = natural_size(widgets.Image(format="png", value=spec_speedup_png(*values())))
    html = widgets.HTML(value=summary_html(*values()))

    def update(_change):
        image.value = spec_speedup_png(*values())
        html.value = summary_html(*values())

    for s in sliders.values():
        s.observe(update, names="value")
    panel = Panel([widgets.HBox(list(sliders.values())), image, html],
                  title="Speculative decoding: γ against α and the step cost",
                  how="move α (acceptance), c₀ (fixed cost of verifying) and c (cost per draft)")
    return panel, sliders, html
