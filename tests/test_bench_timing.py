"""bench.timing.torch_threads: the thread count inside the block, restored after (also on error)."""

import pytest
import torch

from llminfra.bench.timing import torch_threads


def test_threads_set_and_restored_even_when_the_block_raises():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with torch_threads(1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before
