"""Figures of chapter 07: pipeline timelines with the bubble shaded, the matrix splits of tensor
parallelism, the measured bubble against GPipe's formula, the communication share per link.

Each ``plot_*`` draws on a given ``ax``; :func:`timeline_figure` / :func:`timeline_png` draw
off-screen (Agg, no pyplot state) for the timeline widget. Every text is at least
:data:`~llminfra.plots.labels.MIN_FONT_PT`; the micro-batches' numbers are written in their
boxes only when every box, as drawn, is wide enough for its number (32 micro-batches on 8
stages leave boxes too narrow for "31": then the colours alone tell them apart).

Bubble: Huang et al., 2019, GPipe (arXiv:1811.06965), §2.2; splits: Shoeybi et al., 2019,
Megatron-LM (arXiv:1909.08053), Fig. 3.
"""

from __future__ import annotations

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator, NullLocator
from matplotlib.transforms import Bbox

from llminfra.parallel.pipeline import StageEvent, measured_bubble
from llminfra.plots.labels import MIN_FONT_PT
from llminfra.plots.offscreen import DPI, offscreen_figure, png_bytes

#: one colour per micro-batch (cycled)
COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
           "#8c8c8c", "#ccb974", "#64b5cd")


class _FitInBoxes(Artist):
    """Draws nothing; when the axes are drawn (first among their children, so after any
    ``tight_layout`` or resize) shows the texts only if each fits inside its box with 1 px to
    spare (neighbouring labels never run into each other), else none of them."""

    def __init__(self, pairs: list[tuple[Text, Rectangle]]):
        super().__init__()
        self.pairs = pairs
        self.set_zorder(-1e9)
        self.set_in_layout(False)

    def get_window_extent(self, renderer=None):
        return Bbox.null()

    def draw(self, renderer):
        fit = True
        for text, box in self.pairs:
            text.set_visible(True)
            t, b = text.get_window_extent(renderer), box.get_window_extent(renderer)
            fit = fit and t.width + 2 <= b.width and t.height + 2 <= b.height
        for text, _ in self.pairs:
            text.set_visible(fit)


def plot_timeline(events: list[StageEvent], ax: Axes, n_stages: int | None = None,
                  title: str | None = None, time_unit: str = "s") -> Axes:
    """Stages (rows, stage 0 on top) × time: one labelled box per (stage, micro-batch), idle
    time between the first start and the last end shaded grey (the bubble).

    ``time_unit`` names the unit of the events' times on the x axis: ``"s"`` for a recorded
    run, ``"stage times"`` for an ideal schedule built with a stage time of 1 (ticks then fall
    on whole stage times)."""
    p = n_stages or len({e.stage for e in events})
    t0 = min(e.start_s for e in events)
    t1 = max(e.end_s for e in events)
    for s in range(p):
        ax.add_patch(Rectangle((0, s - 0.4), t1 - t0, 0.8, color="#bbbbbb", alpha=0.5, lw=0,
                               hatch="//", fill=True))
    pairs = []
    for e in events:
        box = ax.add_patch(Rectangle((e.start_s - t0, e.stage - 0.4), e.end_s - e.start_s, 0.8,
                                     color=COLOURS[e.micro_batch % len(COLOURS)], ec="white",
                                     lw=0.8))
        pairs.append((ax.text((e.start_s + e.end_s) / 2 - t0, e.stage, str(e.micro_batch),
                              ha="center", va="center", fontsize=MIN_FONT_PT, color="white"),
                      box))
    ax.add_artist(_FitInBoxes(pairs))
    ax.set_xlim(0, t1 - t0)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.set_xlabel(f"time ({time_unit})")
    if time_unit == "stage times":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    bubble = measured_bubble(events, p)
    ax.set_title(title or f"p = {p} stages: grey = idle, bubble {bubble:.3f}", fontsize=10)
    return ax


def timeline_figure(events: list[StageEvent], n_stages: int | None = None,
                    title: str | None = None, width_in: float = 7.0, dpi: int = DPI,
                    time_unit: str = "s") -> Figure:
    """:func:`plot_timeline` on an off-screen Figure, 0.45 in per stage (nothing shown, nothing
    left open)."""
    p = n_stages or len({e.stage for e in events})
    fig = offscreen_figure(width_in, 1.0 + 0.45 * p, dpi)
    plot_timeline(events, fig.add_subplot(1, 1, 1), p, title, time_unit)
    fig.tight_layout()
    return fig


