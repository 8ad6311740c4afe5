"""The figures of chapters 02, 03, 04, 05, 06, 07, 08 and 09 read at their natural size (80 dpi,
as shown).

Each figure is built by the package's helper from the data its chapter gives it (or the same
kind of data: the catalog GPUs, the recorded CPU roofline, every state of the block-table
widget), drawn, and checked on what was drawn (a spy on ``Text.draw`` records every text that
reached the canvas):

* every text is at least ``MIN_FONT_PT`` (9 pt) — legends, tick labels, point labels;
* no two texts overlap (their drawn boxes, 0.5 px of slack), and neighbouring tick labels of
  an axis keep a gap of ``TICK_GAP_PX`` (touching, "8 GPUs" and "decode b=32" read as one);
* a legend inside the axes covers no data point;
* a widget picture (a fixed-size PNG) has nothing cut at its edges.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

import llminfra  # noqa: E402
from llminfra.calc.roofline import (Roofline, decode_batch, device_roofline,  # noqa: E402
                                    prefill_batch, step_breakdown)
from llminfra.plots.attention import (io_figure, memory_vs_n_figure,  # noqa: E402
                                      tile_grid_figure, time_vs_n_figure)
from llminfra.plots.cost import (cost_per_million_vs_utilization,  # noqa: E402
                                 monthly_cost_vs_volume)
from llminfra.plots.gpus import plot_capacity_bandwidth  # noqa: E402
from llminfra.plots.kvcache import block_pool_figure, plot_memory_split, plot_sharing  # noqa: E402
from llminfra.plots.labels import MIN_FONT_PT, label_points, merge_coincident  # noqa: E402
from llminfra.plots.memory import plot_card_shares  # noqa: E402
from llminfra.plots.memory_calculator import memory_bar_figure  # noqa: E402
from llminfra.plots.offscreen import offscreen_figure  # noqa: E402
from llminfra.plots.parallel import (plot_bubble, plot_comm_share, plot_split,  # noqa: E402
                                     plot_timeline, timeline_figure)
from llminfra.plots.quant import (error_histogram_figure, plot_bytes_vs_error,  # noqa: E402
                                  plot_levels)
from llminfra.plots.roofline import plot_roofline, roofline_figure  # noqa: E402
from llminfra.plots.serving import gantt_figure, plot_latency_throughput  # noqa: E402
from llminfra.plots.spec_decode import spec_speedup_figure  # noqa: E402
from llminfra.sim.timeline import TimelineRow  # noqa: E402
from llminfra.specs import gpu_names  # noqa: E402
from llminfra.widgets.block_table import replay  # noqa: E402
from llminfra.widgets.gpu_roofline import roofline_points, serving_estimate  # noqa: E402

SLACK_PX = 0.5
TICK_GAP_PX = 3.0


def drawn_texts(fig: Figure, monkeypatch) -> list[tuple[Text, Bbox]]:
    """Draw ``fig``; every non-empty text that reached the canvas, with its box in pixels."""
    seen = []
    original = Text.draw

    def spy(self, renderer):
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            seen.append((self, Text.get_window_extent(self, renderer)))

    with monkeypatch.context() as m:
        m.setattr(Text, "draw", spy)
        fig.canvas.draw()
    return seen


def small_fonts(texts) -> list[str]:
    return [f"{t.get_text()!r} at {t.get_fontsize():g} pt" for t, _ in texts
            if t.get_fontsize() < MIN_FONT_PT]


def overlaps(texts) -> list[str]:
    out = []
    for (a, ba), (b, bb) in itertools.combinations(texts, 2):
        w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        if w > SLACK_PX and h > SLACK_PX:
            out.append(f"{a.get_text()!r} overlaps {b.get_text()!r} ({w:.0f} x {h:.0f} px)")
    return out


def touching_ticks(fig: Figure) -> list[str]:
    """Neighbouring tick labels of one axis closer than ``TICK_GAP_PX`` (call after drawing)."""
    out, renderer = [], fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis, lo, hi in ((ax.xaxis, "x0", "x1"), (ax.yaxis, "y0", "y1")):
            boxes = sorted((getattr(b, lo), getattr(b, hi), t.get_text())
                           for t in axis.get_ticklabels()
                           if t.get_visible() and t.get_text().strip()
                           for b in [t.get_window_extent(renderer)])
            out += [f"tick labels {a!r} and {b!r} {b0 - a1:.1f} px apart"
                    for (_, a1, a), (b0, _, b) in zip(boxes, boxes[1:]) if b0 - a1 < TICK_GAP_PX]
    return out


def covered_points(fig: Figure) -> list[str]:
    """Data points (markers of lines, scatter points) under a legend drawn inside its axes."""
    out = []
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        if not ax.get_window_extent(renderer).overlaps(box):
            continue
        xy = []
        for line in ax.get_lines():
            if line.get_marker() not in ("None", None, "", " "):
                xy.append(line.get_transform().transform(np.column_stack(line.get_data())))
        for c in ax.collections:
            if isinstance(c, PathCollection):
                xy.append(c.get_offset_transform().transform(c.get_offsets()))
        for x, y in (np.concatenate(xy) if xy else np.empty((0, 2))):
            if box.x0 < x < box.x1 and box.y0 < y < box.y1:
                out.append(f"legend of {ax.get_title()!r} covers the point at "
                           f"({x:.0f}, {y:.0f}) px")
    return out


def cut_at_edges(texts, fig: Figure) -> list[str]:
    w, h = fig.canvas.get_width_height()
    return [f"{t.get_text()!r} is cut at the picture's edge" for t, b in texts
            if b.x0 < -SLACK_PX or b.y0 < -SLACK_PX or b.x1 > w + SLACK_PX or b.y1 > h + SLACK_PX]


def assert_reads_well(fig: Figure, monkeypatch, fixed_size: bool = False) -> None:
    """The checks of the module's docstring; ``fixed_size``: a widget picture (no tight crop)."""
    texts = drawn_texts(fig, monkeypatch)
    assert texts, "nothing was drawn"
    problems = small_fonts(texts) + overlaps(texts) + touching_ticks(fig) + covered_points(fig)
    if fixed_size:
        problems += cut_at_edges(texts, fig)
    assert not problems, "\n".join(problems)


