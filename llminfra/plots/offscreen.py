"""Figures drawn off-screen for the widgets: a bare Agg :class:`~matplotlib.figure.Figure`
(never registered with pyplot, so nothing is shown twice or left open) and its PNG bytes.

Each widget picture has a ``*_figure`` function returning the Figure (what the tests check:
font sizes, overlaps, nothing cut at the edges) and a ``*_png`` function returning
:func:`png_bytes` of it (what an ``ipywidgets.Image`` shows).
"""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: the course's figure resolution (chapter 00's ``setup`` uses the same for inline figures)
DPI = 80


def offscreen_figure(width_in: float, height_in: float, dpi: int = DPI) -> Figure:
    """A Figure of that size with its own Agg canvas."""
    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """``fig`` as PNG bytes at its own size and resolution."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi)
    return buf.getvalue()
