"""The pipeline-timeline widget in Python: move a slider, the label and picture change."""

import pytest

from llminfra.parallel.pipeline import bubble_fraction
from llminfra.widgets.pipeline_timeline import (PipelineTimeline, recorded_timeline_png,
                                                timeline_data)


def test_timeline_data_by_hand():
    """p = 4, m = 8: makespan 11 t, busy 8 t per stage, bubble 3/11."""
    d = timeline_data(4, 8, stage_time_s=2.0)
    assert d["makespan_s"] == 22.0 and d["busy_s"] == 16.0
    assert d["bubble_formula"] == pytest.approx(3 / 11)
    assert d["bubble_measured"] == pytest.approx(3 / 11)
    assert len(d["events"]) == 32


def test_slider_changes_label_and_image():
    w = PipelineTimeline(n_stages=2, n_micro=1)
    assert "bubble (p-1)/(m+p-1) = 0.5000" in w.label.value
    png_before = w.image.value
    assert png_before[:4] == b"\x89PNG"
    w.micro_batches.value = 7  # what a learner does with the slider
    assert w.data["bubble_formula"] == pytest.approx(bubble_fraction(2, 7)) == 0.125
    assert "m=7 micro-batches" in w.label.value and "0.1250" in w.label.value
    assert w.image.value != png_before
    w.stages.value = 1
    assert "= 0.0000" in w.label.value


def test_bad_values_and_recorded_events():
    with pytest.raises(ValueError, match="n_micro"):
        PipelineTimeline(n_stages=2, n_micro=0)
    png = recorded_timeline_png([(0, 0, 0.0, 1.0), (1, 0, 1.0, 2.0)], 2)
    assert png[:4] == b"\x89PNG"