def notebook_figure(width_in: float, height_in: float, ncols: int = 1):
    """A figure as a chapter makes it (``plt.subplots(figsize=…)`` at the course's 80 dpi)."""
    fig = offscreen_figure(width_in, height_in)
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


# --- the checks themselves catch what they are meant to catch -------------------------------

def test_the_checks_see_small_fonts_overlaps_and_covered_points(monkeypatch):
    fig, (ax,) = notebook_figure(5, 3)
    ax.plot([0.04, 0.9], [0.96, 0.1], "o", label="points")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", fontsize=7)
    ax.text(0.5, 0.5, "first label", fontsize=10)
    ax.text(0.52, 0.5, "second label", fontsize=10)
    texts = drawn_texts(fig, monkeypatch)
    assert any("'points' at 7 pt" in s for s in small_fonts(texts))
    assert any("'first label' overlaps 'second label'" in s for s in overlaps(texts))
    ax.set_xticks([0.5, 0.53], ["left tick", "right tick"])
    fig.canvas.draw()
    assert any("'left tick' and 'right tick'" in s for s in touching_ticks(fig))
    assert covered_points(fig) and "covers the point" in covered_points(fig)[0]
    ax.text(4.0, 0.5, "far away", fontsize=10, transform=ax.transAxes)
    assert any("'far away' is cut" in s for s in cut_at_edges(drawn_texts(fig, monkeypatch), fig))


