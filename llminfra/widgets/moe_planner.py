"""The expert-parallel planner: a mixture-of-experts model, GPUs, experts per token and tokens
per GPU -> weights per GPU and the all-to-all bytes (and time) of one step, beside tensor
parallelism over the same GPUs; and, as a training-time what-if, the share of assignments a
capacity factor would drop (serving engines drop none).

Thin wiring over :func:`llminfra.calc.expert_parallel.expert_parallel_plan`; :func:`plan_lines`
says its result in a few lines. :class:`MoEPlanner` connects the controls through ``observe``
callbacks that set an ``HTML`` table and a ``Label`` (no ``interact``, no printing), so it
behaves the same in JupyterLab, in a test and under nbval. Taught in chapter 11.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from llminfra.calc.communication import interconnects
from llminfra.calc.expert_parallel import expert_parallel_plan
from llminfra.plots.table import format_number
from llminfra.specs import get_model, gpu_names, model_names
from llminfra.widgets.panel import Panel


def moe_presets() -> list[str]:
    """The catalog's mixture-of-experts presets."""
    return [n for n in model_names() if get_model(n).is_moe]


def ep_choices(model: str) -> list[int]:
    """GPU counts that divide the model's experts: 1, 2, 4, … up to E."""
    E = get_model(model).num_experts
    return [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n <= E and E % n == 0]


def plan_lines(plan: dict) -> list[str]:
    """The plan in words: experts and weights per GPU, all-to-all per step, TP beside it."""
    gb = 1e9
    fits = "fits" if plan["fits"] else "does NOT fit"
    return [
        f"{plan['model']} over {plan['ep']} GPUs: {plan['experts_per_gpu']} of "
        f"{plan['num_experts']} experts per MoE layer on each, weights "
        f"{format_number(plan['weight_bytes_per_gpu'] / gb)} GB per GPU ({fits} in one "
        f"{plan['gpu']}'s {format_number(plan['gpu_memory_bytes'] / gb)} GB)",
        f"all-to-all per step, {plan['tokens']} tokens per GPU, top-{plan['top_k']}: "
        f"{format_number(plan['a2a_bytes_per_step'] / 1e6)} MB sent per GPU, "
        f"{format_number(plan['a2a_time_s'] * 1e6)} µs over {plan['interconnect']}",
        f"tensor parallel over the same GPUs: {format_number(plan['tp_weight_bytes_per_gpu'] / gb)} GB "
        f"per GPU, all-reduces {format_number(plan['tp_allreduce_bytes_per_step'] / 1e6)} MB, "
        f"{format_number(plan['tp_allreduce_time_s'] * 1e6)} µs",
    ] + _capacity_lines(plan)


def _capacity_lines(plan: dict) -> list[str]:
    """The training-time what-if, only when a capacity factor is set."""
    if plan.get("capacity_factor") is None:
        return []
    return [f"training-time what-if, capacity factor {plan['capacity_factor']:g}: "
            f"{plan['overflow_fraction_training']:.2%} of the step's "
            f"{plan['tokens'] * plan['ep'] * plan['top_k']:,} (token, expert) assignments "
            f"would be dropped under uniform routing — serving engines drop none (they "
            f"compute every routed token and balance load with redundant experts)"]


