"""The memory calculator's figure: one stacked bar of weights / KV cache / activations against
the card's memory (the whole card and what is usable after the runtime reserve).

The data comes from :func:`llminfra.widgets.memory_calculator.memory_breakdown` (a plain dict of
bytes), so the figure can be drawn in a notebook cell (pass ``ax``) or off-screen for the widget
(:func:`memory_bar_png`, Agg canvas, no pyplot state). Sizes are plotted in GB (1e9 bytes) and
the annotations give GiB (2**30 bytes) too.

Taught in chapter 02 (``notebooks/02_gpu_memory.ipynb``).
"""

from __future__ import annotations

import io

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import ScaledTranslation

#: (key in the breakdown, label, colour) of each stacked part, bottom to top
PARTS = (
    ("weight_bytes", "weights", "#7f7f7f"),
    ("kv_bytes", "KV cache", "#d62728"),
    ("activation_bytes", "activations", "#ffbf00"),
)


def plot_memory_bar(data: dict, ax: Axes) -> Axes:
    """Draw one horizontal stacked bar (weights, KV cache, activations, in GB) on ``ax``, with
    the card's memory and its usable part as vertical lines; the title says whether it fits.

    ``data`` holds at least ``weight_bytes``, ``kv_bytes``, ``activation_bytes``,
    ``total_bytes``, ``gpu_memory_bytes``, ``usable_bytes``, ``fits``, ``model``, ``gpu``,
    ``gpu_confidence`` (as :func:`~llminfra.widgets.memory_calculator.memory_breakdown` returns).
    """
    left = 0.0
    for key, label, colour in PARTS:
        width = data[key] / 1e9
        ax.barh([0], [width], left=left, color=colour, label=f"{label} {width:.3g} GB")
        left += width
    card, usable = data["gpu_memory_bytes"] / 1e9, data["usable_bytes"] / 1e9
    ax.axvline(card, color="black", lw=2, label=f"{data['gpu']} {card:.3g} GB")
    ax.axvline(usable, color="black", lw=1, ls="--",
               label=f"usable {usable:.3g} GB ({data['reserve_fraction']:.0%} reserve)")
    ax.set_xlim(0, max(card, data["total_bytes"] / 1e9) * 1.05)
    ax.set_yticks([])
    ax.set_xlabel("GB (1e9 bytes)")
    verdict = "fits" if data["fits"] else "does NOT fit"
    ax.set_title(f"{data['model']} on {data['gpu']} [{data['gpu_confidence']}]: "
                 f"{data['total_bytes'] / 1e9:.3g} GB = {data['total_bytes'] / 2**30:.3g} GiB, "
                 f"{verdict}", fontsize=9)
    # below the x label, half an inch under the axes whatever the figure's size
    below = ax.transAxes + ScaledTranslation(0, -0.5, ax.figure.dpi_scale_trans)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below, ncol=3,
              fontsize=8, frameon=False)
    return ax


def memory_bar_png(data: dict, width_in: float = 7.0, height_in: float = 2.6, dpi: int = 80) -> bytes:
    """The bar of :func:`plot_memory_bar` rendered off-screen (Agg canvas) as PNG bytes.

    Uses a bare :class:`matplotlib.figure.Figure` (never registered with pyplot), so nothing is
    shown inline and nothing stays open after the bytes are returned.
    """
    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    plot_memory_bar(data, ax)
    fig.subplots_adjust(left=0.03, right=0.97, top=0.86, bottom=0.5)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    fig.clear()
    return buf.getvalue()
