"""The deployment-advisor widget: volume, request shape, data rules, team, load shape ->
the four ways to deploy ranked, each with its monthly cost and its reasons.

Thin wiring over pure functions: :func:`advise` returns the numbers (the volume from
:func:`llminfra.calc.cost.api_monthly_cost`, the ranking from
:func:`llminfra.calc.deployment.rank_deployments`) and :func:`advice_html` says them as a table.
:class:`DeploymentAdvisor` connects ipywidgets controls to those through ``observe`` callbacks
that set an ``HTML`` value (no ``interact``, no printing), so it behaves the same in
JupyterLab, in a test, and under nbval. The prices are constructor inputs: the notebook passes
examples labelled with their date and source, never "current" prices.

Taught in chapter 09 (``notebooks/09_deployment_and_cost.ipynb``).
"""

from __future__ import annotations

import dataclasses
import html

import ipywidgets as widgets

from llminfra.widgets.panel import Panel
from llminfra.calc.cost import api_monthly_cost, blended_price_per_million
from llminfra.calc.deployment import Prices, Requirements, millions, rank_deployments

#: the names the table shows for each option
OPTION_NAMES = {"api": "hosted API", "rented": "rented cloud GPUs", "own": "own servers",
                "local": "local (PC / laptop)"}
#: the requests-a-day slider's stops: round numbers 1, 2, 5, 10, ... 10,000,000 (a log slider's
#: quarter steps landed on 177,828)
REQUESTS_PER_DAY = tuple(m * 10 ** e for e in range(7) for m in (1, 2, 5)) + (10_000_000,)


def advise(prices: Prices, requests_per_day: float, input_tokens: float, output_tokens: float,
           data_may_leave: bool = True, needs_open_weights: bool = False,
           has_gpu_team: bool = False, single_user: bool = False,
           utilization: float = 0.5,
           api_prices_per_million: tuple[float, float] | None = None) -> dict:
    """Everything the advisor shows, as data: ``monthly_tokens`` (input + output over 30 days),
    ``api_usd_per_million`` (the API price used) and ``ranking`` (a list of
    :class:`~llminfra.calc.deployment.RankedOption`, best first).

    With ``api_prices_per_million = (p_in, p_out)`` the API price is blended from this request
    mix (:func:`~llminfra.calc.cost.blended_price_per_million`), replacing
    ``prices.api_usd_per_million``. 1,000 requests a day of 2,000 + 500 tokens: 75,000,000
    tokens a month (source 000); at 3 / 15 USD per million, 5.4 USD per million blended.
    """
    bill = api_monthly_cost(requests_per_day, input_tokens, output_tokens, 0, 0)
    tokens = bill.monthly_input_tokens + bill.monthly_output_tokens
    if api_prices_per_million is not None and input_tokens + output_tokens > 0:
        blended = blended_price_per_million(input_tokens, output_tokens,
                                            *api_prices_per_million)
        prices = dataclasses.replace(prices, api_usd_per_million=blended)
    req = Requirements(tokens, data_may_leave=data_may_leave,
                       needs_open_weights=needs_open_weights, has_gpu_team=has_gpu_team,
                       single_user=single_user, utilization=utilization)
    return {"monthly_tokens": tokens, "api_usd_per_million": prices.api_usd_per_million,
            "ranking": rank_deployments(req, prices)}


def advice_lines(data: dict) -> list[str]:
    """The ranking as plain lines: rank, option, monthly cost (USD), GPUs, reasons."""
    lines = [f"{millions(data['monthly_tokens'])} M tokens a month (input + output)"]
    rank = 0
    for r in data["ranking"]:
        cost = "-" if r.monthly_cost_usd is None else f"{r.monthly_cost_usd:,.0f} USD/month"
        if r.feasible:
            rank += 1
        head = f"{rank}." if r.feasible else "x "
        gpus = f", {r.n_gpus:,} GPU(s)" if r.n_gpus else ""
        lines.append(f"{head} {OPTION_NAMES[r.option]}: {cost}{gpus}; " + "; ".join(r.reasons))
    return lines


_LEFT, _RIGHT = "style='text-align:left'", "style='text-align:right'"
#: the table's columns: header, alignment (numbers right, text left)
_COLUMNS = (("rank", _LEFT), ("option", _LEFT), ("USD per month", _RIGHT), ("GPUs", _RIGHT),
            ("reasons", _LEFT))


