"""Roofline figures (Williams, Waterman & Patterson, 2009, CACM 52(4)): attainable FLOP/s
``min(peak, I · bandwidth)`` against arithmetic intensity ``I`` (FLOP/byte), log-log, with
measured or computed steps placed on it.

The roofs are :class:`llminfra.calc.roofline.Roofline` values (a catalog GPU or a measured CPU);
a point is a dict with ``label``, ``intensity`` (FLOP/B) and ``flops_per_s`` (achieved, or the
bound's). :func:`roofline_figure` / :func:`roofline_png` draw off-screen for the chapter 08
widget. Chapter 08.
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from llminfra.calc.roofline import Roofline
from llminfra.plots.labels import MIN_FONT_PT, label_points
from llminfra.plots.offscreen import DPI, offscreen_figure, png_bytes

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _bandwidth(bytes_per_s: float) -> str:
    """``3.35 TB/s`` from 1 TB/s up, ``864 GB/s`` below (never ``3.35e+03 GB/s``)."""
    return (f"{bytes_per_s / 1e12:.3g} TB/s" if bytes_per_s >= 1e12
            else f"{bytes_per_s / 1e9:.3g} GB/s")


def _flops(flops_per_s: float) -> str:
    """``1,307 TFLOP/s`` and ``989 TFLOP/s`` from 1 TFLOP/s up, ``92.5 GFLOP/s`` below (never
    ``1.31e+03 TFLOP/s`` or ``0.0925 TFLOP/s``)."""
    t = flops_per_s / 1e12
    if t >= 1000:
        return f"{t:,.0f} TFLOP/s"
    return f"{t:.3g} TFLOP/s" if t >= 1 else f"{flops_per_s / 1e9:.3g} GFLOP/s"


def plot_roofline(roofs: list[Roofline], points: list[dict], ax: Axes,
                  intensity_range: tuple[float, float] | None = None) -> Axes:
    """Draw each roof (sloped memory part and flat compute part, ridge marked) and each point
    on ``ax``; axes in FLOP/byte and FLOP/s, log-log."""
    if not roofs:
        raise ValueError("plot_roofline needs at least one Roofline")
    xs = [p["intensity"] for p in points] + [r.ridge_flops_per_byte for r in roofs]
    lo, hi = intensity_range or (min(xs) / 4, max(xs) * 4)
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    for i, r in enumerate(roofs):
        c = COLOURS[i % len(COLOURS)]
        ax.plot(grid, np.minimum(r.peak_flops_per_s, grid * r.bytes_per_s), color=c,
                label=f"{r.name}: {_bandwidth(r.bytes_per_s)}, {_flops(r.peak_flops_per_s)}")
        ax.plot([r.ridge_flops_per_byte], [r.peak_flops_per_s], "|", color=c, markersize=12)
    for p in points:
        ax.plot(p["intensity"], p["flops_per_s"], p.get("marker", "o"),
                color=p.get("colour", "black"), markersize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("FLOP/s (attainable: min(peak, I · bandwidth))")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=MIN_FONT_PT, loc="lower right", framealpha=0.9)
    label_points(ax, [(p["intensity"], p["flops_per_s"], p["label"]) for p in points])
    return ax


def roofline_figure(roofs: list[Roofline], points: list[dict], width_in: float = 6.5,
                    height_in: float = 3.6, dpi: int = DPI) -> Figure:
    """:func:`plot_roofline` on an off-screen Figure."""
    fig = offscreen_figure(width_in, height_in, dpi)
    plot_roofline(roofs, points, fig.add_subplot(1, 1, 1))
    fig.tight_layout()
    return fig


def roofline_png(roofs: list[Roofline], points: list[dict], width_in: float = 6.5,
                 height_in: float = 3.6, dpi: int = DPI) -> bytes:
    """:func:`roofline_figure` as PNG bytes (for the chapter 08 widget)."""
    return png_bytes(roofline_figure(roofs, points, width_in, height_in, dpi))
