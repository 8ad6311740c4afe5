"""The requirements form of chapter 10: state the service, see the plan and its checklist.

:func:`plan_html` renders a :class:`~llminfra.planning.Plan` (layout, estimates, cost, the
recommendation and the evaluated checklist) as HTML — a pure function tested from Python.
:class:`PlanForm` wires the inputs to it through ``observe`` (an ``HTML`` value and a ``Label``
summary; no ``interact``, no printing), so it behaves the same in JupyterLab, in a test and under
nbval. PlanPrices are inputs, labelled as examples.

Taught in chapter 10.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from llminfra.plots.table import format_number
from llminfra.widgets.panel import Panel
from llminfra.planning import PlanPrices, ServiceRequirements, plan_deployment
from llminfra.specs import gpu_names, model_names

_MARK = {True: "✓", False: "✗", None: "?"}
#: labels at their natural width (ipywidgets cuts them at 80 px otherwise)
_STYLE = {"description_width": "initial"}


def plan_html(plan) -> str:
    """The plan as HTML: a summary table and the checklist (✓ met, ✗ not met, ? to measure)."""
    rows = [("layout", f"{plan.replicas} replica(s) × {plan.tensor_parallel} {plan.gpu} "
                       f"= {plan.total_gpus} GPU(s)"),
            ("batch per replica (KV room)", f"{plan.batch_per_replica} of "
                                            f"{plan.max_sequences_per_replica} sequences"),
            ("TTFT estimate", f"{format_number(plan.ttft_estimate_s * 1e3, 3)} ms"),
            ("time per output token", f"{format_number(plan.tpot_estimate_s * 1e3, 3)} ms"),
            ("utilisation", f"{plan.utilization:.0%}"),
            ("self-hosted, rented", f"{plan.selfhost_monthly_usd:,.0f} USD / month"),
            ("hosted API", f"{plan.api_monthly_usd:,.0f} USD / month"),
            ("recommendation", plan.recommendation),
            ("budget", f"{plan.budget_usd_per_month:,.0f} USD / month: "
                       + ("the recommendation fits it" if plan.within_budget else
                          f"the recommendation is {plan.recommended_monthly_usd - plan.budget_usd_per_month:,.0f}"
                          " USD over it"))]
    summary = "".join(f"<tr><td style='text-align:left'>{html.escape(k)}</td>"
                      f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in rows)
    checks = "".join(
        f"<tr><td style='text-align:left'>{html.escape(r['group'])}</td>"
        f"<td style='text-align:left'>{html.escape(r['check'])}</td>"
        f"<td style='text-align:left'>{_MARK[r['ok']]}</td>"
        f"<td style='text-align:left'>{html.escape(r['number'])}</td></tr>"
        for r in plan.checklist)
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in plan.reasons)
    return (f"<table>{summary}</table><ul>{reasons}</ul>"
            "<table><thead><tr>" + "".join(f"<th style='text-align:left'>{h}</th>"
                                           for h in ("group", "check", "ok", "number")) + "</tr>"
            f"</thead><tbody>{checks}</tbody></table>")


class PlanForm:
    """Inputs for :class:`~llminfra.planning.ServiceRequirements`, a GPU and example prices; ``plan``
    is the current :class:`~llminfra.planning.Plan` (None when the inputs are invalid, with the
    reason in ``summary``), ``widget`` the ``VBox`` to display."""

    def __init__(self, req: ServiceRequirements, gpu: str = "h100", prices: PlanPrices | None = None):
        prices = prices or PlanPrices(3.0, 15.0, 3.0)
        # the price field holds one GPU's price at a time: moving the GPU sets it to that GPU's
        # example price (where there is one), and the learner may type over it
        self.requests = widgets.IntText(value=int(req.requests_per_day), description="requests/day", style=_STYLE)
        self.input_tokens = widgets.IntText(value=req.input_tokens, description="input tokens", style=_STYLE)
        self.output_tokens = widgets.IntText(value=req.output_tokens, description="output tokens", style=_STYLE)
        self.ttft = widgets.FloatText(value=req.ttft_target_s, description="TTFT target s", style=_STYLE)
        self.may_leave = widgets.Checkbox(value=req.data_may_leave, description="data may leave", style=_STYLE)
        self.budget = widgets.FloatText(value=req.budget_usd_per_month, description="budget USD/mo", style=_STYLE)
        self.model = widgets.Dropdown(options=model_names(), value=req.model, description="model", style=_STYLE)
        self.dtype = widgets.Dropdown(options=["bf16", "fp8", "int8", "int4"], value=req.dtype,
                                      description="weights", style=_STYLE)
        self.gpu = widgets.Dropdown(options=gpu_names(), value=gpu, description="GPU", style=_STYLE)
        self.examples = prices
        self.gpu_hour = widgets.FloatText(value=self._example_price(gpu), description="GPU USD/h",
                                          style=_STYLE)
        self.api_in = widgets.FloatText(value=prices.api_input_per_million, description="API in /M", style=_STYLE)
        self.api_out = widgets.FloatText(value=prices.api_output_per_million, description="API out /M", style=_STYLE)
        self.peak = req.peak_to_mean
        self.summary = widgets.Label()
        self.html = widgets.HTML()
        controls = [self.requests, self.input_tokens, self.output_tokens, self.ttft, self.may_leave,
                    self.budget, self.model, self.dtype, self.gpu, self.gpu_hour, self.api_in,
                    self.api_out]
        self.gpu.observe(self._gpu_changed, names="value")   # first: its price follows the GPU
        for w in controls:
            w.observe(self._update, names="value")
        # rows that wrap onto a second line in a narrow notebook column instead of overflowing it
        rows = [widgets.HBox(controls[i:j], layout=widgets.Layout(flex_flow="row wrap"))
                for i, j in ((0, 4), (4, 8), (8, len(controls)))]
        self.widget = Panel([*rows, self.summary, self.html],
                            title="Deployment plan", how="state the requirements, the GPU and "
                            "the prices; the plan, its cost and its checklist follow")
        self._update()

    def _example_price(self, gpu: str) -> float:
        """The example price of ``gpu`` (its own, else the one for every GPU; 0 if neither: the
        learner types one in)."""
        try:
            return self.examples.gpu_hour(gpu)
        except KeyError:
            return 0.0

    def _gpu_changed(self, change) -> None:
        """Another GPU: the price field shows that GPU's example price (0 where it has none)."""
        self.gpu_hour.value = self._example_price(change["new"])

    def _update(self, _change=None) -> None:
        try:
            req = ServiceRequirements(self.requests.value, self.input_tokens.value, self.output_tokens.value,
                               ttft_target_s=self.ttft.value, data_may_leave=self.may_leave.value,
                               budget_usd_per_month=self.budget.value, model=self.model.value,
                               dtype=self.dtype.value, peak_to_mean=self.peak)
            prices = PlanPrices(self.api_in.value, self.api_out.value, self.gpu_hour.value,
                            "example prices entered in the form")
            self.plan = plan_deployment(req, self.gpu.value, prices)
        except (ValueError, KeyError) as e:
            self.plan = None
            self.summary.value = f"cannot plan: {e.args[0] if e.args else e}"
            self.html.value = ""
            return
        p = self.plan
        self.summary.value = (f"{p.recommendation}: {p.total_gpus} × {p.gpu}, TTFT ≈ "
                              f"{format_number(p.ttft_estimate_s * 1e3, 3)} ms, API {p.api_monthly_usd:,.0f} vs "
                              f"rented {p.selfhost_monthly_usd:,.0f} USD / month; "
                              + ("within" if p.within_budget else "OVER") + " the budget of "
                              f"{p.budget_usd_per_month:,.0f}")
        if self.gpu_hour.value == 0:
            self.summary.value += f" (no example price for {p.gpu}: type its USD per hour)"
        self.html.value = plan_html(p)
