"""Figures for chapters 01 and 02: memory as stacked bars, and decode's FLOPs per byte.

The functions take plain dicts of bytes (from :mod:`llminfra.calc.memory` or
:mod:`llminfra.calc.measured`) and draw on a given ``ax`` (a new figure when ``ax`` is None);
they return the ``Axes`` and never call ``plt.show()``, which the notebook does. Sizes are
plotted in GB (1e9 bytes) or GiB (2**30 bytes), said on the axis.

Taught in chapter 01 (``notebooks/01_training_vs_inference``) and chapter 02.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, NullLocator

#: colour of each memory part, by the names the calculators use
PART_COLOURS = {
    "weights": "#7f7f7f", "parameters": "#7f7f7f", "gradients": "#1f77b4",
    "master_weights": "#9467bd", "optimizer_states": "#2ca02c", "activations": "#ffbf00",
    "kv_cache": "#d62728", "logits": "#ff7f0e", "other": "#c7c7c7",
}

#: unit name -> bytes per unit
UNITS = {"GB": 1e9, "GiB": 2**30, "MB": 1e6, "MiB": 2**20}


def _unit(unit: str) -> float:
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; allowed: {', '.join(UNITS)}")
    return UNITS[unit]


def stacked_memory_bars(bars: Mapping[str, Mapping[str, float]], unit: str = "GB",
                        ax: Axes | None = None, title: str | None = None,
                        limit_bytes: float | None = None, limit_label: str = "GPU memory",
                        horizontal: bool = False) -> Axes:
    """One stacked bar per entry of ``bars`` (label -> {part: bytes}), parts stacked in the
    order they first appear, each part one colour across bars (:data:`PART_COLOURS`); a dashed
    line at ``limit_bytes`` (e.g. a card's memory). Bar totals are written on top in ``unit``.
    """
    scale = _unit(unit)
    if ax is None:
        _, ax = plt.subplots()
    parts: list[str] = []
    for bar in bars.values():
        parts += [p for p in bar if p not in parts and p != "total"]
    labels = list(bars)
    bottoms = [0.0] * len(labels)
    draw = ax.barh if horizontal else ax.bar
    for i, part in enumerate(parts):
        values = [bars[lab].get(part, 0) / scale for lab in labels]
        colour = PART_COLOURS.get(part, f"C{i}")
        kw = {"left": bottoms} if horizontal else {"bottom": bottoms}
        draw(labels, values, label=part.replace("_", " "), color=colour, **kw)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for x, total in enumerate(bottoms):
        text = f"{total:.4g}" if total >= 1000 else f"{total:.3g}"
        if horizontal:
            ax.annotate(f" {text}", (total, x), va="center", fontsize=8)
        else:
            ax.annotate(text, (x, total), ha="center", va="bottom", fontsize=8)
    # headroom for the totals written past the longest bar (text is not autoscaled)
    top = max(bottoms, default=0.0) * 1.12
    if limit_bytes is not None:
        top = max(top, limit_bytes / scale * 1.05)
    (ax.set_xlim if horizontal else ax.set_ylim)(0, top or 1.0)
    if limit_bytes is not None:
        line = ax.axvline if horizontal else ax.axhline
        line(limit_bytes / scale, color="k", ls="--", lw=1, label=limit_label)
    (ax.set_xlabel if horizontal else ax.set_ylabel)(f"memory ({unit})")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="best")
    return ax


def intensity_vs_batch(batches: Sequence[int], intensities: Sequence[float],
                       ridges: Mapping[str, float], ax: Axes | None = None,
                       label: str = "decode step") -> Axes:
    """FLOPs per byte of a decode step against the batch (log-log), with each GPU's ridge
    point (peak FLOP/s ÷ bandwidth, Williams et al., 2009) as a horizontal line: below its
    line a step is memory-bound on that GPU."""
    if len(batches) != len(intensities):
        raise ValueError(f"{len(batches)} batches but {len(intensities)} intensities")
    if ax is None:
        _, ax = plt.subplots()
    ax.loglog(batches, intensities, "o-", label=label)
    for i, (name, ridge) in enumerate(ridges.items()):
        ax.axhline(ridge, color=f"C{i + 1}", ls="--", lw=1, label=f"{name} ridge: {ridge:.0f}")
    ax.set_xticks(list(batches), [str(b) for b in batches])  # ticks at the computed batches
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_xlabel("batch (sequences decoded together)")
    ax.set_ylabel("FLOPs per byte read")
    ax.legend(fontsize=8)
    return ax
