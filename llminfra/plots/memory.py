"""Figures for chapters 01 and 02: memory as stacked bars, a card's memory split into shares,
and decode's FLOPs per byte.

The functions take plain dicts of bytes (from :mod:`llminfra.calc.memory` or
:mod:`llminfra.calc.measured`) and draw on a given ``ax`` (a new figure when ``ax`` is None);
they return the ``Axes`` and never call ``plt.show()``, which the notebook does. Sizes are
plotted in GB (1e9 bytes) or GiB (2**30 bytes), said on the axis. Every text is at least
:data:`~llminfra.plots.labels.MIN_FONT_PT`.

Taught in chapter 01 (``notebooks/01_training_vs_inference``) and chapter 02.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, NullLocator, PercentFormatter

from llminfra.plots.labels import MIN_FONT_PT
from llminfra.plots.table import format_number

#: colour of each memory part, by the names the calculators use
PART_COLOURS = {
    "weights": "#7f7f7f", "parameters": "#7f7f7f", "gradients": "#1f77b4",
    "master_weights": "#9467bd", "optimizer_states": "#2ca02c", "activations": "#ffbf00",
    "kv_cache": "#d62728", "logits": "#ff7f0e", "other": "#c7c7c7",
    "KV cache": "#d62728",
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
        text = format_number(total, 4 if total >= 1000 else 3)
        if horizontal:
            ax.annotate(f" {text}", (total, x), va="center", fontsize=MIN_FONT_PT)
        else:
            ax.annotate(text, (x, total), ha="center", va="bottom", fontsize=MIN_FONT_PT)
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
    ax.legend(fontsize=MIN_FONT_PT, loc="best")
    return ax


def plot_card_shares(shares: Mapping[str, Mapping[str, float]], ax: Axes,
                     xlabel: str = "share of the card's memory",
                     colours: Mapping[str, str] | None = None) -> Axes:
    """One horizontal bar per entry of ``shares`` (label -> {part: share of the card, 0..1}),
    the first entry on top, parts side by side in the order given, each part one colour across
    bars (``colours``, else :data:`PART_COLOURS`), each part's share written on it (``65%``); a
    part too thin for its label (under 4 %) has it just right of its end. The legend sits above
    the axes, in one row. Chapter 02 compares vLLM's Fig. 1 (Kwon et al., 2023,
    arXiv:2309.06180) with the memory model's split."""
    colours = {**PART_COLOURS, **(colours or {})}
    labels = list(shares)
    parts: list[str] = []
    for bar in shares.values():
        parts += [p for p in bar if p not in parts]
    for i, label in enumerate(labels):
        left = 0.0
        for j, part in enumerate(parts):
            share = shares[label].get(part, 0.0)
            ax.barh(i, share, left=left, color=colours.get(part, f"C{j}"),
                    label=part if i == 0 else None)
            if share >= 0.04:                     # about 20 px at 7 in: room for "65%"
                ax.text(left + share / 2, i, f"{share:.0%}", ha="center", va="center",
                        fontsize=MIN_FONT_PT)
            elif share > 0:
                ax.annotate(f"{share:.0%}", (left + share, i), xytext=(3, 0),
                            textcoords="offset points", ha="left", va="center",
                            fontsize=MIN_FONT_PT)
            left += share
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(0, 1.07 * max(1.0, *(sum(b.values()) for b in shares.values())))
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(xlabel)
    ax.legend(ncol=len(parts), fontsize=MIN_FONT_PT, loc="lower center",
              bbox_to_anchor=(0.5, 1.0), frameon=False)
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
    ax.legend(fontsize=MIN_FONT_PT)
    return ax
