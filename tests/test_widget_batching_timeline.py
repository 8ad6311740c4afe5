"""The batching timeline (real engine, tiny model, step clock), its Gantt plot and its widget:
move a control, the label and picture change."""

import matplotlib
import pytest
from matplotlib.figure import Figure

from llminfra.engine.timeline import (WorkItem, demo_workload, step_timeline,
                                      timeline_summary)
from llminfra.model import load_tiny
from llminfra.plots.serving import gantt_png, plot_gantt, plot_latency_throughput
from llminfra.widgets.batching_timeline import BatchingTimeline

matplotlib.use("Agg")
ENGINE = dict(max_num_seqs=4, max_num_batched_tokens=64, num_blocks=64, dynamic_window_s=3.0)


@pytest.fixture(scope="module")
def tiny(one_thread):
    return load_tiny()


@pytest.fixture(scope="module")
def timelines(tiny):
    return {p: step_timeline(*tiny, demo_workload(), policy=p, **ENGINE)
            for p in ("static", "continuous")}


def test_every_request_runs_after_arrival_and_gets_its_tokens(timelines):
    for rows in timelines.values():
        for r, w in zip(rows, demo_workload()):
            assert r.arrival == w.arrival_step <= r.first_scheduled < r.first_token_out
            assert r.first_token_out <= r.finished_out
            assert len(r.token_steps) == w.max_tokens      # the tiny model never stops early
            assert r.finished_out == r.token_steps[-1] + 1


def test_static_batches_never_admit_while_a_batch_runs(timelines):
    """Static batching: nothing joins a running batch — a request that arrives while another
    runs starts only after that one's last step (finished_out - 1)."""
    rows = timelines["static"]
    for a in rows:
        for b in rows:
            if a.first_scheduled < b.arrival < a.finished_out - 1:
                assert b.first_scheduled >= a.finished_out - 1, (a, b)
    c = timelines["continuous"]
    assert any(a.first_scheduled < b.arrival < a.finished_out - 1 and
               b.first_scheduled < a.finished_out - 1 for a in c for b in c)  # continuous joins


def test_continuous_beats_static_on_ttft_and_makespan(timelines):
    s, c = (timeline_summary(timelines[p]) for p in ("static", "continuous"))
    assert c["mean_ttft_steps"] < s["mean_ttft_steps"]
    assert c["makespan_steps"] <= s["makespan_steps"]


def test_summary_by_hand():
    """Two rows: queued 1 and 0, TTFT 2 and 1, e2e 5 and 3, makespan 6 - 0."""
    from llminfra.engine.timeline import TimelineRow
    rows = [TimelineRow("0", 4, 3, 0.0, 1.0, 2.0, 5.0, (1.0, 3.0, 4.0)),
            TimelineRow("1", 4, 2, 3.0, 3.0, 4.0, 6.0, (3.0, 5.0))]
    s = timeline_summary(rows)
    assert s == {"num_requests": 2, "makespan_steps": 6.0, "mean_queued_steps": 0.5,
                 "mean_ttft_steps": 1.5, "mean_e2e_steps": 4.0}


def test_plots(timelines):
    png = gantt_png(timelines["continuous"], title="continuous")
    assert png[:4] == b"\x89PNG"
    ax = plot_gantt(timelines["static"], Figure().add_subplot())
    assert ax.get_xlabel() == "engine step" and len(ax.get_yticks()) == 8
    pts = [{"concurrency": c, "output_tokens_per_s": 100.0 * c, "tpot_s": {"p50": 0.01 * c}}
           for c in (1, 4, 16)]
    ax = plot_latency_throughput(pts, Figure().add_subplot())
    assert list(ax.get_xticks()) == [100.0, 400.0, 1600.0]
    assert "ms" in ax.get_ylabel() and "tokens/s" in ax.get_xlabel()


def test_widget_controls_change_label_and_image(tiny):
    w = BatchingTimeline(*tiny, workload=[WorkItem(20, 6, 0), WorkItem(8, 2, 1),
                                          WorkItem(30, 4, 2)], policy="static", max_num_seqs=2)
    assert w.text.startswith("static: 3 requests") and w.label.value == w.text
    before = w.image.value
    assert before[:4] == b"\x89PNG"
    w.policy.value = "continuous"                    # what a learner does with the buttons
    assert w.label.value.startswith("continuous:")
    assert w.summary == timeline_summary(w.rows)
    assert w.image.value != before
    w.max_seqs.value = 1
    assert w.summary["mean_ttft_steps"] >= timeline_summary(
        w.rows_for("continuous", True, 2))["mean_ttft_steps"]
    with pytest.raises(ValueError, match="policy"):
        BatchingTimeline(*tiny, policy="fifo")