def test_labels_that_would_collide_are_moved_apart(monkeypatch):
    """Five points 1 % apart, labelled with fixed offsets they would all overlap; placed by
    ``label_points`` none do, and each stays within 80 px of its point."""
    fig, (ax,) = notebook_figure(5, 3)
    xs, ys = np.linspace(1.0, 1.04, 5), np.linspace(1.0, 1.04, 5)
    ax.plot(xs, ys, "o")
    ax.set_xlim(0, 2)
    ax.set_ylim(0, 2)
    labels = label_points(ax, [(x, y, f"point number {i}") for i, (x, y) in enumerate(zip(xs, ys))])
    assert_reads_well(fig, monkeypatch)
    renderer = fig.canvas.get_renderer()
    for a in labels:
        box = Text.get_window_extent(a, renderer)
        px, py = ax.transData.transform(a.xy)
        gap = np.hypot(max(box.x0 - px, 0, px - box.x1), max(box.y0 - py, 0, py - box.y1))
        assert gap < 80, (a.get_text(), gap)


def test_points_at_one_spot_share_a_label():
    pts = [(141.0, 4800.0, "h200"), (140.4, 4800.0, "h200-nvl"), (80.0, 3350.0, "h100")]
    assert merge_coincident(pts, tol=0.02, log=(True, True)) == [
        (141.0, 4800.0, "h200, h200-nvl"), (80.0, 3350.0, "h100")]


# --- chapter 03 ----------------------------------------------------------------------------

def test_ch03_bytes_vs_error(monkeypatch):
    """Nine schemes, two of them at the same 0.523 bytes per parameter (as in the chapter)."""
    rows = {name: {"bytes_per_param": b, "layer_rel_error": e} for name, b, e in (
        ("int8-channel", 1.01, 0.0032), ("fp8-e4m3", 1.0, 0.012), ("int4-g128", 0.523, 0.045),
        ("nf4", 0.531, 0.042), ("int4-channel", 0.508, 0.058), ("int3-g128", 0.398, 0.097),
        ("int3-channel", 0.383, 0.136), ("int2-g32", 0.344, 0.182),
        ("gptq-int4-g128", 0.523, 0.0186))}
    fig, (ax,) = notebook_figure(7.0, 3.6)
    plot_bytes_vs_error(rows, ax)
    assert_reads_well(fig, monkeypatch)


def test_ch03_levels_and_error_histogram(monkeypatch):
    from llminfra.quant.nf4_levels import nf4_code
    fig, (ax,) = notebook_figure(7, 2.2)
    plot_levels({"int4 (absmax)": torch.arange(-7, 8) / 7, "nf4": nf4_code()}, ax)
    assert_reads_well(fig, monkeypatch)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4096, generator=g)
    fig = error_histogram_figure(w, (w * 8).round() / 8, "int4-g128: rounding error")
    assert_reads_well(fig, monkeypatch, fixed_size=True)


# --- chapter 04 ----------------------------------------------------------------------------

def test_ch04_block_table_widget_every_step(monkeypatch):
    for state in replay():
        assert_reads_well(block_pool_figure(state), monkeypatch, fixed_size=True)


def test_ch04_memory_split_and_sharing(monkeypatch):
    parts = ("token", "reserved", "internal", "external", "free")
    designs = {"contiguous-max": (0.21, 0.14, 0.57, 0.0, 0.08),
               "contiguous-pow2": (0.37, 0.27, 0.22, 0.11, 0.03),
               "contiguous-oracle": (0.49, 0.36, 0.0, 0.15, 0.0),
               "paged-8": (0.98, 0.0, 0.01, 0.0, 0.01), "paged-16": (0.97, 0, 0.02, 0, 0.01),
               "paged-32": (0.95, 0, 0.04, 0, 0.01)}
    fig, (ax,) = notebook_figure(8, 3.2)
    plot_memory_split({d: dict(zip(parts, v)) for d, v in designs.items()}, ax)
    assert_reads_well(fig, monkeypatch)
    from llminfra.kvcache.simulate import PAPER
    result = {"parallel_sampling_saving": {"2": 0.025, "4": 0.06, "6": 0.075},
              "beam_search_saving": {"2": 0.39, "4": 0.59, "6": 0.66}}
    fig, (ax,) = notebook_figure(6, 3)
    plot_sharing(result, PAPER, ax)
    assert_reads_well(fig, monkeypatch)


