"""Figures of chapter 05: the batching timeline (a Gantt chart of requests over engine steps)
and the latency–throughput curve of a load sweep.

Each ``plot_*`` draws on a given ``ax``; :func:`gantt_figure` / :func:`gantt_png` draw
off-screen (no pyplot state) for the batching-timeline widget. Timelines:
:mod:`llminfra.sim.timeline`; sweeps: :mod:`llminfra.serving.loadtest`. Static vs iteration-level batching: Yu et al., 2022, *Orca*,
OSDI '22.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from llminfra.plots.labels import MIN_FONT_PT, label_points
from llminfra.plots.offscreen import DPI, offscreen_figure, png_bytes

#: bar colours: queued, prefill (incl. chunks), decode, padding (a finished row still computed)
PHASE_COLOURS = {"queued": "#c8c8c8", "prefill": "#dd8452", "decode": "#4c72b0",
                 "padding": "#595959"}


def _runs(steps) -> list[tuple[float, float]]:
    """Consecutive steps merged into ``(start, end)`` intervals: [3, 4, 5, 8] -> (3, 6), (8, 9)."""
    runs: list[list[float]] = []
    for k in sorted(steps):
        if runs and k == runs[-1][1]:
            runs[-1][1] = k + 1
        else:
            runs.append([k, k + 1])
    return [(a, b) for a, b in runs]


def plot_gantt(rows: list, ax: Axes, title: str | None = None, x_max: float | None = None) -> Axes:
    """One row per request (request 0 on top): grey from arrival to first scheduled step,
    orange from there to its first token (the prefill, chunked or not), blue while decoding,
    a tick at every step that produced a token, dark grey for the steps that still computed its
    row as padding after it finished (static batching). ``rows``: :class:`TimelineRow`s."""
    for y, r in enumerate(rows):
        spans = [("queued", r.arrival, r.first_scheduled),
                 ("prefill", r.first_scheduled, r.first_token_out),
                 ("decode", r.first_token_out, r.finished_out)]
        spans += [("padding", a, b) for a, b in _runs(r.padding_steps)]
        for phase, a, b in spans:
            if b > a:
                ax.barh(y, b - a, left=a, height=0.7, color=PHASE_COLOURS[phase], lw=0)
        ax.plot([t + 1 for t in r.token_steps], [y] * len(r.token_steps), "|", color="white",
                ms=5, mew=0.6)
    end = x_max or max(r.finished_out for r in rows)
    ax.set_xlim(0, end)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)), [f"req {r.request_id} ({r.prompt_len}→{r.output_len})"
                                     for r in rows], fontsize=MIN_FONT_PT)
    ax.set_xlabel("engine step")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in PHASE_COLOURS.items()],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=MIN_FONT_PT, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def gantt_figure(rows: list, title: str | None = None, x_max: float | None = None,
                 width_in: float = 7.5, dpi: int = DPI) -> Figure:
    """:func:`plot_gantt` on an off-screen Figure, 0.28 in per request."""
    fig = offscreen_figure(width_in, 1.1 + 0.28 * len(rows), dpi)
    plot_gantt(rows, fig.add_subplot(1, 1, 1), title, x_max)
    fig.tight_layout()
    return fig


def gantt_png(rows: list, title: str | None = None, x_max: float | None = None,
              width_in: float = 7.5, dpi: int = DPI) -> bytes:
    """:func:`gantt_figure` as PNG bytes (nothing shown, nothing left open)."""
    return png_bytes(gantt_figure(rows, title, x_max, width_in, dpi))


def _spaced_tick_labels(xs: list[float], min_gap: float = 0.12) -> list[str]:
    """Tick labels at the measured values, left blank where one would sit closer than
    ``min_gap`` of the axis' span to a label already written (their texts would overlap)."""
    span = (max(xs) - min(xs)) or 1.0
    out, kept = [""] * len(xs), []
    for i in sorted(range(len(xs)), key=lambda i: xs[i]):
        if all(abs(xs[i] - k) >= min_gap * span for k in kept):
            out[i] = f"{xs[i]:,.0f}"
            kept.append(xs[i])
    return out


#: where :func:`plot_latency_throughput` puts its x ticks
XTICKS = ("measured", "round")


def plot_latency_throughput(points: list[dict], ax: Axes, latency_key: str = "tpot_s",
                            label: str | None = None, xticks: str = "measured") -> Axes:
    """Throughput (output tokens/s, x) against a latency percentile (ms, y), one point per
    load level, annotated with its concurrency. ``points``: ``{"concurrency",
    "output_tokens_per_s", latency_key: {"p50": …}}`` rows, e.g. :func:`run_loadtest` results.
    ``xticks``: ``"measured"`` ticks at the points' throughputs (a label left out where two
    would touch), ``"round"`` a scale of round numbers (500, 1,000, …; four ticks or more) that
    stays readable however close the points land."""
    if xticks not in XTICKS:
        raise ValueError(f"xticks={xticks!r}: expected one of {', '.join(XTICKS)}")
    xs = [p["output_tokens_per_s"] for p in points]
    ys = [1e3 * p[latency_key]["p50"] for p in points]
    ax.plot(xs, ys, "o-", label=label)
    ax.margins(x=0.12, y=0.1)                      # room for the labels of the end points
    label_points(ax, [(x, y, f"C={p['concurrency']}") for p, x, y in zip(points, xs, ys)])
    if xticks == "measured":
        ax.set_xticks(xs, _spaced_tick_labels(xs))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 5, 10], min_n_ticks=4))
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda x, _: f"{x:,.0f}" if float(x).is_integer() else f"{x:,.6g}"))
    ax.set_xlabel("throughput (output tokens/s)")
    name = {"tpot_s": "time per output token", "ttft_s": "TTFT", "e2e_s": "end-to-end"}
    ax.set_ylabel(f"median {name.get(latency_key, latency_key)} (ms)")
    return ax
