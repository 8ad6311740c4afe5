"""Chapter 06's tile stepper table: a widget's HTML gets none of JupyterLab's table style, so
each cell must bring its own horizontal padding (else "-0.2948" of one column and "1.646" of
the next read as one), and the header row is ruled off from the numbers."""

from __future__ import annotations

import re

import pytest
import torch

from llminfra.attention.tile_trace import tile_trace
from llminfra.widgets.tile_stepper import step_html

#: the least room either side of a cell's text (0.5 em: about 3.5 px of the 13-px font each
#: side, 7 px between two columns)
MIN_PAD_EM = 0.5


def _cells(html: str) -> list[tuple[str, str]]:
    """``(tag, style)`` of every th / td of the step's table."""
    table = re.search(r"<table>.*</table>", html, flags=re.S).group(0)
    return [(tag, style) for tag, style in
            re.findall(r"<(th|td)(?:\s+style='([^']*)')?>", table)]


def _horizontal_pad_em(style: str) -> float:
    m = re.search(r"padding:\s*([\d.]+)em(?:\s+([\d.]+)em)?", style)
    if not m:
        return 0.0
    return float(m.group(2) or m.group(1))        # "padding: v h" or "padding: all"


@pytest.mark.parametrize("block", [2, 4])
def test_every_cell_has_room_and_the_header_is_ruled(block):
    g = torch.Generator().manual_seed(0)
    trace = tile_trace(*(torch.randn(12, 4, generator=g) for _ in range(3)), True, block, block)
    for step in range(len(trace.steps)):
        cells = _cells(step_html(trace, step))
        assert len(cells) == 4 * (1 + trace.steps[step].i1 - trace.steps[step].i0)
        cramped = [(tag, style) for tag, style in cells if _horizontal_pad_em(style) < MIN_PAD_EM]
        assert cramped == [], (step, cramped)
        assert all("border-bottom" in style for tag, style in cells if tag == "th"), step


def test_the_check_catches_a_bare_table():
    assert _horizontal_pad_em("text-align:right") == 0.0
    assert _horizontal_pad_em("text-align:right;padding:0.1em 0.2em") < MIN_PAD_EM
