"""The batching timeline (real engine, tiny model, step clock), its Gantt plot and its widget:
move a control, the label and picture change."""

import matplotlib
import pytest
from matplotlib.figure import Figure

from llminfra.model import load_tiny
from llminfra.plots.serving import gantt_png, plot_gantt, plot_latency_throughput
from llminfra.sim.timeline import (WorkItem, demo_workload, step_timeline,
                                   timeline_summary)
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


def test_static_pads_early_finishers_until_their_batch_ends(timelines):
    """Static: a request that finishes before its batch's longest member is padded in every
    step from its finish to that member's last step; the last to finish, and every request
    under continuous batching, is never padded."""
    rows = timelines["static"]
    assert sum(len(r.padding_steps) for r in rows) > 0
    for r in rows:
        if not r.padding_steps:
            continue
        batch = [b for b in rows if b.first_scheduled < r.finished_out
                 and r.first_scheduled < b.finished_out]     # ran alongside r
        end = max(b.finished_out for b in batch)
        assert r.padding_steps == tuple(float(k) for k in range(int(r.finished_out), int(end)))
    assert all(r.padding_steps == () for r in timelines["continuous"])
    assert timeline_summary(rows)["padding_row_steps"] == sum(len(r.padding_steps) for r in rows)


def test_continuous_beats_static_on_ttft_and_makespan(timelines):
    s, c = (timeline_summary(timelines[p]) for p in ("static", "continuous"))
    assert c["mean_ttft_steps"] < s["mean_ttft_steps"]
    assert c["makespan_steps"] <= s["makespan_steps"]


def test_summary_by_hand():
    """Two rows: queued 1 and 0, TTFT 2 and 1, e2e 5 and 3, makespan 6 - 0; row 0 is padded
    in step 5 while row 1 decodes its last token: 1 padding row-step."""
    from llminfra.sim.timeline import TimelineRow
    rows = [TimelineRow("0", 4, 3, 0.0, 1.0, 2.0, 5.0, (1.0, 3.0, 4.0), (5.0,)),
            TimelineRow("1", 4, 2, 3.0, 3.0, 4.0, 6.0, (3.0, 5.0))]
    s = timeline_summary(rows)
    assert s == {"num_requests": 2, "makespan_steps": 6.0, "mean_queued_steps": 0.5,
                 "mean_ttft_steps": 1.5, "mean_e2e_steps": 4.0, "padding_row_steps": 1}


def test_plots(timelines):
    png = gantt_png(timelines["continuous"], title="continuous")
    assert png[:4] == b"\x89PNG"
    ax = plot_gantt(timelines["static"], Figure().add_subplot())
    assert ax.get_xlabel() == "engine step" and len(ax.get_yticks()) == 8
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["queued", "prefill", "decode", "padding"]
    grey = [p for p in ax.patches if p.get_facecolor()[:3] == (0x59 / 255,) * 3]
    padded = sum(len(r.padding_steps) for r in timelines["static"])
    assert padded > 0 and sum(p.get_width() for p in grey) == padded   # one bar-step per step
    pts = [{"concurrency": c, "output_tokens_per_s": 100.0 * c, "tpot_s": {"p50": 0.01 * c}}
           for c in (1, 4, 16)]
    ax = plot_latency_throughput(pts, Figure().add_subplot())
    assert list(ax.get_xticks()) == [100.0, 400.0, 1600.0]
    assert "ms" in ax.get_ylabel() and "tokens/s" in ax.get_xlabel()


def test_widget_controls_change_label_and_image(tiny):
    w = BatchingTimeline(*tiny, workload=[WorkItem(20, 6, 0), WorkItem(8, 2, 1),
                                          WorkItem(30, 4, 2)], policy="static", max_num_seqs=2)
    assert w.text.startswith("static: 3 requests") and w.label.value == w.text
    # req 0 runs alone (req 1 arrives a step later); req 1 and 2 both start at step 6, req 1's
    # 2 tokens are out at 8, req 2's 4 at 10: req 1 is padded in steps 8 and 9
    assert w.text.endswith("; 2 padding row-steps")
    assert [r.padding_steps for r in w.rows] == [(), (8.0, 9.0), ()]
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