# --- chapter 05 ----------------------------------------------------------------------------

def _rows(n: int) -> list[TimelineRow]:
    """``n`` requests with 3-digit prompts, staggered arrivals, the last ones padded."""
    rows = []
    for i in range(n):
        start, first = 2 * i, 2 * i + 3
        end = first + 5 + 3 * (i % 3)
        rows.append(TimelineRow(str(i), 100 + 37 * i, 5 + 3 * (i % 3), float(i), float(start),
                                float(first), float(end), tuple(range(first, end)),
                                tuple(float(s) for s in range(end, end + 2 * (i % 2)))))
    return rows


@pytest.mark.parametrize("n", [3, 8, 16])
def test_ch05_batching_timeline(monkeypatch, n):
    fig = gantt_figure(_rows(n), title="continuous batching, max batch 4")
    assert_reads_well(fig, monkeypatch, fixed_size=True)


@pytest.mark.parametrize("tokens_per_s", [(410, 1164, 2197), (410, 450, 2197), (100, 102, 104)])
def test_ch05_latency_throughput(monkeypatch, tokens_per_s):
    """Three load levels, as in the chapter; two or three of them at nearly the same
    throughput (their tick labels and point labels would collide)."""
    pts = [{"concurrency": c, "output_tokens_per_s": x, "tpot_s": {"p50": 0.002 * (1 + i)},
            "ttft_s": {"p50": 0.008 * (1 + i) ** 2}}
           for i, (c, x) in enumerate(zip((1, 4, 16), tokens_per_s))]
    fig, (ax1, ax2) = notebook_figure(9, 3.4, ncols=2)
    plot_latency_throughput(pts, ax1, "tpot_s")
    plot_latency_throughput(pts, ax2, "ttft_s")
    fig.suptitle("tiny model on this CPU over HTTP: more clients, more tokens/s, slower tokens")
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.8, 1.0])
def test_ch05_speculative_decoding_widget(monkeypatch, alpha):
    assert_reads_well(spec_speedup_figure(alpha, 0.05, 0.9), monkeypatch, fixed_size=True)


# --- chapter 08 ----------------------------------------------------------------------------

def test_ch08_catalog_roofline(monkeypatch):
    """The chapter's §4 figure: four catalog roofs, Llama-2-7B's steps on the H100."""
    roofs = [device_roofline(g) for g in ("a100-80gb", "h100", "mi300x", "l40s")]
    points = []
    for label, pairs in (("decode B=1", decode_batch(1, 2048)),
                         ("decode B=64", decode_batch(64, 2048)),
                         ("decode B=64, 256 tok", decode_batch(64, 256)),
                         ("prefill 2048", prefill_batch(2048))):
        s = step_breakdown("llama-2-7b", "h100", pairs)
        points.append({"label": f"{label} (H100)", "intensity": s["flops"] / s["bytes"],
                       "flops_per_s": s["flops"] / max(s["compute_s"], s["memory_s"])})
    fig, (ax,) = notebook_figure(8, 4.5)
    plot_roofline(roofs, points, ax)
    ax.set_title("llama-2-7b, bf16: where the steps sit (roofs: catalog, dense bf16)")
    assert_reads_well(fig, monkeypatch)
    legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "e+" not in legend and "1,307 TFLOP/s" in legend