def advice_html(data: dict) -> str:
    """:func:`advice_lines` as an HTML table (infeasible options greyed, the first in bold).
    Every cell says its alignment (a widget's HTML gets none of JupyterLab's table styles):
    numbers right, text left; a missing number is "—"."""
    rows, rank = [], 0
    for r in data["ranking"]:
        rank += r.feasible
        name = html.escape(OPTION_NAMES[r.option])
        if r.feasible and rank == 1:
            name = f"<b>{name}</b>"
        cells = (rank if r.feasible else "x", name,
                 "—" if r.monthly_cost_usd is None else f"{r.monthly_cost_usd:,.0f}",
                 f"{r.n_gpus:,}" if r.n_gpus else "—", html.escape("; ".join(r.reasons)))
        style = "" if r.feasible else " style='color:#888'"
        rows.append(f"<tr{style}>" + "".join(f"<td {align}>{cell}</td>" for cell, (_, align)
                                              in zip(cells, _COLUMNS)) + "</tr>")
    head = "<tr>" + "".join(f"<th {align}>{name}</th>" for name, align in _COLUMNS) + "</tr>"
    return (f"<div>{millions(data['monthly_tokens'])} M tokens a month (input + output)</div>"
            f"<table style='font-size:12px; border-collapse:separate; border-spacing:14px 2px'>"
            f"{head}{''.join(rows)}</table>")


class DeploymentAdvisor:
    """ipywidgets panel over :func:`advise`.

    Attributes: ``controls`` (dict name -> widget: ``requests_per_day``, ``input_tokens``,
    ``output_tokens``, ``utilization``, ``data_may_leave``, ``needs_open_weights``,
    ``has_gpu_team``, ``single_user``), ``summary`` (``HTML``), ``widget`` (the ``VBox`` to
    display), ``data`` (the last :func:`advise`) and ``text`` (its lines joined). Give
    ``api_prices_per_million = (p_in, p_out)`` to price the API from the sliders' request mix.
    """

    def __init__(self, prices: Prices, api_prices_per_million: tuple[float, float] | None = None,
                 requests_per_day: float = 1000, input_tokens: int = 2000,
                 output_tokens: int = 500, utilization: float = 0.5, data_may_leave: bool = True,
                 needs_open_weights: bool = False, has_gpu_team: bool = False,
                 single_user: bool = False):
        if not isinstance(prices, Prices):
            raise ValueError(f"prices must be a llminfra.calc.deployment.Prices, "
                             f"got {type(prices).__name__}")
        self.prices = prices
        self.api_prices_per_million = api_prices_per_million
        if requests_per_day not in REQUESTS_PER_DAY:
            raise ValueError(f"requests_per_day must be one of the slider's round stops "
                             f"(1, 2, 5, 10, 20, 50, ... 10,000,000), got {requests_per_day!r}")
        style = {"description_width": "130px"}
        layout = widgets.Layout(width="420px")
        # a checkbox's label gets its own width (the default box cut "needs an open-weights mo…")
        box = {"indent": False, "layout": widgets.Layout(width="auto", margin="0 24px 0 0")}
        self.controls = {
            "requests_per_day": widgets.SelectionSlider(
                options=[(f"{n:,}", n) for n in REQUESTS_PER_DAY], value=requests_per_day,
                description="requests / day", style=style, layout=layout,
                continuous_update=False),
            "input_tokens": widgets.IntSlider(value=input_tokens, min=0, max=32_000, step=100,
                                              description="input tokens", style=style,
                                              layout=layout, continuous_update=False),
            "output_tokens": widgets.IntSlider(value=output_tokens, min=0, max=8_000, step=50,
                                               description="output tokens", style=style,
                                               layout=layout, continuous_update=False),
            "utilization": widgets.FloatSlider(value=utilization, min=0.05, max=1.0, step=0.05,
                                               description="average load", style=style,
                                               layout=layout, continuous_update=False,
                                               readout_format=".0%"),
            "data_may_leave": widgets.Checkbox(value=data_may_leave,
                                               description="data may leave the company",
                                               **box),
            "needs_open_weights": widgets.Checkbox(value=needs_open_weights,
                                                   description="needs an open-weights model",
                                                   **box),
            "has_gpu_team": widgets.Checkbox(value=has_gpu_team,
                                             description="a team can run GPU servers",
                                             **box),
            "single_user": widgets.Checkbox(value=single_user, description="one user only",
                                            **box),
        }
        self.summary = widgets.HTML()
        self.summary.add_class("llminfra-deployment-summary")
        c = self.controls
        self.widget = Panel(title="Deployment advisor", how="set the volume, the request shape "
                            "and the rules; the four ways to deploy are ranked", children=[
            c["requests_per_day"], c["input_tokens"], c["output_tokens"], c["utilization"],
            widgets.HBox([c["data_may_leave"], c["needs_open_weights"]]),
            widgets.HBox([c["has_gpu_team"], c["single_user"]]), self.summary])
        self.widget.add_class("llminfra-deployment-advisor")
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self.update()

    def _on_change(self, change) -> None:
        self.update()

    def values(self) -> dict:
        """The controls' current values, as keyword arguments of :func:`advise`."""
        return {name: control.value for name, control in self.controls.items()}

    def update(self) -> dict:
        """Recompute from the controls; refresh ``summary``; return the data."""
        self.data = advise(self.prices, **self.values(),
                           api_prices_per_million=self.api_prices_per_million)
        self.text = "\n".join(advice_lines(self.data))
        self.summary.value = advice_html(self.data)
        return self.data
