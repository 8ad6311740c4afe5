"""The batching-timeline widget: choose static, dynamic or continuous batching (and chunked
prefill, and the batch size) and see the same small workload as a Gantt chart of requests over
engine steps, with its mean TTFT and makespan; under static and dynamic batching the steps in
which a finished request's row is still computed, as padding, are drawn in dark grey.

Thin wiring over pure functions: :func:`llminfra.sim.timeline.step_timeline` runs the real
engine on the tiny model with a step-counting clock (so the picture is the same on every
machine), :func:`timeline_text` says the numbers, :func:`llminfra.plots.serving.gantt_png`
draws them. Controls set an ``HTML`` line (it wraps where a ``Label`` would be cut at the
panel's edge) and an ``Image`` through ``observe`` callbacks (no ``interact``, no printing),
so it behaves the same in JupyterLab, in a test and under nbval.

Static vs iteration-level scheduling: Yu et al., 2022, *Orca*, OSDI '22.
Taught in chapter 05.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from llminfra.plots.serving import gantt_png
from llminfra.sim.timeline import demo_workload, step_timeline, timeline_summary
from llminfra.widgets.panel import Panel, natural_size

POLICIES = ("static", "dynamic", "continuous")


def timeline_text(policy: str, summary: dict) -> str:
    """One line: the policy, its mean queueing, TTFT, end-to-end and makespan in steps, and the
    row-steps its batches computed as padding (static and dynamic batching's waste)."""
    return (f"{policy}: {summary['num_requests']} requests, makespan "
            f"{summary['makespan_steps']:.0f} steps; mean queued "
            f"{summary['mean_queued_steps']:.4g}, "
            f"TTFT {summary['mean_ttft_steps']:.4g}, end-to-end {summary['mean_e2e_steps']:.4g} "
            f"steps; {summary['padding_row_steps']} padding row-steps")


class BatchingTimeline:
    """ipywidgets panel: ``policy`` (ToggleButtons), ``chunked`` (Checkbox), ``max_seqs``
    (IntSlider: the batch size), ``label``, ``image`` (PNG), ``widget`` (the ``VBox`` to
    show); ``rows``, ``summary`` and ``text`` hold the last result. Results are cached per
    setting; all policies share one x axis so their pictures compare directly."""

    def __init__(self, model, tokenizer, workload: list | None = None,
                 policy: str = "continuous", max_num_seqs: int = 4,
                 max_num_batched_tokens: int = 64, num_blocks: int = 64):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.model, self.tokenizer = model, tokenizer
        self.workload = workload or demo_workload()
        self.engine_kwargs = dict(max_num_batched_tokens=max_num_batched_tokens,
                                  num_blocks=num_blocks, dynamic_window_s=3.0)
        self._cache: dict = {}
        self.policy = widgets.ToggleButtons(options=POLICIES, value=policy,
                                            description="policy")
        self.chunked = widgets.Checkbox(value=True, description="chunked prefill")
        self.max_seqs = widgets.IntSlider(value=max_num_seqs, min=1, max=8,
                                          description="max batch", continuous_update=False)
        self.label = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.widget = Panel([self.policy, widgets.HBox([self.max_seqs, self.chunked]),
                             self.image, self.label], title="Batching timeline",
                            how="choose a policy, the max batch and chunked prefill; the engine's "
                                "steps are drawn as a Gantt chart")
        self.widget.add_class("llminfra-batching-timeline")
        for control in (self.policy, self.chunked, self.max_seqs):
            control.observe(self._on_change, names="value")
        self.update()

    def _on_change(self, change) -> None:
        self.update()

    def rows_for(self, policy: str, chunked: bool, max_num_seqs: int) -> list:
        """The timeline of one setting (computed once, then cached)."""
        key = (policy, chunked, max_num_seqs)
        if key not in self._cache:
            self._cache[key] = step_timeline(
                self.model, self.tokenizer, self.workload, policy=policy,
                enable_chunked_prefill=chunked, max_num_seqs=max_num_seqs,
                **self.engine_kwargs)
        return self._cache[key]

    def update(self) -> list:
        """Recompute from the controls; refresh ``label`` and ``image``; return the rows."""
        args = (self.chunked.value, self.max_seqs.value)
        self.rows = self.rows_for(self.policy.value, *args)
        x_max = max(r.finished_out for p in POLICIES for r in self.rows_for(p, *args))
        self.summary = timeline_summary(self.rows)
        self.text = timeline_text(self.policy.value, self.summary)
        self.label.value = html.escape(self.text)
        self.image.value = gantt_png(self.rows, title=f"{self.policy.value} batching, "
                                     f"max batch {args[1]}", x_max=x_max)
        natural_size(self.image)
        return self.rows
