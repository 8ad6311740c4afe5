"""Figures for chapter 06 (FlashAttention): the tile grid of the stepper, memory and time vs N
from the attention bench, and bytes moved vs Theorem 2 of Dao et al. 2022 (arXiv:2205.14135).

The stepper's picture is drawn off-screen (:func:`tile_grid_figure`, :func:`tile_grid_png`);
the chapter's three plots are pyplot figures it shows with ``plt.show()``. Every text is at
least :data:`~llminfra.plots.labels.MIN_FONT_PT`; legends with more than three entries sit
right of the axes, where they cover no measured point.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, NullLocator

from llminfra.attention.tile_trace import TileTrace
from llminfra.plots.labels import MIN_FONT_PT
from llminfra.plots.offscreen import offscreen_figure, png_bytes

_COLORS = {"naive": "tab:red", "flash": "tab:blue", "sdpa": "tab:green"}
#: each method's name in a legend (the bench's keys are naive / flash / sdpa)
_NAMES = {"naive": "naive", "flash": "tiled", "sdpa": "SDPA"}


def tile_grid_figure(trace: TileTrace, step: int) -> Figure:
    """Left: the T x S score matrix cut into tiles — done (light), current (dark), skipped by
    the causal mask (hatched), to come (white). Right: bytes moved to/from slow memory so far by
    the tiled run against the naive run's total."""
    s = trace.steps[step]
    done = {(t.i0, t.j0) for t in trace.steps[:step]}
    computed = {(t.i0, t.j0) for t in trace.steps}
    fig = offscreen_figure(8.0, 3.4)
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    for i0 in range(0, trace.T, trace.block_q):
        for j0 in range(0, trace.S, trace.block_k):
            h, w = min(trace.block_q, trace.T - i0), min(trace.block_k, trace.S - j0)
            if (i0, j0) == (s.i0, s.j0):
                style = {"facecolor": "tab:blue"}
            elif (i0, j0) in done:
                style = {"facecolor": "lightsteelblue"}
            elif (i0, j0) not in computed:
                style = {"facecolor": "0.9", "hatch": "//"}
            else:
                style = {"facecolor": "white"}
            ax.add_patch(Rectangle((j0, i0), w, h, edgecolor="0.3", **style))
    ax.set_xlim(0, trace.S)
    ax.set_ylim(trace.T, 0)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_title(f"tile {step + 1}/{len(trace.steps)}: rows {s.i0}-{s.i1 - 1}, "
                 f"keys {s.j0}-{s.j1 - 1}")
    read_kb, write_kb = s.slow_read_bytes / 1e3, s.slow_write_bytes / 1e3
    bx.bar(["tiled\nso far"], [read_kb], color="tab:blue", label="read")
    bx.bar(["tiled\nso far"], [write_kb], bottom=[read_kb], color="lightsteelblue", label="written")
    bx.bar(["naive\ntotal"], [trace.naive_slow_bytes / 1e3], color="tab:red")
    bx.set_ylabel("slow-memory traffic (kB)")
    bx.legend(loc="upper left", fontsize=MIN_FONT_PT)
    fig.tight_layout()
    return fig


def tile_grid_png(trace: TileTrace, step: int) -> bytes:
    """:func:`tile_grid_figure` as PNG bytes (the stepper's ``Image``; nothing left open)."""
    return png_bytes(tile_grid_figure(trace, step))


def _legend_right(ax, ncol: int = 1) -> None:
    """The legend right of the axes (it covers no point), in the course's smallest font."""
    ax.legend(fontsize=MIN_FONT_PT, ncol=ncol, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)


def _ticks_at(ax, Ns) -> None:
    """x ticks at the measured N, written out (not 2×10²), no minor ticks."""
    Ns = sorted(set(Ns))
    ax.set_xticks(Ns, [f"{n:,}" for n in Ns])
    ax.xaxis.set_minor_locator(NullLocator())


def _plain_y(ax) -> None:
    """Log-scale y ticks written as plain numbers (0.5, 2, 20), not powers of ten."""
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))


def _by_causal(rows: list[dict], causal: bool) -> list[dict]:
    return sorted((r for r in rows if r["causal"] == causal), key=lambda r: r["N"])


def memory_vs_n_figure(rows: list[dict], causal: bool = False) -> Figure:
    """Measured peak extra memory of each method vs N (log-log): naive grows as N², tiled and
    SDPA as N."""
    rows = _by_causal(rows, causal)
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    Ns = [r["N"] for r in rows]
    for name, color in _COLORS.items():
        ax.loglog(Ns, [r[f"{name}_peak_bytes"] / 1e6 for r in rows], "o-", color=color,
                  label=_NAMES[name])
    _ticks_at(ax, Ns)
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("measured peak memory (MB)")
    _plain_y(ax)
    ax.set_title(f"peak memory of one attention call ({'causal' if causal else 'non-causal'})")
    ax.legend(fontsize=MIN_FONT_PT, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def time_vs_n_figure(rows: list[dict]) -> Figure:
    """Best wall time of each method vs N in ms, non-causal (solid) and causal (dashed),
    log-log, ticks at the measured N."""
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    for causal, style in ((False, "o-"), (True, "s--")):
        sub = _by_causal(rows, causal)
        for name, color in _COLORS.items():
            ax.loglog([r["N"] for r in sub], [1e3 * r[f"{name}_s"] for r in sub], style, color=color,
                      label=f"{_NAMES[name]}{', causal' if causal else ''}")
    _ticks_at(ax, [r["N"] for r in rows])
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("best time (ms)")
    _plain_y(ax)
    ax.set_title("time of one attention call (CPU)")
    _legend_right(ax)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def io_figure(rows: list[dict]) -> Figure:
    """Counted slow-memory bytes vs N: naive, and tiled for each fast-memory size M, with the
    Theorem 2 terms (scaled by their fitted constants) as dotted lines."""
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    Ms = sorted({r["sram_elements"] for r in rows})
    naive = sorted({(r["N"], r["naive_bytes"], r["naive_formula_bytes"]) for r in rows})
    ax.loglog([n for n, _, _ in naive], [b for _, b, _ in naive], "o-", color="tab:red",
              label="naive (counted)")
    for M in Ms:
        sub = sorted((r for r in rows if r["sram_elements"] == M), key=lambda r: r["N"])
        line, = ax.loglog([r["N"] for r in sub], [r["flash_bytes"] for r in sub], "o-",
                          label=f"tiled, M = {M:,} elements")
        c = sub[-1]["flash_ratio"]
        ax.loglog([r["N"] for r in sub], [c * r["flash_formula_bytes"] for r in sub], ":",
                  color=line.get_color())
    _ticks_at(ax, [r["N"] for r in rows])
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("bytes moved to/from slow memory")
    ax.set_title("IO: counted (solid) vs Theorem 2's N²d²/M (dotted)")
    _legend_right(ax)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
