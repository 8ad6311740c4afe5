"""Chapter 03 checkers: each passes on the package's own function and fails, with the right
diagnosis, on the usual wrong answers."""

import pytest
import torch

from llminfra.course.checking import CheckFailed
from llminfra.course.checks import ch03
from llminfra.quant import quantize
from llminfra.quant.gptq import column_update
from llminfra.quant.rtn import absmax_quantize


def _int4_package(w, group_size):
    qt = quantize(w, f"int4-g{group_size}-sym")
    return qt.codes, qt.scale


def test_checkers_pass_on_the_package():
    assert ch03.check_absmax_int8(lambda x: absmax_quantize(x, 8)) == 7
    assert ch03.check_quantize_int4(_int4_package) == 5
    assert ch03.check_gptq_column_step(lambda W, H, i, q: column_update(W, H, i, q)[0]) == 5


def _absmax_variant(divisor=127, use_abs=True, rounding=torch.round):
    def fn(x):
        m = x.abs().max() if use_abs else x.max()
        s = m / divisor
        safe = s if s > 0 else torch.ones_like(s)
        return rounding(x / safe).clamp(-127, 127).to(torch.int8), s
    return fn


@pytest.mark.parametrize("wrong, message", [
    (_absmax_variant(divisor=128), "divided by 128"),
    (_absmax_variant(use_abs=False), r"max\(\|x\|\)"),
    (_absmax_variant(rounding=torch.trunc), "truncated"),
    (lambda x: (torch.round(x / (x.abs().max() / 127)).to(torch.int16), x.abs().max() / 127), "torch.int8"),
    (lambda x: torch.round(x), "tuple"),
])
def test_absmax_diagnoses(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ch03.check_absmax_int8(wrong)


def test_absmax_zero_tensor_diagnosed():
    def nan_on_zero(x):
        s = x.abs().max() / 127
        return torch.nan_to_num(torch.round(x / s)).clamp(-127, 127).to(torch.int8), float("nan") if s == 0 else s
    with pytest.raises(CheckFailed, match="all-zero"):
        ch03.check_absmax_int8(nan_on_zero)


def _int4_variant(divisor=7, swap=False, offset=8):
    def fn(w, g):
        rows, cols = w.shape
        G = w.reshape(rows, cols // g, g)
        scales = (G.abs().amax(-1) / divisor).to(torch.float16)
        q = torch.round(G / scales.float().unsqueeze(-1)).clamp(-7, 7).reshape(rows, cols)
        codes = (q + offset).to(torch.uint8) & 0x0F
        lo, hi = (codes[:, 1::2], codes[:, 0::2]) if swap else (codes[:, 0::2], codes[:, 1::2])
        return lo | (hi << 4), scales
    return fn


def test_int4_variant_right_passes():
    assert ch03.check_quantize_int4(_int4_variant()) == 5


@pytest.mark.parametrize("wrong, message", [
    (_int4_variant(divisor=8), "by 7"),
    (_int4_variant(swap=True), "nibbles swapped"),
    (_int4_variant(offset=0), "q \\+ 8"),
    (lambda w, g: _int4_variant()(w, g)[::-1], "uint8"),
    (lambda w, g: (_int4_variant()(w, g)[0], _int4_variant()(w, g)[1].float()), "float16"),
])
def test_int4_diagnoses(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ch03.check_quantize_int4(wrong)


def _gptq_no_div(W, H, i, q):
    W = W.clone()
    W[:, i:] -= (W[:, i] - q)[:, None] * H[i, i:][None, :]
    return W


def _gptq_column(W, H, i, q):
    W = W.clone()
    W[:, i:] -= ((W[:, i] - q) / H[i, i])[:, None] * H[i:, i][None, :]
    return W


def _gptq_skip_i(W, H, i, q):
    W = W.clone()
    W[:, i + 1:] -= ((W[:, i] - q) / H[i, i])[:, None] * H[i, i + 1:][None, :]
    return W


@pytest.mark.parametrize("wrong, message", [
    (_gptq_no_div, r"Hinv\[i, i\] before"), (_gptq_column, "ROW"), (_gptq_skip_i, "equal q"),
    (lambda W, H, i, q: W, "equal q"),
])
def test_gptq_diagnoses(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ch03.check_gptq_column_step(wrong)


def test_stubs_fail():
    def stub(*a):
        raise NotImplementedError("your code here")
    for check in (ch03.check_absmax_int8, ch03.check_quantize_int4, ch03.check_gptq_column_step):
        with pytest.raises(CheckFailed, match="not implemented"):
            check(stub)
