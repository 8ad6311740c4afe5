"""Figures for chapter 09: monthly cost against volume (API vs rented vs owned GPUs), and the
price of a token against how busy the GPUs are.

Data comes from :mod:`llminfra.calc.cost` and :mod:`llminfra.calc.deployment`; each function
draws on a given ``ax`` (a new figure when ``ax`` is None), returns the ``Axes`` and never calls
``plt.show()``. Money is in USD, volumes in millions of tokens (input + output) per month,
written as people write them (``43,020``, never ``4.302e+04``); every text is at least
:data:`~llminfra.plots.labels.MIN_FONT_PT`.

Taught in chapter 09 (``notebooks/09_deployment_and_cost.ipynb``).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from llminfra.calc.cost import break_even_tokens_per_month, selfhost_cost_per_million_tokens
from llminfra.calc.deployment import Prices, monthly_cost_curves
from llminfra.plots.labels import MIN_FONT_PT
from llminfra.plots.table import format_number

#: colour of each option, shared by the figures and the widget
OPTION_COLOURS = {"api": "#1f77b4", "rented": "#ff7f0e", "own": "#2ca02c", "local": "#7f7f7f"}


def monthly_cost_vs_volume(monthly_tokens: Sequence[float], prices: Prices, utilization: float,
                           ax: Axes | None = None) -> Axes:
    """Monthly cost of the API (a line through the origin) and of rented / owned GPUs (steps:
    whole replicas, paid busy or idle) against monthly volume, log-log, ticks at the volumes
    given. A dotted vertical line marks where one rented replica costs what the API costs
    (:func:`llminfra.calc.cost.break_even_tokens_per_month`)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    x = [v / 1e6 for v in monthly_tokens]
    lo, hi = min(monthly_tokens), max(monthly_tokens)
    if lo <= 0 or hi <= lo:
        raise ValueError(f"monthly_tokens must be positive and not all equal, got "
                         f"{list(monthly_tokens)!r}")
    grid = [lo * (hi / lo) ** (i / 399) for i in range(400)]   # dense: where the steps are
    curves = monthly_cost_curves(grid, prices, utilization)
    marks = monthly_cost_curves(monthly_tokens, prices, utilization)
    price = {k: format_number(v, 3) for k, v in (("api", prices.api_usd_per_million),
                                                  ("rented", prices.rent_usd_per_gpu_hour),
                                                  ("own", prices.own_usd_per_gpu_hour))}
    labels = {"api": f"hosted API ({price['api']} USD per M tokens)",
              "rented": f"rented GPUs ({price['rented']} USD/GPU-h)",
              "own": f"own GPUs ({price['own']} USD/GPU-h)"}
    for option, costs in curves.items():
        ax.plot([g / 1e6 for g in grid], costs, "-", color=OPTION_COLOURS[option],
                label=labels[option])
        ax.plot(x, marks[option], "o", ms=4, color=OPTION_COLOURS[option])
    replica_month = prices.gpus_per_replica * prices.rent_usd_per_gpu_hour * 24 * 30
    v = break_even_tokens_per_month(replica_month, prices.api_usd_per_million) / 1e6
    ax.axvline(v, color=OPTION_COLOURS["rented"], ls=":", lw=1)
    ax.annotate(f"API = one rented replica\nat {format_number(v)} M tokens/month",
                (v, curves["api"][0]), xytext=(6, 0), textcoords="offset points",
                fontsize=MIN_FONT_PT)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{t:,.0f}" if t >= 10 else f"{t:.3g}" for t in x], rotation=45,
                       fontsize=MIN_FONT_PT)
    ax.minorticks_off()
    ax.set_xlabel("volume (million tokens per month, input + output)")
    ax.set_ylabel("cost (USD per month)")
    ax.set_title(f"Monthly cost; self-hosted GPUs sized for {utilization:.0%} average load")
    ax.legend(fontsize=MIN_FONT_PT, loc="upper left")
    return ax


def cost_per_million_vs_utilization(gpu_hour_price_usd: float, tokens_per_s: float,
                                    utilizations: Sequence[float],
                                    api_usd_per_million: float | None = None,
                                    ax: Axes | None = None) -> Axes:
    """USD per million tokens on one GPU against the share of its hours it is busy
    (``P / (T · u · 3600) · 1e6``), ticks at the utilisations given, with the API's price as a
    horizontal line when given."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    costs = [selfhost_cost_per_million_tokens(gpu_hour_price_usd, tokens_per_s, u)
             for u in utilizations]
    ax.plot([u * 100 for u in utilizations], costs, "-o", color=OPTION_COLOURS["rented"],
            label=f"self-hosted: {format_number(gpu_hour_price_usd, 3)} USD/GPU-h, "
                  f"{format_number(tokens_per_s)} tokens/s")
    if api_usd_per_million is not None:
        ax.axhline(api_usd_per_million, color=OPTION_COLOURS["api"], ls="--",
                   label=f"hosted API: {format_number(api_usd_per_million, 3)} USD per M tokens")
    ax.set_xticks([u * 100 for u in utilizations])
    ax.set_yscale("log")
    ax.set_xlabel("utilisation (% of the GPU's hours it is busy)")
    ax.set_ylabel("cost (USD per million tokens)")
    ax.legend(fontsize=MIN_FONT_PT, loc="upper right")
    return ax
