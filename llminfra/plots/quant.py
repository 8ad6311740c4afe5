"""Figures of chapter 03: the rounding error of a quantized tensor, the levels of 4-bit formats,
and bytes per parameter against error for a set of schemes.

Each ``plot_*`` draws on an ``ax`` given by the notebook; :func:`error_histogram_figure` /
:func:`error_histogram_png` draw off-screen (no pyplot state) for the quantizer widget.
"""

from __future__ import annotations

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from llminfra.plots.labels import MIN_FONT_PT
from llminfra.plots.offscreen import offscreen_figure, png_bytes


def plot_error_histogram(w: torch.Tensor, w_hat: torch.Tensor, ax: Axes, title: str = "") -> Axes:
    """Histogram of the rounding errors ``ŵ - w`` (in units of ``std(w)``), 80 bins."""
    err = ((w_hat - w).float() / w.float().std().clamp_min(1e-30)).flatten()
    ax.hist(err.numpy(), bins=80, color="#1f77b4")
    ax.set_xlabel("rounding error ŵ - w, in units of std(w)")
    ax.set_ylabel("weights")
    ax.set_title(title, fontsize=10)
    return ax


def error_histogram_figure(w: torch.Tensor, w_hat: torch.Tensor, title: str = "") -> Figure:
    """:func:`plot_error_histogram` on an off-screen 6 × 2.6 in Figure."""
    fig = offscreen_figure(6.0, 2.6)
    plot_error_histogram(w, w_hat, fig.add_subplot(1, 1, 1), title)
    fig.tight_layout()
    return fig


def error_histogram_png(w: torch.Tensor, w_hat: torch.Tensor, title: str = "") -> bytes:
    """:func:`error_histogram_figure` as PNG bytes (for an ``ipywidgets.Image``)."""
    return png_bytes(error_histogram_figure(w, w_hat, title))


def plot_levels(levels: dict[str, torch.Tensor], ax: Axes) -> Axes:
    """Each format's representable values in ``[-1, 1]`` as a row of ticks (``levels``: name ->
    1-D tensor of values, already scaled to ``[-1, 1]``)."""
    for row, (name, v) in enumerate(levels.items()):
        ax.plot(v.numpy(), [row] * v.numel(), "|", markersize=14, label=name)
    ax.set_yticks(range(len(levels)), list(levels))
    ax.set_xlabel("value (scaled so the largest level is 1)")
    ax.set_ylim(-0.7, len(levels) - 0.3)
    return ax


#: marker per scheme in :func:`plot_bytes_vs_error` (cycled); GPTQ / AWQ points are filled red
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "*", "h", "p")


def plot_bytes_vs_error(rows: dict[str, dict], ax: Axes, key: str = "layer_rel_error") -> Axes:
    """Scatter of ``bytes_per_param`` against ``rows[scheme][key]`` (in %, log scale): one
    marker per scheme, named in a legend beside the axes (schemes of equal size, such as
    ``int4-g128`` and ``gptq-int4-g128``, sit on one vertical line, so in-plot labels would
    collide). GPTQ / AWQ in red, round-to-nearest in blue; y ticks in plain per cent."""
    for i, (name, r) in enumerate(rows.items()):
        learned = "gptq" in name or "awq" in name
        ax.scatter(r["bytes_per_param"], 100 * r[key], marker=MARKERS[i % len(MARKERS)], s=36,
                   color="#d62728" if learned else "#1f77b4",
                   label=f"{name}: {r['bytes_per_param']:.3g} B/param, {100 * r[key]:.3g} %")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))
    ax.set_xlabel("bytes per parameter (scales included)")
    ax.set_ylabel("layer output error (%)")
    ax.legend(fontsize=MIN_FONT_PT, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False,
              title="scheme (red: GPTQ / AWQ)", title_fontsize=MIN_FONT_PT)
    return ax
