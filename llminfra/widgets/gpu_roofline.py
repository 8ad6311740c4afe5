"""The chapter 08 widget: model, weight dtype, context, concurrency, GPU and GPU count, hourly
price -> does it fit, the decode tokens/s bound, a TTFT estimate and the cost per million tokens.

Thin wiring over a pure function, :func:`serving_estimate`, which only combines the package's
answers: :func:`llminfra.calc.memory.kv_budget` (what fits), :mod:`llminfra.calc.roofline` (the
step times, with tensor parallelism over ``num_gpus``) and
:func:`llminfra.calc.cost.selfhost_cost_per_million_tokens`. :class:`RooflineCalculator`
connects ipywidgets controls to it through ``observe`` callbacks that set an ``HTML`` value and
an ``Image`` value (the roofline with the decode and prefill steps placed on it), so it runs the
same in JupyterLab, in a test and under nbval. Chapter 08.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from llminfra.calc.cost import selfhost_cost_per_million_tokens
from llminfra.calc.memory import kv_budget
from llminfra.calc.roofline import (decode_batch, device_roofline, prefill_batch,
                                    step_breakdown)
from llminfra.plots.roofline import roofline_png
from llminfra.plots.table import format_number
from llminfra.specs.gpus import get_gpu, gpu_names
from llminfra.specs.models import get_model, model_names
from llminfra.widgets.panel import Panel, natural_size

WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4")


def serving_estimate(model: str, gpu: str, dtype: str = "bf16", context: int = 2048,
                     concurrency: int = 1, num_gpus: int = 1,
                     gpu_hour_price_usd: float = 2.0) -> dict:
    """Everything the widget shows, as data.

    ``fits`` (``concurrency <= max_sequences`` of :func:`~llminfra.calc.memory.kv_budget` on
    ``num_gpus`` cards), ``decode`` and ``prefill`` (:func:`~llminfra.calc.roofline.
    step_breakdown` of ``concurrency`` sequences at ``context`` and of one ``context``-token
    prompt, ``tensor_parallel = num_gpus``), ``tpot_ms``, ``tokens_per_s`` (all sequences
    together), ``ttft_ms`` (an idle server's prefill) and ``usd_per_million_tokens`` at
    ``gpu_hour_price_usd`` per GPU hour and full utilization.

    Llama-2-7B bf16 on one H100 (3.35 TB/s), batch 1 at 2048 tokens: bytes 13,476,831,232 +
    2048 · 524,288 = 14,550,573,056 -> 4.343 ms per token, 230.2 tokens/s; at 2 USD/h:
    2 / (230.2 · 3600) · 1e6 = 2.413 USD per million tokens.
    """
    budget = kv_budget(model, gpu, dtype, context=context, num_gpus=num_gpus)
    kw = {"dtype": dtype, "tensor_parallel": num_gpus}
    decode = step_breakdown(model, gpu, decode_batch(concurrency, context), **kw)
    prefill = step_breakdown(model, gpu, prefill_batch(context), **kw)
    tokens_per_s = concurrency / decode["time_s"]
    return {"model": get_model(model).name, "gpu": get_gpu(gpu).name, "dtype": dtype,
            "context": context, "concurrency": concurrency, "num_gpus": num_gpus,
            "gpu_hour_price_usd": gpu_hour_price_usd, "fits": concurrency <= budget.max_sequences,
            "max_sequences": budget.max_sequences, "kv_budget_bytes": budget.kv_budget_bytes,
            "weight_bytes": budget.weight_bytes, "gpu_memory_bytes": budget.gpu_memory_bytes,
            "decode": decode, "prefill": prefill, "tpot_ms": decode["time_s"] * 1e3,
            "tokens_per_s": tokens_per_s, "ttft_ms": prefill["time_s"] * 1e3,
            "usd_per_million_tokens": selfhost_cost_per_million_tokens(
                gpu_hour_price_usd, tokens_per_s, n_gpus=num_gpus),
            "gpu_confidence": get_gpu(gpu).confidence}


def summary_lines(d: dict) -> list[str]:
    """The estimate as plain lines (GB = 1e9 bytes, GiB = 2**30 bytes)."""
    verdict = "FITS" if d["fits"] else "DOES NOT FIT"
    return [
        f"{d['model']} in {d['dtype']} on {d['num_gpus']} x {d['gpu']} [{d['gpu_confidence']}], "
        f"context {d['context']}, {d['concurrency']} sequence{'s' if d['concurrency'] != 1 else ''} at once",
        f"memory: {d['gpu_memory_bytes'] / 2**30:.4g} GiB, "
        f"weights {d['weight_bytes'] / 1e9:.4g} GB,"
        f" KV budget {d['kv_budget_bytes'] / 1e9:.4g} GB = room for {d['max_sequences']} sequences",
        f"decode bound: {format_number(d['tpot_ms'], 3)} ms per step ({d['decode']['bound']}-bound), "
        f"{format_number(d['tokens_per_s'])} tokens/s in all",
        f"TTFT estimate (idle server, {d['context']}-token prompt): {format_number(d['ttft_ms'], 3)} ms "
        f"({d['prefill']['bound']}-bound)",
        f"cost at {d['gpu_hour_price_usd']:g} USD per GPU hour, fully busy: "
        f"{format_number(d['usd_per_million_tokens'], 3)} USD per million generated tokens",
        f"{verdict}",
    ]


def summary_text(d: dict) -> str:
    """:func:`summary_lines` joined by newlines."""
    return "\n".join(summary_lines(d))


def roofline_points(d: dict) -> tuple[list, list[dict]]:
    """``([roof], points)``: the GPU's roofline and the decode and prefill steps of ``d``, as
    :func:`llminfra.plots.roofline.plot_roofline` takes them."""
    roof = device_roofline(d["gpu"], d["dtype"])
    points = []
    for name, step in (("decode", d["decode"]), ("prefill", d["prefill"])):
        busy = max(step["compute_s"], step["memory_s"])
        intensity = step["flops"] / step["bytes"]
        points.append({"label": f"{name}: {format_number(intensity, 3)} FLOP/B",
                       "intensity": intensity,
                       "flops_per_s": step["flops"] / step["tensor_parallel"] / busy})
    return [roof], points


def roofline_image(d: dict) -> bytes:
    """PNG of the GPU's roofline with the decode and prefill steps of ``d`` placed on it."""
    return roofline_png(*roofline_points(d))


class RooflineCalculator:
    """ipywidgets panel over :func:`serving_estimate`: ``controls`` (``model``, ``dtype``,
    ``gpu``, ``num_gpus``, ``context``, ``concurrency``, ``gpu_hour_price_usd``), ``summary``
    (``HTML``), ``image`` (``Image``), ``widget`` (a :class:`~llminfra.widgets.panel.Panel`),
    ``data`` and ``text``.
    A combination the package refuses (no peak for the dtype, no link for several GPUs) is
    shown as that message."""

    def __init__(self, model: str = "llama-2-7b", gpu: str = "h100", dtype: str = "bf16",
                 context: int = 2048, concurrency: int = 1, num_gpus: int = 1,
                 gpu_hour_price_usd: float = 2.0):
        get_model(model), get_gpu(gpu)  # unknown names: KeyError listing what is allowed
        st = {"description_width": "90px"}
        self.controls = {
            "model": widgets.Dropdown(options=model_names(), value=get_model(model).name,
                                      description="model", style=st),
            "dtype": widgets.Dropdown(options=WEIGHT_DTYPES, value=dtype, description="weights",
                                      style=st),
            "gpu": widgets.Dropdown(options=gpu_names(), value=get_gpu(gpu).name,
                                    description="GPU", style=st),
            "num_gpus": widgets.Dropdown(options=(1, 2, 4, 8), value=num_gpus,
                                         description="GPUs", style=st),
            "context": widgets.IntSlider(value=context, min=256, max=32768, step=256,
                                         description="context", continuous_update=False,
                                         style=st),
            "concurrency": widgets.IntSlider(value=concurrency, min=1, max=256,
                                             description="concurrency",
                                             continuous_update=False, style=st),
            "gpu_hour_price_usd": widgets.FloatText(value=gpu_hour_price_usd,
                                                    description="USD / GPU h", style=st),
        }
        self.summary, self.image = widgets.HTML(), widgets.Image(format="png")
        self.summary.add_class("llminfra-roofline-summary")
        c = self.controls
        self.widget = Panel([
            widgets.HBox([c["model"], c["dtype"]]), widgets.HBox([c["gpu"], c["num_gpus"]]),
            widgets.HBox([c["context"], c["concurrency"]]), c["gpu_hour_price_usd"],
            self.image, self.summary],
            title="GPU roofline calculator",
            how="pick a model, weight dtype, context, concurrency, GPU and count, and an hourly "
                "price; fits?, decode tokens/s bound, TTFT and cost per million tokens")
        self.widget.add_class("llminfra-roofline-calculator")
        for control in self.controls.values():
            control.observe(lambda change: self.update(), names="value")
        self.update()

    def values(self) -> dict:
        """The controls' values, as keyword arguments of :func:`serving_estimate`."""
        return {name: control.value for name, control in self.controls.items()}

    def update(self) -> dict | None:
        """Recompute; refresh ``summary`` and ``image``; return the data (``None`` and the
        package's message when the combination is refused)."""
        try:
            self.data = serving_estimate(**self.values())
        except (ValueError, KeyError) as e:
            self.data, self.text = None, f"not possible: {e}"
            self.summary.value = f"<pre style='color:#cf222e'>{html.escape(self.text)}</pre>"
            return None
        self.text = summary_text(self.data)
        colour = "#1a7f37" if self.data["fits"] else "#cf222e"
        lines = [html.escape(x) for x in summary_lines(self.data)]
        lines[-1] = f"<b style='color:{colour}'>{lines[-1]}</b>"
        self.summary.value = "<pre style='margin:0;font-size:12px'>" + "\n".join(lines) + "</pre>"
        self.image.value = roofline_image(self.data)
        natural_size(self.image)
        return self.data