def test_ch08_measured_roofline(monkeypatch):
    """The chapter's §7 figure: the recorded CPU roof and its eight measured steps."""
    recorded = Path(llminfra.__file__).parent / "data" / "bench_roofline_cpu.json"
    rec = json.loads(recorded.read_text())
    roof = Roofline("recorded CPU, 1 thread", rec["matmul_flops_per_s"], rec["copy_bytes_per_s"])
    points = []
    for kind in ("decode_points", "prefill_points"):
        for preset, by_batch in rec[kind].items():
            for batch, p in by_batch.items():
                attainable = min(roof.peak_flops_per_s, p["intensity"] * roof.bytes_per_s)
                points.append({"label": f"{kind.split('_')[0]} {preset} B={batch}",
                               "intensity": p["intensity"],
                               "flops_per_s": attainable * p["bound_s"] / p["measured_s"]})
    assert len(points) >= 6
    fig, (ax,) = notebook_figure(8, 4.5)
    plot_roofline([roof], points, ax)
    ax.set_title("This machine: measured steps under the measured roof")
    assert_reads_well(fig, monkeypatch)


@pytest.mark.parametrize("gpu,context,concurrency", [("h100", 2048, 1), ("l40s", 256, 64),
                                                     ("mi300x", 4096, 256)])
def test_ch08_roofline_widget(monkeypatch, gpu, context, concurrency):
    d = serving_estimate("llama-2-7b", gpu, "bf16", context, concurrency, 1, 2.0)
    assert_reads_well(roofline_figure(*roofline_points(d)), monkeypatch, fixed_size=True)


def test_ch08_capacity_vs_bandwidth(monkeypatch):
    """Every catalog GPU (several at the same spot: H200 / H200 NVL, A100 80GB SXM / PCIe)."""
    fig, (ax,) = notebook_figure(7, 4.2)
    plot_capacity_bandwidth(gpu_names(), ax)
    ax.set_title("capacity decides what fits, bandwidth how fast it decodes")
    assert_reads_well(fig, monkeypatch)
    names = " ".join(t.get_text() for t in ax.texts)
    assert all(g in names for g in gpu_names()), "every GPU is named"


# --- chapter 02 ----------------------------------------------------------------------------

def test_ch02_card_shares(monkeypatch):
    """vLLM's Fig. 1 shares and the memory model's two splits (the 0 %-reserve "other" is
    0.7 % of the card: its label goes beside the bar's end)."""
    shares = {"vLLM Fig. 1 (paper)": {"weights": 0.65, "KV cache": 0.30, "other": 0.05},
              "ours, 10% reserve": {"weights": 0.5985, "KV cache": 0.2946, "other": 0.1068},
              "ours, 0% reserve": {"weights": 0.5985, "KV cache": 0.3946, "other": 0.0068}}
    fig, (ax,) = notebook_figure(7, 2.4)
    plot_card_shares(shares, ax, "share of the a100-40gb's 40 GiB [datasheet]",
                     colours={"other": "#ffbf00"})
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)
    assert sum(t.get_text() == "1%" for t in ax.texts) == 1


@pytest.mark.parametrize("model,gpu,kv,context,batch", [
    ("llama-2-70b", "h200", "fp8", 4096, 8), ("llama-2-13b", "a100-40gb", "bf16", 2048, 8),
    ("llama-3-70b", "h100", "bf16", 8192, 256), ("smollm2-135m", "rtx-4090", "int4", 256, 1)])
def test_ch02_memory_calculator_widget(monkeypatch, model, gpu, kv, context, batch):
    """The calculator's picture: fits, does not fit, 40x over the card (sizes past 1,000 GB
    written with commas), a model far smaller than the card."""
    from llminfra.widgets.memory_calculator import memory_breakdown
    fig = memory_bar_figure(memory_breakdown(model, gpu, "bf16", kv, context, batch))
    assert_reads_well(fig, monkeypatch, fixed_size=True)
    shown = " ".join(t.get_text() for t, _ in drawn_texts(fig, monkeypatch))
    assert "e+" not in shown, shown


# --- chapter 06 ----------------------------------------------------------------------------

