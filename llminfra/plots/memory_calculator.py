"""The memory calculator's figure: one stacked bar of weights / KV cache / activations against
the card's memory (the whole card and what is usable after the runtime reserve).

The data comes from :func:`llminfra.widgets.memory_calculator.memory_breakdown` (a plain dict of
bytes), so the figure can be drawn in a notebook cell (pass ``ax``) or off-screen for the widget
(:func:`memory_bar_figure` / :func:`memory_bar_png`, Agg canvas, no pyplot state). Sizes are
plotted in GB (1e9 bytes) and the annotations give GiB (2**30 bytes) too, written as people
write them (``1,342 GB``, never ``1.34e+03``); every text is at least
:data:`~llminfra.plots.labels.MIN_FONT_PT`.

Taught in chapter 02 (``notebooks/02_gpu_memory.ipynb``).
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.transforms import ScaledTranslation

from llminfra.plots.labels import MIN_FONT_PT
from llminfra.plots.offscreen import DPI, offscreen_figure, png_bytes
from llminfra.plots.table import format_number

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
        ax.barh([0], [width], left=left, color=colour, label=f"{label} {_gb(width)} GB")
        left += width
    card, usable = data["gpu_memory_bytes"] / 1e9, data["usable_bytes"] / 1e9
    ax.axvline(card, color="black", lw=2, label=f"{data['gpu']} {_gb(card)} GB")
    ax.axvline(usable, color="black", lw=1, ls="--",
               label=f"usable {_gb(usable)} GB ({data['reserve_fraction']:.0%} reserve)")
    ax.set_xlim(0, max(card, data["total_bytes"] / 1e9) * 1.05)
    ax.set_yticks([])
    ax.set_xlabel("GB (1e9 bytes)")
    verdict = "fits" if data["fits"] else "does NOT fit"
    ax.set_title(f"{data['model']} on {data['gpu']} [{data['gpu_confidence']}]: "
                 f"{_gb(data['total_bytes'] / 1e9)} GB = {_gb(data['total_bytes'] / 2**30)} GiB, "
                 f"{verdict}", fontsize=10)
    # below the x label, half an inch under the axes whatever the figure's size
    below = ax.transAxes + ScaledTranslation(0, -0.5, ax.figure.dpi_scale_trans)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below, ncol=3,
              fontsize=MIN_FONT_PT, frameon=False)
    return ax


def _gb(x: float) -> str:
    """A size to 3 significant digits, grouped from 1,000 up: ``13.4``, ``1,342``."""
    return format_number(x, 3 if x < 1000 else 4)


def memory_bar_figure(data: dict, width_in: float = 7.0, height_in: float = 2.6,
                      dpi: int = DPI) -> Figure:
    """The bar of :func:`plot_memory_bar` on an off-screen Figure (never registered with
    pyplot: nothing is shown inline, nothing stays open), laid out for the widget: the title
    above, the legend's two rows below the x label."""
    fig = offscreen_figure(width_in, height_in, dpi)
    plot_memory_bar(data, fig.add_subplot(1, 1, 1))
    fig.subplots_adjust(left=0.03, right=0.97, top=0.86, bottom=0.5)
    return fig


def memory_bar_png(data: dict, width_in: float = 7.0, height_in: float = 2.6,
                   dpi: int = DPI) -> bytes:
    """:func:`memory_bar_figure` as PNG bytes (for the calculator's ``Image``)."""
    return png_bytes(memory_bar_figure(data, width_in, height_in, dpi))
