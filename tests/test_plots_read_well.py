"""The figures of chapters 03, 04, 05 and 08 read at their natural size (80 dpi, as shown).

Each figure is built by the package's helper from the data its chapter gives it (or the same
kind of data: the catalog GPUs, the recorded CPU roofline, every state of the block-table
widget), drawn, and checked on what was drawn (a spy on ``Text.draw`` records every text that
reached the canvas):

* every text is at least ``MIN_FONT_PT`` (9 pt) — legends, tick labels, point labels;
* no two texts overlap (their drawn boxes, 0.5 px of slack);
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
from llminfra.engine.timeline import TimelineRow  # noqa: E402
from llminfra.plots.gpus import plot_capacity_bandwidth  # noqa: E402
from llminfra.plots.kvcache import block_pool_figure, plot_memory_split, plot_sharing  # noqa: E402
from llminfra.plots.labels import MIN_FONT_PT, label_points, merge_coincident  # noqa: E402
from llminfra.plots.offscreen import offscreen_figure  # noqa: E402
from llminfra.plots.quant import (error_histogram_figure, plot_bytes_vs_error,  # noqa: E402
                                  plot_levels)
from llminfra.plots.roofline import plot_roofline, roofline_figure  # noqa: E402
from llminfra.plots.serving import gantt_figure, plot_latency_throughput  # noqa: E402
from llminfra.plots.spec_decode import spec_speedup_figure  # noqa: E402
from llminfra.specs import gpu_names  # noqa: E402
from llminfra.widgets.block_table import replay  # noqa: E402
from llminfra.widgets.gpu_roofline import roofline_points, serving_estimate  # noqa: E402

SLACK_PX = 0.5


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
    problems = small_fonts(texts) + overlaps(texts) + covered_points(fig)
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
    from llminfra.bench.kvcache import PAPER
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
