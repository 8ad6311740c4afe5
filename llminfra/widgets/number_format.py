"""Number-format widget: type a number, see how each format stores it (bits, stored value,
rounding error) — fp32, bf16, fp16, fp8 e4m3 / e5m2, int8, int4, nf4.

Thin wiring over :func:`llminfra.quant.formats.encode_all`; a ``FloatText`` control's
``observe`` callback sets an ``HTML`` value (no printing), so it behaves the same in JupyterLab,
in a test and under nbval. Formats: IEEE 754-2008; Micikevicius et al., 2022 (arXiv:2209.05433);
Dettmers et al., 2023 (arXiv:2305.14314). Chapter 03.
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets

from llminfra.quant.formats import SHOWN_FORMATS, encode_all
from llminfra.widgets.panel import Panel


_LEFT, _RIGHT = "text-align:left", "text-align:right"


def _shown(x: float, digits: int) -> str:
    """A value as a person reads it: ``NaN`` and ``∞`` spelt out, else ``digits`` digits."""
    if math.isnan(x):
        return "NaN"
    return ("∞" if x > 0 else "-∞") if math.isinf(x) else f"{x:.{digits}g}"


def encoding_lines(value: float, formats: tuple[str, ...] = SHOWN_FORMATS) -> list[str]:
    """One line per format: name, bit pattern, stored value (6 significant digits), relative
    error (3); ``NaN`` and ``∞`` spelt as such."""
    lines = [f"{'format':<9} {'bits (sign exponent mantissa)':<36} {'stored':>12} {'rel. error':>10}"]
    for r in encode_all(value, formats):
        lines.append(f"{r['format']:<9} {r['bits']:<36} {_shown(r['stored'], 6):>12} "
                     f"{_shown(r['rel_error'], 3):>10}")
    return lines


def encoding_html(value: float, formats: tuple[str, ...] = SHOWN_FORMATS) -> str:
    """The rows of :func:`encoding_lines` as an HTML table (bits in a monospace font; text
    left-aligned, numbers right-aligned)."""
    rows = "".join(
        f"<tr><td style='{_LEFT}'>{html.escape(r['format'])}</td>"
        f"<td style='{_LEFT};font-family:monospace'>{html.escape(r['bits'])}</td>"
        f"<td style='{_RIGHT}'>{_shown(r['stored'], 6)}</td>"
        f"<td style='{_RIGHT}'>{_shown(r['rel_error'], 3)}</td></tr>"
        for r in encode_all(value, formats))
    return (f"<table><tr><th style='{_LEFT}'>format</th><th style='{_LEFT}'>bits (sign exponent "
            f"mantissa)</th><th style='{_RIGHT}'>stored value</th><th style='{_RIGHT}'>relative "
            f"error</th></tr>{rows}</table>")


class NumberFormatExplorer:
    """``FloatText`` -> table of encodings. Attributes: ``control``, ``table`` (``HTML``),
    ``widget`` (display it), ``text`` (the plain lines of the last update)."""

    def __init__(self, value: float = 0.1, formats: tuple[str, ...] = SHOWN_FORMATS):
        self.formats = formats
        self.control = widgets.FloatText(value=value, description="number")
        self.table = widgets.HTML()
        self.widget = Panel([self.control, self.table], title="Number formats",
                            how="type a number; each format's bits, stored value and error")
        self.control.observe(lambda change: self.update(), names="value")
        self.update()

    def update(self) -> str:
        """Recompute for the control's value; refresh the HTML table; return the plain text."""
        self.text = "\n".join(encoding_lines(self.control.value, self.formats))
        self.table.value = encoding_html(self.control.value, self.formats)
        return self.text
