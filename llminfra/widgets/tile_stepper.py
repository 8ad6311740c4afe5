"""The tile stepper: walk through tiled attention one tile at a time (chapter 06).

A slider picks the step; an Image shows the tile grid and the slow-memory byte counters
(:func:`llminfra.plots.attention.tile_grid_figure`), and an HTML table shows, for the rows of
the current query block, the running max ``m_i``, the running sum ``l_i`` and the first values
of the partial output ``O_i`` (Dao et al. 2022, arXiv:2205.14135, Algorithm 1), with the bytes
read and written so far and the bytes the tile holds in fast memory. Thin wiring over
:func:`llminfra.attention.tile_trace.tile_trace`.
"""

from __future__ import annotations

import ipywidgets as widgets
import torch

from llminfra.attention.tile_trace import TileTrace, tile_trace
from llminfra.plots.attention import tile_grid_png
from llminfra.widgets.panel import Panel, natural_size

#: each cell's alignment, and room on either side of it: a widget's HTML gets none of
#: JupyterLab's table style, so without padding a column's numbers run into the next one's
_PAD = "padding:0.1em 0.75em"
_LEFT, _RIGHT = f"style='text-align:left;{_PAD}'", f"style='text-align:right;{_PAD}'"
#: a header cell: the same, ruled off from the numbers below it
_RULE = "border-bottom:1px solid #bdbdbd"
_LEFT_HEAD = f"style='text-align:left;{_PAD};{_RULE}'"
_RIGHT_HEAD = f"style='text-align:right;{_PAD};{_RULE}'"


def step_html(trace: TileTrace, step: int) -> str:
    """The numbers of one step as an HTML table (4 significant digits): each cell says its
    alignment and padding (the widget's HTML gets no table style of JupyterLab's), numbers
    right, the three output values (a list) left, the header row ruled off below."""
    s = trace.steps[step]
    rows = "".join(
        f"<tr><td {_RIGHT}>{i}</td><td {_RIGHT}>{s.m[i].item():.4g}</td>"
        f"<td {_RIGHT}>{s.l[i].item():.4g}</td>"
        f"<td {_LEFT}>{', '.join(f'{x:.3g}' for x in s.O[i, :3].tolist())}</td></tr>"
        for i in range(s.i0, s.i1))
    return (f"<b>step {step + 1} of {len(trace.steps)}</b>: query rows {s.i0}–{s.i1 - 1} × "
            f"keys {s.j0}–{s.j1 - 1}<br>"
            f"slow memory so far: {s.slow_read_bytes:,} B read, {s.slow_write_bytes:,} B written "
            f"(naive total: {trace.naive_slow_bytes:,} B); fast memory for this tile: "
            f"{s.fast_bytes:,} B (naive score matrix: {trace.naive_peak_scores_bytes:,} B)"
            f"<table><tr><th {_RIGHT_HEAD}>row i</th><th {_RIGHT_HEAD}>m_i (running max)</th>"
            f"<th {_RIGHT_HEAD}>l_i (running sum)</th>"
            f"<th {_LEFT_HEAD}>O_i[:3] (partial output)</th></tr>"
            f"{rows}</table>")


def tile_stepper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                 block_q: int = 4, block_k: int = 4) -> tuple[widgets.VBox, widgets.IntSlider,
                                                              widgets.HTML]:
    """Build the stepper for one head (q ``(T, d)``, k/v ``(S, d)``).

    Returns ``(box, slider, html)``: display ``box``; set ``slider.value`` to move (the
    ``observe`` callback redraws the image and rewrites ``html.value``). The slider counts tiles
    from 1, as the figure's title and the table do: ``slider.value = n`` shows step ``n`` of
    ``len(trace.steps)``.
    """
    trace = tile_trace(q, k, v, causal, block_q, block_k)
    slider = widgets.IntSlider(value=1, min=1, max=len(trace.steps), description="tile",
                               continuous_update=False)
    image = natural_size(widgets.Image(format="png", value=tile_grid_png(trace, 0)))
    html = widgets.HTML(value=step_html(trace, 0))

    def update(change):
        image.value = tile_grid_png(trace, change["new"] - 1)
        html.value = step_html(trace, change["new"] - 1)

    slider.observe(update, names="value")
    box = Panel([slider, image, html], title="Tile stepper (tiled attention)",
                how="move the tile slider; the tile grid, running max / sum / output and the "
                    "bytes moved")
    return box, slider, html