def timeline_png(events: list[StageEvent], n_stages: int | None = None, title: str | None = None,
                 width_in: float = 7.0, dpi: int = DPI, time_unit: str = "s") -> bytes:
    """:func:`timeline_figure` as PNG bytes (for the timeline widget's ``Image``)."""
    return png_bytes(timeline_figure(events, n_stages, title, width_in, dpi, time_unit))


def plot_split(ax: Axes, n_out: int, n_in: int, size: int, kind: str) -> Axes:
    """The weight ``W (out, in)`` of an ``nn.Linear`` coloured by the rank that holds each part:
    ``kind="column"`` (Megatron's column parallel: rows of W, i.e. output features) or
    ``"row"`` (columns of W, i.e. input features)."""
    if kind not in ("column", "row"):
        raise ValueError(f"kind must be 'column' or 'row', got {kind!r}")
    for r in range(size):
        if kind == "column":
            xy, w, h = (0, r * n_out / size), n_in, n_out / size
        else:
            xy, w, h = (r * n_in / size, 0), n_in / size, n_out
        ax.add_patch(Rectangle(xy, w, h, color=COLOURS[r % len(COLOURS)], ec="white", lw=2))
        ax.text(xy[0] + w / 2, xy[1] + h / 2, f"rank {r}", ha="center", va="center",
                color="white", fontsize=MIN_FONT_PT)
    ax.set_xlim(0, n_in)
    ax.set_ylim(n_out, 0)
    ax.set_xlabel(f"in = {n_in}")
    ax.set_ylabel(f"out = {n_out}")
    what = "output features (rows of W)" if kind == "column" else "input features (columns of W)"
    ax.set_title(f"{kind} parallel: split\n{what}", fontsize=10, pad=10)   # clear of tick "0"
    ax.set_aspect("equal")
    return ax


def plot_bubble(measured: dict, formula: dict, ax: Axes) -> Axes:
    """Bubble fraction against micro-batches ``m``: measured (points) and ``(p-1)/(m+p-1)``
    (lines), for each ``"p=…"`` key of the bench JSON (values keyed ``"m=…"``)."""
    for k, (p, row) in enumerate(formula.items()):
        ms = [int(key[2:]) for key in row]
        colour = COLOURS[k % len(COLOURS)]
        ax.plot(ms, list(row.values()), "-", color=colour, label=f"{p} formula")
        got = measured.get(p, {})
        ax.plot([int(key[2:]) for key in got], list(got.values()), "o", color=colour,
                label=f"{p} measured")
    ax.set_xscale("log", base=2)
    ms_all = sorted({int(key[2:]) for row in (*formula.values(), *measured.values()) for key in row})
    ax.set_xticks(ms_all, [str(m) for m in ms_all])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble fraction")
    ax.legend(fontsize=MIN_FONT_PT)
    return ax


def plot_comm_share(rows: list[dict], ax: Axes) -> Axes:
    """Share of a step spent in all-reduce (:func:`llminfra.calc.communication.communication_share`
    rows) as grouped bars: one group per (phase, batch, GPUs), one bar per interconnect; the
    source text's 40–50 % band shaded."""
    groups = list(dict.fromkeys((r["phase"], r["batch"], r["n_gpus"]) for r in rows))
    links = list(dict.fromkeys(r["interconnect"] for r in rows))
    width = 0.8 / len(links)
    for j, link in enumerate(links):
        xs, ys = [], []
        for i, g in enumerate(groups):
            row = next((r for r in rows if (r["phase"], r["batch"], r["n_gpus"]) == g
                        and r["interconnect"] == link), None)
            if row is not None:
                xs.append(i + j * width)
                ys.append(row["share"])
        ax.bar(xs, ys, width, label=link, color=COLOURS[j % len(COLOURS)])
    ax.axhspan(0.4, 0.5, color="#cccccc", alpha=0.6, label="claim: 40–50 %")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))],
                  [f"{ph} b={b}\n{n} GPUs" for ph, b, n in groups], fontsize=MIN_FONT_PT)
    ax.set_ylabel("share of step in all-reduce")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=MIN_FONT_PT, loc="upper right")   # the bars there stay under 0.5
    return ax
