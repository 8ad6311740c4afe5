"""The GPU catalog as a picture: memory capacity against memory bandwidth (chapter 08 §11).

Capacity decides what fits (chapter 02); bandwidth how fast a decode step reads it. Their
ratio, capacity / bandwidth, is the time to read the whole memory once — the shortest decode
step of a full card — and is constant along the dashed diagonals of the log-log plot.
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from llminfra.plots.labels import MIN_FONT_PT, label_points, merge_coincident
from llminfra.specs import get_gpu

#: marker colour by memory kind: stacked HBM, graphics GDDR, a Mac's unified LPDDR
KIND_COLOURS = {"HBM": "#1f77b4", "GDDR": "#ff7f0e", "LPDDR (unified)": "#2ca02c"}
#: the diagonals drawn: milliseconds to read the whole memory once
READ_ALL_MS = (10, 30, 100, 300)


def memory_kind(memory_type: str) -> str:
    """``"HBM3e"`` -> ``"HBM"``, ``"GDDR6X"`` -> ``"GDDR"``, ``"LPDDR5 unified"`` ->
    ``"LPDDR (unified)"`` (a key of :data:`KIND_COLOURS`)."""
    t = memory_type.upper()
    for kind, prefix in (("HBM", "HBM"), ("GDDR", "GDDR"), ("LPDDR (unified)", "LPDDR")):
        if t.startswith(prefix):
            return kind
    raise ValueError(f"unknown memory type {memory_type!r}")


def plot_capacity_bandwidth(gpus: list[str], ax: Axes) -> Axes:
    """One point per catalog GPU: memory (GiB, the driver's total where on record) against
    bandwidth (GB/s), log-log, coloured by memory kind, each named (GPUs at the same spot share
    a label); dashed diagonals at :data:`READ_ALL_MS` ms to read the whole memory."""
    pts = []
    for name in gpus:
        g = get_gpu(name)
        gib, gbs = g.memory_bytes / 2**30, g.bandwidth_gb_per_s
        pts.append((gib, gbs, name))
        ax.scatter(gib, gbs, s=30, zorder=3, color=KIND_COLOURS[memory_kind(g.memory_type)])
    x = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x.min() / 1.5, x.max() * 1.6)
    ax.set_ylim(y.min() / 1.6, y.max() * 1.6)
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    for ms in READ_ALL_MS:
        # GiB / (GB/s) = ms / 1e3  ->  GB/s = GiB * 2**30 / 1e9 / (ms / 1e3)
        slope = 2**30 / 1e9 / (ms / 1e3)
        gx = np.array([max(x0, y0 / slope), min(x1, y1 / slope)])
        if gx[0] < gx[1]:
            ax.plot(gx, slope * gx, ls="--", lw=0.8, color="#b0b0b0", zorder=1)
            ax.annotate(f"{ms} ms", (gx[1], slope * gx[1]), xytext=(-2, -2),
                        textcoords="offset points", ha="right", va="top",
                        fontsize=MIN_FONT_PT, color="#8c8c8c")
    label_points(ax, merge_coincident(pts, tol=0.03, log=(True, True)))
    ticks = [t for t in (12, 16, 24, 32, 48, 80, 128, 192, 256) if x0 <= t <= x1]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter("")
    yt = [t for t in (300, 500, 1000, 2000, 3000, 5000) if y0 <= t <= y1]
    ax.set_yticks(yt, [f"{t:,}" for t in yt])
    ax.yaxis.set_minor_formatter("")
    ax.set_xlabel("memory (GiB; driver total where on record)")
    ax.set_ylabel("memory bandwidth (GB/s)")
    ax.legend(handles=[Line2D([], [], marker="o", ls="", color=c, label=k)
                       for k, c in KIND_COLOURS.items()]
              + [Line2D([], [], ls="--", lw=0.8, color="#b0b0b0",
                        label="ms to read all memory once")],
              fontsize=MIN_FONT_PT, loc="upper left")
    return ax
