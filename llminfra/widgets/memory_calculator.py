"""The memory-calculator widget: model, dtype, KV dtype, context, batch, GPU -> a stacked bar of
weights / KV cache / activations against the card's memory, fits or not, and the largest batch
that fits.

Thin wiring over a pure function: :func:`memory_breakdown` returns the numbers (a dict of bytes,
from :func:`llminfra.calc.memory.fits`, which carries :func:`~llminfra.calc.memory.kv_budget`),
:func:`summary_text` / :func:`summary_html` say them in GB (1e9) and GiB (2**30), and
:func:`llminfra.plots.memory_calculator.memory_bar_png` draws them. :class:`MemoryCalculator`
only connects ipywidgets controls to those through ``observe`` callbacks that set an ``HTML``
value and an ``Image`` value (no ``interact``, no printing), so it behaves the same in
JupyterLab, in a test, and under nbval.

Memory model: Kwon et al., 2023, "Efficient Memory Management for Large Language Model Serving
with PagedAttention" (vLLM), arXiv:2309.06180, Fig. 1 and §3 (weights persist, the KV cache grows
with batch · context, activations are transient; ``gpu_memory_utilization=0.9`` by default).

Taught in chapter 02 (``notebooks/02_gpu_memory.ipynb``).
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from llminfra.calc.memory import DEFAULT_RESERVE_FRACTION, fits
from llminfra.plots.memory_calculator import memory_bar_png
from llminfra.plots.table import format_number
from llminfra.specs.gpus import get_gpu, gpu_names
from llminfra.specs.models import get_model, model_names
from llminfra.widgets.panel import Panel, natural_size

#: dtypes offered for the weights and for the KV cache
WEIGHT_DTYPES = ("bf16", "fp16", "fp32", "fp8", "int8", "int4")
KV_DTYPES = ("bf16", "fp16", "fp32", "fp8", "int8", "int4")
#: context slider range for models whose config gives no maximum (Falcon)
FALLBACK_MAX_CONTEXT = 8192
CONTEXT_STEP = 256


def memory_breakdown(model: str, gpu: str, dtype: str = "bf16", kv_dtype: str | None = None,
                     context: int = 2048, batch: int = 1,
                     reserve_fraction: float = DEFAULT_RESERVE_FRACTION,
                     sliding_window: bool = False) -> dict:
    """Everything the calculator shows, as data (bytes are ints).

    The keys of :func:`llminfra.calc.memory.fits` (``weight_bytes``, ``kv_bytes``,
    ``activation_bytes``, ``total_bytes``, ``gpu_memory_bytes``, ``usable_bytes``, ``fits``,
    ``gpu_confidence``, …) plus ``reserve_bytes = gpu_memory_bytes - usable_bytes``,
    ``free_bytes = usable_bytes - total_bytes`` (negative when it does not fit),
    ``max_batch`` (largest batch of ``context``-token sequences that fits, 0 if none: the
    ``max_sequences`` of :func:`llminfra.calc.memory.kv_budget`, which ``fits`` carries),
    ``max_context`` (the model's window, ``None`` if its config has none) and ``gpu_source``.
    ``sliding_window``: keep only the model's attention window per layer (Mistral-7B: 4096),
    as :func:`llminfra.calc.memory.kv_bytes` does; no effect on models without one (the
    summary then says so: ``window_only`` is the request, ``sliding_window`` the model's W).

    Example: OPT-13B in fp16, 2048 tokens, batch 1 on an A100-40GB (40,960 MiB, 10 % reserve):
    weights 12,853,473,280 · 2 = 25.71 GB, KV 2 · 40 · 5120 · 2 · 2048 = 1.678 GB.
    """
    est = fits(model, gpu, dtype=dtype, kv_dtype=kv_dtype, context=context, batch=batch,
               reserve_fraction=reserve_fraction, sliding_window=sliding_window)
    g, spec = get_gpu(gpu), get_model(model)
    est.update(
        reserve_bytes=est["gpu_memory_bytes"] - est["usable_bytes"],
        free_bytes=est["usable_bytes"] - est["total_bytes"],
        max_batch=est["max_sequences"],
        max_context=spec.max_positions, gpu_source=g.source, window_only=sliding_window)
    return est


def _both(n_bytes: float) -> str:
    """``17,320 GB = 16,130 GiB``: 4 significant digits, thousands grouped, never ``1.732e+04``."""
    return f"{format_number(n_bytes / 1e9)} GB = {format_number(n_bytes / 2**30)} GiB"


def summary_lines(data: dict) -> list[str]:
    """The calculator's verdict as plain lines, every size in GB (1e9) and GiB (2**30)."""
    verdict = "FITS" if data["fits"] else "DOES NOT FIT"
    notes = []
    if data.get("attention") == "MLA":
        notes.append("KV cache    multi-head latent attention: one latent + RoPE key per token "
                     "and layer, shared by all heads")
    if data.get("sliding_window"):
        notes.append(f"KV cache    sliding window {data['sliding_window']:,}: "
                     f"{data['kv_tokens_per_sequence']:,} tokens kept per sequence and layer "
                     f"(every token kept: {_both(data['kv_bytes_full_attention'])})")
    elif data.get("window_only"):
        notes.append(f"KV cache    'window only' changes nothing here: {data['model']} has no "
                     "sliding window (every layer attends to the whole context), so every "
                     "token is kept")
    if data.get("active_params", data["params"]) != data["params"]:
        notes.append(f"experts     all experts stored; {data['active_params'] / 1e9:.4g} B of "
                     f"{data['params'] / 1e9:.4g} B params used per token")
    return [
        f"{data['model']} ({data['params'] / 1e9:.4g} B params), weights {data['dtype']}, "
        f"KV cache {data['kv_dtype']}, context {data['context']}, batch {data['batch']}",
        f"weights     {_both(data['weight_bytes'])}",
        f"KV cache    {_both(data['kv_bytes'])} "
        f"({data['kv_bytes_per_token']:,} bytes per token)",
        *notes,
        f"activations {_both(data['activation_bytes'])} (one prefill of context tokens)",
        f"total       {_both(data['total_bytes'])}",
        f"{data['gpu']} [{data['gpu_confidence']}]: {_both(data['gpu_memory_bytes'])}, usable "
        f"{_both(data['usable_bytes'])} after a {data['reserve_fraction']:.0%} reserve",
        f"KV budget beside the weights {_both(data['kv_budget_bytes'])}",
        f"{verdict}; largest batch that fits at context {data['context']}: {data['max_batch']}",
    ]


def summary_text(data: dict) -> str:
    """:func:`summary_lines` joined by newlines."""
    return "\n".join(summary_lines(data))


def summary_html(data: dict) -> str:
    """:func:`summary_lines` as a small HTML block (the verdict line coloured)."""
    lines = [html.escape(line) for line in summary_lines(data)]
    colour = "#1a7f37" if data["fits"] else "#cf222e"
    lines[-1] = f"<b style='color:{colour}'>{lines[-1]}</b>"
    return "<pre style='margin:0;font-size:12px'>" + "\n".join(lines) + "</pre>"


class MemoryCalculator:
    """ipywidgets panel over :func:`memory_breakdown`.

    Attributes: ``controls`` (dict name -> widget: ``model``, ``dtype``, ``kv_dtype``,
    ``context``, ``batch``, ``gpu``, ``sliding_window`` — keep only a sliding-window model's
    window of tokens), ``summary`` (``HTML``), ``image`` (``Image``, PNG bytes),
    ``widget`` (the ``VBox`` to display), ``data`` (the last :func:`memory_breakdown`) and
    ``text`` (its :func:`summary_text`). Every control change recomputes through ``observe``.
    """

    def __init__(self, model: str = "llama-2-13b", gpu: str = "a100-40gb", dtype: str = "bf16",
                 kv_dtype: str = "bf16", context: int = 2048, batch: int = 1,
                 reserve_fraction: float = DEFAULT_RESERVE_FRACTION):
        self.reserve_fraction = reserve_fraction
        get_model(model), get_gpu(gpu)  # unknown names: KeyError listing what is allowed
        style = {"description_width": "70px"}
        self.controls = {
            "model": widgets.Dropdown(options=model_names(), value=get_model(model).name,
                                      description="model", style=style),
            "dtype": widgets.Dropdown(options=WEIGHT_DTYPES, value=dtype,
                                      description="weights", style=style),
            "kv_dtype": widgets.Dropdown(options=KV_DTYPES, value=kv_dtype,
                                         description="KV dtype", style=style),
            "gpu": widgets.Dropdown(options=gpu_names(), value=get_gpu(gpu).name,
                                    description="GPU", style=style),
            "context": widgets.IntSlider(value=context, min=CONTEXT_STEP, step=CONTEXT_STEP,
                                         max=self._max_context(model), description="context",
                                         continuous_update=False, style=style),
            "batch": widgets.IntSlider(value=batch, min=1, max=256, description="batch",
                                       continuous_update=False, style=style),
            "sliding_window": widgets.Checkbox(value=False, description="window only",
                                               indent=False),
        }
        self.summary = widgets.HTML()
        self.summary.add_class("llminfra-memory-summary")
        self.image = widgets.Image(format="png")
        c = self.controls
        self.widget = Panel([
            widgets.HBox([c["model"], c["gpu"]]), widgets.HBox([c["dtype"], c["kv_dtype"]]),
            widgets.HBox([c["context"], c["batch"]]), c["sliding_window"], self.image,
            self.summary],
            title="Memory calculator",
            how="pick a model, dtypes, context, batch and GPU ('window only': a sliding-window "
                "model keeps its last W tokens); a bar of weights / KV cache / "
                "activations against the card")
        self.widget.add_class("llminfra-memory-calculator")
        for name, control in self.controls.items():
            control.observe(self._on_model if name == "model" else self._on_change, names="value")
        self.update()

    @staticmethod
    def _max_context(model: str) -> int:
        return get_model(model).max_positions or FALLBACK_MAX_CONTEXT

    def _on_model(self, change) -> None:
        slider = self.controls["context"]
        new_max = self._max_context(change["new"])
        if slider.value > new_max:  # clamp first: every update must see a valid context
            slider.value = new_max
        slider.max = new_max
        self.update()

    def _on_change(self, change) -> None:
        self.update()

    def values(self) -> dict:
        """The controls' current values, as keyword arguments of :func:`memory_breakdown`."""
        return {name: control.value for name, control in self.controls.items()}

    def update(self) -> dict:
        """Recompute from the controls; refresh ``summary`` and ``image``; return the data."""
        self.data = memory_breakdown(**self.values(), reserve_fraction=self.reserve_fraction)
        self.text = summary_text(self.data)
        self.summary.value = summary_html(self.data)
        self.image.value = memory_bar_png(self.data)
        natural_size(self.image)
        return self.data