def _table(plan: dict) -> str:
    rows = [("experts per GPU (per MoE layer)", f"{plan['experts_per_gpu']}"),
            ("weights per GPU, expert parallel (GB)", f"{format_number(plan['weight_bytes_per_gpu'] / 1e9)}"),
            ("weights per GPU, tensor parallel (GB)",
             f"{format_number(plan['tp_weight_bytes_per_gpu'] / 1e9)}"),
            ("all-to-all sent per GPU per step (MB)", f"{format_number(plan['a2a_bytes_per_step'] / 1e6)}"),
            ("TP all-reduce per step (MB)", f"{format_number(plan['tp_allreduce_bytes_per_step'] / 1e6)}"),
            (f"all-to-all time (µs, {plan['interconnect']})", f"{format_number(plan['a2a_time_s'] * 1e6)}"),
            ("TP all-reduce time (µs)", f"{format_number(plan['tp_allreduce_time_s'] * 1e6)}")]
    body = "".join(f"<tr><td style='text-align:left'>{html.escape(k)}</td>"
                   f"<td style='text-align:right'>{v}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


class MoEPlanner:
    """ipywidgets panel over :func:`expert_parallel_plan`: ``model``, ``gpus`` (a slider over
    the GPU counts that divide E), ``top_k``, ``tokens``, ``gpu``, ``link``, ``capacity`` (a
    training-time what-if: 0, the default, is none, as in serving); ``table`` (HTML),
    ``label``; ``widget`` (the panel to show); ``plan`` and ``lines`` (the last result)."""

    def __init__(self, model: str = "mixtral-8x7b", ep: int = 8, tokens: int = 64,
                 gpu: str = "h100", link: str = "nvlink-h100"):
        expert_parallel_plan(model, ep, tokens=tokens, gpu=gpu, interconnect=link)  # bad values
        self.model = widgets.Dropdown(options=moe_presets(), value=get_model(model).name,
                                      description="model")
        self.gpus = widgets.SelectionSlider(options=ep_choices(model), value=ep,
                                            description="GPUs", continuous_update=False)
        self.top_k = widgets.IntSlider(value=get_model(model).experts_per_token, min=1,
                                       max=min(16, get_model(model).num_experts),
                                       description="top-k", continuous_update=False)
        self.tokens = widgets.IntSlider(value=tokens, min=1, max=4096, step=1,
                                        description="tokens/GPU", continuous_update=False)
        self.gpu = widgets.Dropdown(options=gpu_names(), value=gpu, description="GPU")
        self.link = widgets.Dropdown(options=list(interconnects()), value=link,
                                     description="link")
        self.capacity = widgets.FloatSlider(value=0.0, min=0.0, max=2.0, step=0.25,
                                            description="capacity", continuous_update=False,
                                            tooltip="training-time what-if: a capacity factor "
                                                    "(0 = none, as in serving)")
        self.capacity_note = widgets.HTML("capacity factor: a <b>training</b>-time what-if "
                                          "(GShard, Switch); 0 = none, as every serving "
                                          "engine runs")
        self.table, self.label = widgets.HTML(), widgets.HTML()
        self._quiet = False
        self.widget = Panel([widgets.HBox([self.model, self.gpu, self.link]),
                             widgets.HBox([self.gpus, self.top_k, self.tokens]),
                             widgets.HBox([self.capacity, self.capacity_note]),
                             self.table, self.label], title="Expert-parallel planner",
                            how="pick a MoE model and move GPUs, top-k, tokens per GPU")
        self.widget.add_class("llminfra-moe-planner")
        self.model.observe(self._on_model, names="value")
        for c in (self.gpus, self.top_k, self.tokens, self.gpu, self.link, self.capacity):
            c.observe(self._on_change, names="value")
        self.update()

    def _on_model(self, change) -> None:
        spec = get_model(change["new"])
        self._quiet = True                   # one update after every control is set
        choices = ep_choices(spec.name)
        self.gpus.options = choices
        self.gpus.value = max(n for n in choices if n <= 8)
        self.top_k.max = min(16, spec.num_experts)
        self.top_k.value = spec.experts_per_token
        self._quiet = False
        self.update()

    def _on_change(self, change) -> None:
        if not self._quiet:
            self.update()

    def update(self) -> dict:
        """Recompute from the controls; refresh ``table`` and ``label``; return the plan."""
        self.plan = expert_parallel_plan(self.model.value, self.gpus.value,
                                         tokens=self.tokens.value, top_k=self.top_k.value,
                                         gpu=self.gpu.value, interconnect=self.link.value,
                                         capacity_factor=self.capacity.value or None)
        self.lines = plan_lines(self.plan)
        self.table.value = _table(self.plan)
        self.label.value = "<br>".join(html.escape(line) for line in self.lines)
        return self.plan
