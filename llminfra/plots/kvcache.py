"""Figures of chapter 04: the block pool, where KV memory goes, what sharing saves.

* :func:`plot_block_pool` / :func:`block_pool_png` — one state of a paged workload: every
  physical block, who holds it, its reference count and how many of its slots hold tokens;
* :func:`plot_memory_split` — stacked bars of token / reserved / internal / external / free per
  design (the picture of Kwon et al., 2023, arXiv:2309.06180, Fig. 2, on our trace);
* :func:`plot_sharing` — copy-on-write savings against the paper's ranges (Fig. 15).

Functions take an ``Axes`` and return it; :func:`block_pool_figure` draws on an off-screen
Figure (:mod:`llminfra.plots.offscreen`), :func:`block_pool_png` returns its PNG.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from llminfra.plots.labels import MIN_FONT_PT
from llminfra.plots.offscreen import DPI, offscreen_figure, png_bytes

PART_COLOURS = {"token": "#2da44e", "reserved": "#d4a72c", "internal": "#cf222e",
                "external": "#8250df", "free": "#d0d7de"}
SEQ_COLOURS = ("#0969da", "#bf8700", "#1a7f37", "#8250df", "#cf222e", "#1b7c83", "#953800")


def plot_block_pool(state: dict, ax: Axes) -> Axes:
    """Draw ``state`` (see :func:`llminfra.widgets.block_table.replay`): a row of blocks,
    coloured by holder (grey = free), filled in proportion to the slots that hold tokens, with
    the holders' names and the reference count written inside."""
    n, B = state["num_blocks"], state["block_size"]
    names = sorted(state["tables"])
    colour = {s: SEQ_COLOURS[i % len(SEQ_COLOURS)] for i, s in enumerate(names)}
    for b in range(n):
        holders = state["holders"][b]
        ax.add_patch(Rectangle((b, 0), 0.92, 1, facecolor="white", edgecolor="#57606a"))
        if holders:
            fill = state["filled"][b] / B
            ax.add_patch(Rectangle((b, 0), 0.92, fill, facecolor=colour[holders[0]], alpha=0.55))
            ax.text(b + 0.46, 0.66, "+".join(holders), ha="center", va="center",
                    fontsize=MIN_FONT_PT)
            ax.text(b + 0.46, 0.3, f"ref {state['ref_counts'][b]}", ha="center", va="center",
                    fontsize=MIN_FONT_PT)
        ax.text(b + 0.46, -0.08, str(b), ha="center", va="top", fontsize=MIN_FONT_PT,
                color="#57606a")
    ax.set_xlim(-0.1, n)
    ax.set_ylim(-0.45, 1.05)
    ax.axis("off")
    ax.set_title(state["event"], fontsize=10)
    return ax


def block_pool_figure(state: dict, width_in: float = 7.0, height_in: float = 1.6,
                      dpi: int = DPI) -> Figure:
    """:func:`plot_block_pool` on an off-screen Figure."""
    fig = offscreen_figure(width_in, height_in, dpi)
    plot_block_pool(state, fig.add_subplot(1, 1, 1))
    fig.tight_layout()
    return fig


def block_pool_png(state: dict, width_in: float = 7.0, height_in: float = 1.6,
                   dpi: int = DPI) -> bytes:
    """:func:`block_pool_figure` as PNG bytes (for an ``ipywidgets.Image``)."""
    return png_bytes(block_pool_figure(state, width_in, height_in, dpi))


def plot_memory_split(fragmentation: dict, ax: Axes) -> Axes:
    """Stacked horizontal bars: the share of the KV budget in each part, one bar per design.

    ``fragmentation`` is the bench's ``"fragmentation"`` dict: design -> {part: share}.
    """
    designs = list(fragmentation)
    for i, d in enumerate(designs):
        left = 0.0
        for part, col in PART_COLOURS.items():
            w = fragmentation[d][part]
            ax.barh(i, w, left=left, color=col, label=part if i == 0 else None)
            left += w
    ax.set_yticks(range(len(designs)), designs)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the KV budget (time-averaged while requests wait)")
    ax.legend(ncol=5, fontsize=MIN_FONT_PT, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    return ax


def plot_sharing(result: dict, paper: dict, ax: Axes) -> Axes:
    """Measured copy-on-write savings by n / width, with the paper's Alpaca ranges shaded."""
    keys = list(result["parallel_sampling_saving"])
    xs = [int(k) for k in keys]
    ax.plot(xs, [result["parallel_sampling_saving"][k] for k in keys], "o-",
            label="parallel sampling (measured)")
    ax.plot(xs, [result["beam_search_saving"][k] for k in keys], "s-",
            label="beam search (measured)")
    lo, hi = paper["parallel_sampling_saving_alpaca"]
    ax.axhspan(lo, hi, color="C0", alpha=0.15, label="paper (Alpaca): parallel sampling")
    lo, hi = paper["beam_search_saving_alpaca"]
    ax.axhspan(lo, hi, color="C1", alpha=0.15, label="paper (Alpaca): beam search")
    ax.set_xticks(xs)
    ax.set_xlabel("samples n / beam width")
    ax.set_ylabel("memory saved")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=MIN_FONT_PT, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return ax
