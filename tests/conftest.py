"""Shared test fixtures."""

import pytest
import torch


@pytest.fixture
def gen():
    """A fresh, randomly seeded generator; its seed is printed, and pytest shows it with the
    captured output of a failing test, so the failure can be replayed."""
    g = torch.Generator()
    print(f"torch.Generator seed: {g.seed()}")
    return g


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny matrices: two OpenMP threads stall each other on
    a shared 2-core CPU. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
