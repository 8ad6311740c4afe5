"""Quantizer widget: scheme family, bits and group size -> error histogram, bytes per parameter,
weight and layer-output error, and (optionally) the tiny model's perplexity.

Thin wiring over :func:`quant_stats` (a pure function returning the numbers) and
:func:`llminfra.plots.quant.error_histogram_png`; ``observe`` callbacks set an ``HTML`` and an
``Image`` value (no printing), so it behaves the same in JupyterLab, in a test and under nbval.
Perplexity comes from a function the notebook passes (``perplexity_fn(scheme) -> float``,
e.g. quantize the tiny model and measure a held-out slice); results are remembered per scheme.
A perplexity means something only next to the full-precision model's on the *same* text, so
``baseline_perplexity`` (the unquantized model on that text) is shown beside it, with the
relative change.
Chapter 03.
"""

from __future__ import annotations

import html
from typing import Callable

import ipywidgets as widgets
import torch

from llminfra.plots.quant import error_histogram_png
from llminfra.quant import quantize
from llminfra.widgets.panel import Panel, natural_size

FAMILIES = ("int absmax", "int zero-point", "fp8-e4m3", "fp8-e5m2", "nf4")
GROUPS = ("tensor", "channel", 32, 64, 128, 256)


def scheme_name(family: str, bits: int, group: str | int) -> str:
    """The scheme string for the widget's controls, e.g. ``("int zero-point", 4, 128)`` ->
    ``"int4-g128-asym"``; fp8 takes ``tensor``/``channel`` only (others -> ``channel``), nf4
    takes a block size (``tensor``/``channel`` -> 64)."""
    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; allowed: {FAMILIES}")
    if family.startswith("fp8"):
        return f"{family}-{group if group in ('tensor', 'channel') else 'channel'}"
    if family == "nf4":
        return f"nf4-g{group if isinstance(group, int) else 64}"
    gran = group if isinstance(group, str) else f"g{group}"
    return f"int{bits}-{gran}-{'sym' if family == 'int absmax' else 'asym'}"


def quant_stats(w: torch.Tensor, scheme: str, X: torch.Tensor | None = None) -> dict:
    """``{"scheme", "bytes_per_param", "weight_rel_error", "layer_rel_error" (None without X),
    "w_hat"}`` for weight ``w (out, in)`` and optional inputs ``X (n, in)``."""
    qt = quantize(w, scheme)
    w_hat = qt.dequantize()
    out = {"scheme": scheme, "bytes_per_param": qt.bytes_per_param,
           "weight_rel_error": float((w_hat - w).norm() / w.norm()), "layer_rel_error": None,
           "w_hat": w_hat}
    if X is not None:
        y = X @ w.T
        out["layer_rel_error"] = float((X @ w_hat.T - y).norm() / y.norm())
    return out


class QuantExplorer:
    """Controls ``family``, ``bits``, ``group`` -> ``image`` (error histogram) and ``summary``.

    ``QuantExplorer(w, X=None, perplexity_fn=None, baseline_perplexity=None)``; attributes
    ``controls``, ``widget``, ``data`` (last :func:`quant_stats`, plus ``perplexity`` and
    ``baseline_perplexity``) and ``text``.
    """

    def __init__(self, w: torch.Tensor, X: torch.Tensor | None = None,
                 perplexity_fn: Callable[[str], float] | None = None,
                 family: str = "int zero-point", bits: int = 4, group: str | int = 128,
                 baseline_perplexity: float | None = None):
        self.w, self.X, self.perplexity_fn = w.detach().float(), X, perplexity_fn
        self.baseline_perplexity = baseline_perplexity
        self._ppl: dict[str, float] = {}
        self.controls = {
            "family": widgets.Dropdown(options=FAMILIES, value=family, description="scheme"),
            "bits": widgets.IntSlider(value=bits, min=2, max=8, description="bits",
                                      continuous_update=False),
            "group": widgets.Dropdown(options=GROUPS, value=group, description="group"),
        }
        self.image = widgets.Image(format="png")
        self.summary = widgets.HTML()
        c = self.controls
        self.widget = Panel([widgets.HBox([c["family"], c["bits"], c["group"]]),
                             self.image, self.summary], title="Quantizer",
                            how="pick a scheme, bits and group size; rounding errors, bytes, "
                                "layer error and perplexity")
        for control in self.controls.values():
            control.observe(lambda change: self.update(), names="value")
        self.update()

    def _perplexity(self, scheme: str) -> float | None:
        if self.perplexity_fn is None:
            return None
        if scheme not in self._ppl:
            self._ppl[scheme] = self.perplexity_fn(scheme)
        return self._ppl[scheme]

    def update(self) -> dict:
        """Recompute from the controls; refresh image and summary; return the data."""
        c = self.controls
        family, group = c["family"].value, c["group"].value
        scheme = scheme_name(family, c["bits"].value, group)
        fixed_bits = family.startswith("fp8") or family == "nf4"
        c["bits"].disabled = fixed_bits            # their width is in the name: 8 or 4 bits
        self.data = quant_stats(self.w, scheme, self.X)
        self.data["perplexity"] = self._perplexity(scheme)
        self.data["baseline_perplexity"] = self.baseline_perplexity
        d = self.data
        lines = [f"scheme {scheme}: {d['bytes_per_param']:.4g} bytes/param (fp32: 4)",
                 f"weight error {100 * d['weight_rel_error']:.3g} %"]
        if fixed_bits:
            lines.append(f"{family} has {8 if family.startswith('fp8') else 4} bits: the bits "
                         "slider does not apply")
        if family.startswith("fp8") and not isinstance(group, str):
            lines.append(f"fp8 scales per tensor or per channel, not in groups of {group}: "
                         "shown per channel")
        if family == "nf4" and isinstance(group, str):
            lines.append(f"nf4 scales blocks of weights, not a whole {group}: shown with "
                         "blocks of 64")
        if d["layer_rel_error"] is not None:
            lines.append(f"layer output error {100 * d['layer_rel_error']:.3g} %")
        if d["perplexity"] is not None:
            line = f"tiny-model perplexity {d['perplexity']:.4g}"
            base = d["baseline_perplexity"]
            if base is not None:
                line += (f" vs {base:.4g} unquantized on the same text "
                         f"({d['perplexity'] / base - 1:+.2%})")
            lines.append(line)
        self.text = "\n".join(lines)
        self.summary.value = f"<pre style='margin:0;font-size:12px'>{html.escape(self.text)}</pre>"
        self.image.value = error_histogram_png(self.w, d["w_hat"], scheme)
        natural_size(self.image)
        return d
