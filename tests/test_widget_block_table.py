"""The block-table widget, driven from Python: moving the slider changes the tables, the ref
counts, the free list and the picture, and every state is the real allocator's."""

import pytest

from llminfra.kvcache import BlockAllocator, BlockTable
from llminfra.widgets.block_table import (DEFAULT_WORKLOAD, BlockTableWidget, replay,
                                          state_text)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_replay_states_by_hand():
    """B = 4: A(6 tokens) -> blocks [0, 1]; B(3) -> [2]; A + 3 -> [0, 1, 3]; fork A2 shares
    all three (ref 2); A2 + 1 writes into the shared, partial block 3 -> copied to block 4."""
    s = replay(DEFAULT_WORKLOAD, num_blocks=10, block_size=4)
    assert len(s) == len(DEFAULT_WORKLOAD) + 1
    assert s[0]["free_list"] == list(range(10))
    assert s[3]["tables"]["A"] == {"blocks": [0, 1, 3], "num_tokens": 9}
    assert s[4]["ref_counts"][:4] == [2, 2, 1, 2]
    assert s[5]["copies"] == [(3, 4)] and s[5]["tables"]["A2"]["blocks"] == [0, 1, 4]
    assert s[7]["free_list"][-1] == 2                    # B's block back on the free list
    assert "pool exhausted" in s[-1]["event"] and s[-1]["free_list"] == []
    for st in s:                                         # blocks conserved at every step
        assert sum(1 for r in st["ref_counts"] if r) + len(st["free_list"]) == 10


def test_replay_matches_the_allocator_directly():
    alloc = BlockAllocator(10, 4)
    a = BlockTable(alloc)
    a.append(6)
    b = BlockTable(alloc)
    b.append(3)
    assert replay(DEFAULT_WORKLOAD[:2])[-1]["ref_counts"] == alloc.ref_counts()


def test_slider_changes_the_output():
    w = BlockTableWidget()
    assert w.state is w.states[0] and bytes(w.image.value).startswith(PNG_MAGIC)
    html0, png0 = w.html.value, w.image.value
    w.slider.value = 5
    assert w.state is w.states[5]
    assert "copy-on-write block 3 -&gt; 4" in w.html.value
    assert w.html.value != html0 and bytes(w.image.value) != bytes(png0)
    assert w.text == state_text(w.states[5])
    assert w.slider.max == len(DEFAULT_WORKLOAD)


def test_unknown_event_is_rejected():
    with pytest.raises(ValueError, match="unknown event"):
        replay([("grow", "A", 3)])
