"""The chapter 03 widgets driven from Python: set a control, the output changes, and every number
equals the package's."""

import torch

from llminfra.quant import quantize
from llminfra.quant.formats import encode
from llminfra.widgets.number_format import NumberFormatExplorer
from llminfra.widgets.quant_explorer import QuantExplorer, quant_stats, scheme_name

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_number_format_widget_follows_the_control():
    nf = NumberFormatExplorer(0.1)
    assert "0.100098" in nf.text                                          # bf16 row
    assert nf.text.count("\n") == 8
    nf.control.value = 448.0
    assert "0 1111 110" in nf.text and "0 1111 110" in nf.table.value
    assert encode(448.0, "fp8-e4m3")["bits"] == "0 1111 110"


def test_scheme_names():
    assert scheme_name("int zero-point", 4, 128) == "int4-g128-asym"
    assert scheme_name("int absmax", 8, "channel") == "int8-channel-sym"
    assert scheme_name("fp8-e4m3", 3, 64) == "fp8-e4m3-channel"
    assert scheme_name("nf4", 4, "tensor") == "nf4-g64"


def test_quant_explorer_updates_and_matches_package(gen):
    w = torch.randn(48, 256, generator=gen)
    X = torch.randn(32, 256, generator=gen)
    calls = []
    qe = QuantExplorer(w, X, perplexity_fn=lambda s: calls.append(s) or 12.5)
    assert bytes(qe.image.value).startswith(PNG_MAGIC)
    assert qe.data["bytes_per_param"] == quantize(w, "int4-g128-asym").bytes_per_param
    err4 = qe.data["layer_rel_error"]
    qe.controls["bits"].value = 8
    assert qe.data["scheme"] == "int8-g128-asym" and qe.data["layer_rel_error"] < err4 / 5
    assert "perplexity 12.5" in qe.text and calls == ["int4-g128-asym", "int8-g128-asym"]
    qe.controls["bits"].value = 4                       # remembered, not recomputed
    assert calls == ["int4-g128-asym", "int8-g128-asym"]
    qe.controls["family"].value = "nf4"
    assert qe.data["scheme"] == "nf4-g128"
    w_hat = quantize(w, "nf4-g128").dequantize()   # the package directly, not the widget's helper
    assert qe.data["weight_rel_error"] == float((w_hat - w).norm() / w.norm())
    assert qe.data["layer_rel_error"] == float((X @ w_hat.T - X @ w.T).norm() / (X @ w.T).norm())
    assert quant_stats(w, "nf4-g128")["layer_rel_error"] is None   # no inputs, no layer error
    assert repr(qe.widget).startswith("[interactive widget] Quantizer")


def test_quant_explorer_shows_the_baseline_on_the_same_text(gen):
    w = torch.randn(16, 128, generator=gen)
    qe = QuantExplorer(w, perplexity_fn=lambda s: 4.4, baseline_perplexity=4.0)
    assert "perplexity 4.4 vs 4 unquantized on the same text (+10.00%)" in qe.text
    assert qe.data["baseline_perplexity"] == 4.0


def test_controls_a_scheme_ignores_are_marked():
    """Issue 24: nf4 and fp8 ignored bits (and fp8 a group size) while the controls still showed
    them: the bits slider is switched off for them and the summary says what was used."""
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    qe = QuantExplorer(w)
    assert not qe.controls["bits"].disabled
    qe.controls["family"].value = "fp8-e4m3"          # group 128 from the default
    assert qe.controls["bits"].disabled and qe.data["scheme"] == "fp8-e4m3-channel"
    assert "bits slider does not apply" in qe.text and "shown per channel" in qe.text
    qe.controls["family"].value = "nf4"
    qe.controls["group"].value = "tensor"
    assert qe.data["scheme"] == "nf4-g64" and "blocks of 64" in qe.text
    qe.controls["family"].value = "int absmax"
    assert not qe.controls["bits"].disabled and "does not apply" not in qe.text
