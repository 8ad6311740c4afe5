"""The pipeline-timeline widget: stages p and micro-batches m -> the GPipe schedule (stages ×
time, one box per micro-batch, the bubble shaded) and its bubble fraction.

Thin wiring over pure functions: :func:`timeline_data` returns the schedule and the numbers
(:func:`llminfra.parallel.pipeline.gpipe_schedule`, ``bubble_fraction``, ``measured_bubble``),
:func:`summary_text` says them, :func:`llminfra.plots.parallel.timeline_png` draws them.
:class:`PipelineTimeline` connects two sliders to those through ``observe`` callbacks that set a
``Label`` and an ``Image`` (no ``interact``, no printing), so it behaves the same in JupyterLab,
in a test and under nbval. A recorded timeline (real processes) can be shown with ``events=``.

GPipe: Huang et al., 2019, arXiv:1811.06965, §2.2. Taught in chapter 07.
"""

from __future__ import annotations

import ipywidgets as widgets

from llminfra.parallel.pipeline import (StageEvent, bubble_fraction, gpipe_schedule,
                                        measured_bubble)
from llminfra.plots.parallel import timeline_png
from llminfra.widgets.panel import Panel, natural_size

MAX_STAGES = 8
MAX_MICRO = 32


def timeline_data(n_stages: int, n_micro: int, stage_time_s: float = 1.0) -> dict:
    """The ideal GPipe timeline and its numbers: ``events``, ``bubble_formula``
    (``(p-1)/(m+p-1)``), ``bubble_measured`` (from the events: equal here), ``makespan_s``
    (``(m+p-1)·t``), ``busy_s`` per stage (``m·t``). p = 4, m = 8: bubble 3/11 = 0.2727."""
    events = gpipe_schedule(n_stages, n_micro, stage_time_s)
    return {"n_stages": n_stages, "n_micro": n_micro, "events": events,
            "bubble_formula": bubble_fraction(n_stages, n_micro),
            "bubble_measured": measured_bubble(events, n_stages),
            "makespan_s": (n_micro + n_stages - 1) * stage_time_s,
            "busy_s": n_micro * stage_time_s}


def summary_text(data: dict) -> str:
    """One line: p, m, makespan in stage times, bubble by formula and from the timeline."""
    p, m = data["n_stages"], data["n_micro"]
    return (f"p={p} stages, m={m} micro-batches: makespan (m+p-1)={m + p - 1} stage times, "
            f"bubble (p-1)/(m+p-1) = {data['bubble_formula']:.4f}, "
            f"from the timeline {data['bubble_measured']:.4f}")


class PipelineTimeline:
    """ipywidgets panel over :func:`timeline_data`: sliders ``stages`` and ``micro_batches``,
    ``label`` (``Label``), ``image`` (``Image``, PNG), ``widget`` (the ``VBox`` to show),
    ``data`` and ``text`` (the last result and its summary)."""

    def __init__(self, n_stages: int = 4, n_micro: int = 4):
        bubble_fraction(n_stages, n_micro)  # bad values: ValueError before any widget exists
        self.stages = widgets.IntSlider(value=n_stages, min=1, max=MAX_STAGES,
                                        description="stages p", continuous_update=False)
        self.micro_batches = widgets.IntSlider(value=n_micro, min=1, max=MAX_MICRO,
                                               description="micro m", continuous_update=False)
        self.label = widgets.Label()
        self.image = widgets.Image(format="png")
        self.widget = Panel([widgets.HBox([self.stages, self.micro_batches]),
                             self.image, self.label], title="Pipeline timeline (GPipe)",
                            how="move stages p and micro-batches m; the schedule and its bubble")
        self.widget.add_class("llminfra-pipeline-timeline")
        for control in (self.stages, self.micro_batches):
            control.observe(self._on_change, names="value")
        self.update()

    def _on_change(self, change) -> None:
        self.update()

    def update(self) -> dict:
        """Recompute from the sliders; refresh ``label`` and ``image``; return the data."""
        self.data = timeline_data(self.stages.value, self.micro_batches.value)
        self.text = summary_text(self.data)
        self.label.value = self.text
        self.image.value = timeline_png(self.data["events"], self.stages.value,
                                        time_unit="stage times")
        natural_size(self.image)
        return self.data


def recorded_timeline_png(events: list, n_stages: int, title: str | None = None) -> bytes:
    """A timeline recorded by real ranks (``(stage, micro_batch, start_s, end_s)`` tuples or
    :class:`StageEvent`) as PNG bytes, for an ``Image`` widget or ``IPython.display.Image``."""
    evs = [e if isinstance(e, StageEvent) else StageEvent(*e) for e in events]
    return timeline_png(evs, n_stages, title)