#: chapter 06's recorded table: (N, causal, naive / tiled / SDPA ms, naive / tiled / SDPA MB)
CH06_ROWS = [(256, False, .348, .386, .223, .788, .47, .149),
             (256, True, .53, .564, .223, .788, .526, .149),
             (512, False, 1.2, 1.27, .828, 3.15, .94, .281),
             (512, True, 1.81, 1.96, .839, 3.15, 1.05, .281),
             (1024, False, 10.2, 5.39, 3.23, 12.6, 1.21, .858),
             (1024, True, 12.9, 5.34, 2.47, 12.6, 1.32, .858),
             (2048, False, 42.8, 19.3, 12.8, 50.3, 1.74, 1.12),
             (2048, True, 52.9, 15.4, 8.26, 50.3, 1.85, 1.12)]


def _ch06_rows() -> list[dict]:
    keys = ("naive", "flash", "sdpa")
    return [{"N": n, "causal": c, **{f"{k}_s": t / 1e3 for k, t in zip(keys, r[:3])},
             **{f"{k}_peak_bytes": m * 1e6 for k, m in zip(keys, r[3:])}}
            for n, c, *r in CH06_ROWS]


def test_ch06_tile_stepper_every_step(monkeypatch):
    from llminfra.attention.tile_trace import tile_trace
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 4, generator=g) for _ in range(3))
    trace = tile_trace(q, k, v, True, 4, 4)
    for step in range(len(trace.steps)):
        assert_reads_well(tile_grid_figure(trace, step), monkeypatch, fixed_size=True)


def test_ch06_measured_memory_and_time(monkeypatch):
    rows = _ch06_rows()
    for fig in (memory_vs_n_figure(rows), time_vs_n_figure(rows)):
        assert_reads_well(fig, monkeypatch)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:3] == ["naive", "tiled", "SDPA"], "the chapter's names, not the bench's keys"


def test_ch06_io_counts(monkeypatch):
    from llminfra.attention.io_accounting import io_table
    rows = io_table([128, 256, 512], 16, [1024, 4096], generator=torch.Generator().manual_seed(0))
    assert_reads_well(io_figure(rows), monkeypatch)


# --- chapter 07 ----------------------------------------------------------------------------

def test_ch07_splits_and_communication_share(monkeypatch):
    from llminfra.calc.communication import pcie_claim_table
    fig, axes = notebook_figure(7, 3, ncols=2)
    plot_split(axes[0], n_out=8, n_in=6, size=2, kind="column")
    plot_split(axes[1], n_out=8, n_in=6, size=2, kind="row")
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)
    fig, (ax,) = notebook_figure(7.5, 3.4)
    plot_comm_share(pcie_claim_table("llama-2-70b", "a100-80gb"), ax)
    ax.set_title("llama-2-70b on a100-80gb: share of a step in all-reduce (α = 0)", fontsize=10)
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)


@pytest.mark.parametrize("p,m", [(1, 1), (4, 4), (4, 16), (8, 8), (8, 32)])
def test_ch07_pipeline_timeline_widget(monkeypatch, p, m):
    """Every box has its number while every number fits; at p = 8, m = 32 the boxes are too
    narrow for "31", and the numbers are left out rather than run together."""
    from llminfra.parallel.pipeline import gpipe_schedule
    fig = timeline_figure(gpipe_schedule(p, m, 1.0), p, time_unit="stage times")
    assert_reads_well(fig, monkeypatch, fixed_size=True)
    numbers = [t for t, _ in drawn_texts(fig, monkeypatch) if t.get_text().isdigit()
               and t.axes is not None and t in t.axes.texts]
    assert len(numbers) == (p * m if m <= 16 else 0)


