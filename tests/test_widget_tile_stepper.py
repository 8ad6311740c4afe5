"""The tile stepper, driven from Python: moving the slider changes the numbers shown, and what
it shows matches the tiled algorithm."""

import matplotlib
import torch

matplotlib.use("Agg")

from llminfra.attention import naive_attention  # noqa: E402
from llminfra.attention.tile_trace import tile_trace  # noqa: E402
from llminfra.widgets.tile_stepper import tile_stepper  # noqa: E402


def _inputs(gen, T=10, S=10, d=4):
    return torch.randn(T, d, generator=gen), torch.randn(S, d, generator=gen), \
        torch.randn(S, d, generator=gen)


def test_trace_steps_and_final_state(gen):
    """T = S = 10, blocks of 4, causal: tiles (row block, key block) on or below the diagonal
    are 3 + 2 + 1 = 6; the last state's O equals attention, and m is the row max of visible
    scores."""
    q, k, v = _inputs(gen)
    tr = tile_trace(q, k, v, causal=True, block_q=4, block_k=4)
    assert len(tr.steps) == 6
    last = tr.steps[-1]
    torch.testing.assert_close(last.O.float(), naive_attention(q[None, None], k[None, None],
                                                               v[None, None], True)[0, 0])
    scores = (q @ k.T) / 2.0
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(last.m.float(), scores.amax(-1))
    reads = [s.slow_read_bytes for s in tr.steps]
    assert reads == sorted(reads) and reads[0] > 0  # bytes only accumulate


def test_slider_moves_output(gen):
    q, k, v = _inputs(gen)
    box, slider, html = tile_stepper(q, k, v, causal=True, block_q=4, block_k=4)
    image = box.children[1]
    first_html, first_png = html.value, image.value
    assert "step 1 of 6" in first_html and "rows 0–3" in first_html
    assert (slider.min, slider.max, slider.value) == (1, 6, 1)  # counts tiles as the title does
    slider.value = 6
    assert "step 6 of 6" in html.value and "rows 8–9" in html.value
    assert image.value != first_png
    slider.value = 1
    assert html.value == first_html
    assert repr(box).startswith("[interactive widget] Tile stepper")
