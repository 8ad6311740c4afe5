"""Figures of chapter 11: the two all-to-alls of expert parallelism and the ring of ring attention.

:func:`plot_all_to_all` draws ``n`` ranks twice — the tokens each holds, and the experts each
keeps — with the dispatch (every rank sends each token to the ranks of its ``k`` experts) and
the combine (the outputs come back), one panel each; the arrows' widths follow the rows one
rank sends another (:func:`rows_between_ranks` counts them from a layer's routing).
:func:`plot_ring` draws ring attention's ``P`` ranks on a circle, each passing its K/V block to
the next, and beside it which block every rank holds at every step, greyed where a causal mask
(contiguous layout) leaves nothing to compute.

GShard (Lepikhin et al. 2020, arXiv:2006.16668, §3.2) for the all-to-alls; ring attention (Liu,
Zaharia & Abbeel 2023, arXiv:2310.01889, Fig. 2) for the ring. Every text is at least
:data:`~llminfra.plots.labels.MIN_FONT_PT`.
"""

from __future__ import annotations

import math

from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, Rectangle

from llminfra.plots.labels import MIN_FONT_PT

DISPATCH, COMBINE, BOX, SKIPPED = "#4c72b0", "#dd8452", "#e8eef7", "#d9d9d9"


def ring_schedule(ranks: int, causal: bool = True) -> list[list[tuple[int, bool]]]:
    """``schedule[s][r] = (block, computed)``: at step ``s`` rank ``r`` holds the K/V block of
    rank ``(r − s) mod P`` (each step it passes what it holds to rank ``r + 1``); under a causal
    mask with contiguous slices a block from a later rank (``block > r``) is all masked, so it
    is passed on but not computed."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an int >= 1, got {ranks!r}")
    return [[((r - s) % ranks, not causal or (r - s) % ranks <= r) for r in range(ranks)]
            for s in range(ranks)]


def rows_between_ranks(expert_ids, ranks: int, num_experts: int) -> list[list[int]]:
    """``rows[i][j]``: the (token, expert) assignments of rank ``i``'s tokens whose expert lives
    on rank ``j``, for ``expert_ids (N, k)`` with the ``N`` tokens split into ``ranks`` equal
    contiguous shares and experts ``j·E/n … (j+1)·E/n − 1`` on rank ``j``."""
    N = expert_ids.shape[0]
    if N % ranks or num_experts % ranks:
        raise ValueError(f"{N} tokens and {num_experts} experts must split evenly over "
                         f"{ranks} ranks")
    per_rank, experts_per_rank = N // ranks, num_experts // ranks
    rows = [[0] * ranks for _ in range(ranks)]
    for t, chosen in enumerate(expert_ids.tolist()):
        for e in chosen:
            rows[t // per_rank][e // experts_per_rank] += 1
    return rows


def _box(ax: Axes, x: float, y: float, w: float, h: float, text: str) -> None:
    ax.add_patch(Rectangle((x - w / 2, y - h / 2), w, h, facecolor=BOX, edgecolor="#333333"))
    ax.text(x, y, text, ha="center", va="center", fontsize=MIN_FONT_PT + 1)


def plot_all_to_all(ax_dispatch: Axes, ax_combine: Axes, rows_sent: list[list[int]],
                    experts_per_rank: int) -> tuple[Axes, Axes]:
    """``rows_sent[i][j]``: (token, expert) rows rank ``i`` sends rank ``j`` in the dispatch
    (the diagonal stays local: no arrow, its count written in the box). Left, all-to-all #1,
    the dispatch: from the ranks' tokens (top) to the ranks of their experts (bottom); right,
    all-to-all #2, the combine: the same rows back, as expert outputs. Arrow widths are
    proportional to the rows."""
    n = len(rows_sent)
    if n < 1 or any(len(row) != n for row in rows_sent):
        raise ValueError(f"rows_sent must be an n x n table, got {rows_sent!r}")
    biggest = max((v for i, row in enumerate(rows_sent) for j, v in enumerate(row) if i != j),
                  default=0) or 1
    top, bottom, w, h = 1.0, 0.0, 0.8, 0.3
    for ax, colour, title, down in ((ax_dispatch, DISPATCH, "all-to-all #1, dispatch: token "
                                     "rows to their experts' ranks", True),
                                    (ax_combine, COMBINE, "all-to-all #2, combine: expert "
                                     "outputs back", False)):
        for r in range(n):
            first = r * experts_per_rank
            experts = (f"experts {first}–{first + experts_per_rank - 1}"
                       if experts_per_rank > 1 else f"expert {first}")
            _box(ax, r, top, w, h, f"rank {r}\ntokens")
            _box(ax, r, bottom, w, h, f"rank {r}\n{experts}")
        for i in range(n):
            for j in range(n):
                if i == j or not rows_sent[i][j]:
                    continue
                a, b = (i, top - h / 2), (j, bottom + h / 2)
                ax.add_patch(FancyArrowPatch(a if down else b, b if down else a,
                                             arrowstyle="-|>", mutation_scale=10,
                                             lw=0.6 + 3.0 * rows_sent[i][j] / biggest,
                                             color=colour, alpha=0.8, shrinkA=0, shrinkB=0))
        ax.set_xlim(-0.6, n - 0.4)
        ax.set_ylim(bottom - 0.25, top + 0.25)
        ax.set_axis_off()
        ax.set_title(title, fontsize=MIN_FONT_PT + 1)
    return ax_dispatch, ax_combine


def plot_ring(ax_ring: Axes, ax_steps: Axes, ranks: int, causal: bool = True) -> tuple[Axes, Axes]:
    """Left: ``ranks`` on a circle, each sending its K/V block to the next. Right: the block
    each rank holds at each step (:func:`ring_schedule`), grey where the causal mask skips it."""
    P = ranks
    sched = ring_schedule(P, causal)
    radius = 1.0
    pos = [(radius * math.sin(2 * math.pi * r / P), radius * math.cos(2 * math.pi * r / P))
           for r in range(P)]
    for r, (x, y) in enumerate(pos):
        _box(ax_ring, x, y, 0.72, 0.3, f"rank {r}\nQ{r}, KV{r}")
    for r in range(P):
        (x0, y0), (x1, y1) = pos[r], pos[(r + 1) % P]
        ax_ring.add_patch(FancyArrowPatch((x0, y0), (x1, y1), connectionstyle="arc3,rad=-0.25",
                                          arrowstyle="-|>", mutation_scale=12, lw=1.6,
                                          color=DISPATCH, shrinkA=22, shrinkB=22))
    ax_ring.text(0, 0, "each step:\nK/V block\nto the next", ha="center",
                 va="center", fontsize=MIN_FONT_PT)
    ax_ring.set_xlim(-1.55, 1.55)
    ax_ring.set_ylim(-1.45, 1.45)
    ax_ring.set_aspect("equal")
    ax_ring.set_axis_off()
    ax_ring.set_title(f"ring attention on {P} ranks", fontsize=MIN_FONT_PT + 1)
    for s, row in enumerate(sched):
        for r, (block, computed) in enumerate(row):
            ax_steps.add_patch(Rectangle((r, s), 1, 1, facecolor=BOX if computed else SKIPPED,
                                         edgecolor="white", lw=2))
            ax_steps.text(r + 0.5, s + 0.5, f"KV{block}", ha="center", va="center",
                          fontsize=MIN_FONT_PT + 1, color="#222222" if computed else "#777777")
    ax_steps.set_xlim(0, P)
    ax_steps.set_ylim(P, 0)
    ax_steps.set_xticks([r + 0.5 for r in range(P)], [f"rank {r}" for r in range(P)],
                        fontsize=MIN_FONT_PT)
    ax_steps.set_yticks([s + 0.5 for s in range(P)], [f"step {s}" for s in range(P)],
                        fontsize=MIN_FONT_PT)
    ax_steps.tick_params(length=0)
    for side in ax_steps.spines.values():
        side.set_visible(False)
    ax_steps.set_title("block held (grey: masked, passed on)" if causal else "block held",
                       fontsize=MIN_FONT_PT + 1)
    return ax_ring, ax_steps


__all__ = ["plot_all_to_all", "plot_ring", "ring_schedule", "rows_between_ranks"]