def test_ch07_recorded_timeline_and_bubble(monkeypatch):
    """The chapter's §5 pair: a recorded p = 2, m = 8 run (uneven stage times) and the bubble,
    measured against (p-1)/(m+p-1)."""
    from llminfra.parallel.pipeline import StageEvent, bubble_fraction
    events = [StageEvent(s, b, 0.031 * (b + s) + 0.002 * s, 0.031 * (b + s + 1) + 0.002 * s)
              for s in range(2) for b in range(8)]
    fig, axes = notebook_figure(8, 2.8, ncols=2)
    plot_timeline(events, axes[0], 2, title="recorded: p=2, m=8")
    plot_bubble({"p=2": {"m=1": 0.5, "m=2": 0.336, "m=4": 0.203, "m=8": 0.122}},
                {"p=2": {f"m={m}": bubble_fraction(2, m) for m in (1, 2, 4, 8)}}, axes[1])
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)


# --- chapter 09 ----------------------------------------------------------------------------

def test_ch09_cost_figures(monkeypatch):
    """The chapter's two figures, with its example prices (blended 5.4 USD per M tokens, 2.69
    USD per rented GPU hour, 1.544 owned, 1,000 tokens/s)."""
    from llminfra.calc.deployment import Prices
    prices = Prices(5.4, 2.69, 1.544, 1000)
    fig, (ax,) = notebook_figure(7, 4)
    monthly_cost_vs_volume([1e6, 1e7, 75e6, 3e8, 1e9, 3e9, 1e10], prices, 0.5, ax)
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)
    fig, (ax,) = notebook_figure(7, 3.6)
    cost_per_million_vs_utilization(2.69, 1000, [0.05, 0.1, 0.25, 0.5, 0.75, 1.0], 5.4, ax)
    ax.set_title("One rented GPU (2.69 USD/h, example) at 1,000 tokens/s when busy")
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)


@pytest.mark.parametrize("rows_sent, experts", [
    ([[8, 9, 11, 4], [9, 7, 9, 7], [6, 13, 7, 6], [7, 8, 9, 8]], 2),   # the chapter's layer
    ([[0, 30, 0, 1], [0, 0, 0, 0], [5, 5, 5, 5], [1, 1, 1, 40]], 16)])
def test_ch11_all_to_all(monkeypatch, rows_sent, experts):
    """The chapter's two all-to-alls (8 experts on 4 ranks), and a lopsided one with wide
    expert ranges: boxes' labels neither overlap nor shrink."""
    from llminfra.plots.beyond import plot_all_to_all
    fig = offscreen_figure(7.5, 5.2)
    axes = [fig.add_subplot(2, 1, i + 1) for i in range(2)]
    plot_all_to_all(*axes, rows_sent, experts)
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)


@pytest.mark.parametrize("ranks, causal", [(4, True), (4, False), (6, True)])
def test_ch11_ring(monkeypatch, ranks, causal):
    """Ring attention's ring and schedule, as the chapter draws them (4 ranks) and at 6."""
    from llminfra.plots.beyond import plot_ring, ring_schedule
    fig, axes = notebook_figure(8.5, 3.8, ncols=2)
    plot_ring(*axes, ranks, causal=causal)
    fig.tight_layout()
    assert_reads_well(fig, monkeypatch)
    sched = ring_schedule(ranks, causal)
    # every rank meets every block once; causal: rank r computes r + 1 blocks
    assert all(sorted(b for b, _ in (sched[s][r] for s in range(ranks))) == list(range(ranks))
               for r in range(ranks))
    assert [sum(sched[s][r][1] for s in range(ranks)) for r in range(ranks)] == \
        ([r + 1 for r in range(ranks)] if causal else [ranks] * ranks)


def test_rows_between_ranks_by_hand():
    """4 tokens on 2 ranks (2 each), 4 experts (2 per rank), top-2."""
    import torch
    from llminfra.plots.beyond import rows_between_ranks
    ids = torch.tensor([[0, 3], [1, 2], [2, 3], [3, 0]])
    assert rows_between_ranks(ids, 2, 4) == [[2, 2], [1, 3]]
    with pytest.raises(ValueError):
        rows_between_ranks(ids, 3, 4)
