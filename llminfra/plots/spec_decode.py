"""Speculative decoding's formulas as a figure: tokens per step and speedup against γ."""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from llminfra.engine.spec_decode import (choose_gamma, expected_tokens_per_step,
                                         predicted_speedup)
from llminfra.plots.labels import MIN_FONT_PT
from llminfra.plots.offscreen import offscreen_figure, png_bytes


def plot_spec_speedup(ax: Axes, alpha: float, cost_per_draft: float, cost_fixed: float,
                      gamma_max: int = 8, measured: dict[int, float] | None = None) -> Axes:
    """E(α, γ) (bars) and the predicted speedup E / (1 + c₀ + γ·c) (line) for γ = 0 ..
    ``gamma_max``; the γ the adaptive rule picks is marked, ``measured`` ({γ: speedup})
    drawn as points."""
    gammas = list(range(gamma_max + 1))
    e = [expected_tokens_per_step(alpha, g) for g in gammas]
    s = [predicted_speedup(alpha, g, cost_per_draft, cost_fixed) for g in gammas]
    ax.bar(gammas, e, color="#c6dbef", label="tokens per step E(α, γ)")
    ax.plot(gammas, s, "o-", color="#08519c", label="predicted speedup")
    best = choose_gamma(alpha, gamma_max, cost_per_draft, cost_fixed)
    ax.plot([best], [s[best]], "*", markersize=16, color="#e6550d",
            label=f"adaptive rule: γ = {best}")
    if measured:
        ax.plot(list(measured), list(measured.values()), "s", color="#31a354",
                label="measured speedup")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("γ (drafts per step)")
    ax.set_ylabel("tokens / step, speedup")
    ax.set_title(f"α = {alpha:.2f}, step cost 1 + {cost_fixed:.2g} + {cost_per_draft:.2g}·γ",
                 fontsize=10)
    ax.set_xticks(gammas)
    ax.legend(fontsize=MIN_FONT_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def spec_speedup_figure(alpha: float, cost_per_draft: float, cost_fixed: float,
                        gamma_max: int = 8) -> Figure:
    """:func:`plot_spec_speedup` on an off-screen 7.4 × 3.2 in Figure (the widget's picture)."""
    fig = offscreen_figure(7.4, 3.2)
    plot_spec_speedup(fig.add_subplot(1, 1, 1), alpha, cost_per_draft, cost_fixed, gamma_max)
    fig.tight_layout()
    return fig


def spec_speedup_png(alpha: float, cost_per_draft: float, cost_fixed: float,
                     gamma_max: int = 8) -> bytes:
    """:func:`spec_speedup_figure` as PNG bytes."""
    return png_bytes(spec_speedup_figure(alpha, cost_per_draft, cost_fixed, gamma_max))
