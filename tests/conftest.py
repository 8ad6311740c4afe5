"""Shared test fixtures."""

import pytest
import torch


@pytest.fixture
def gen():
    """A fresh, randomly seeded generator (printed on failure through its seed)."""
    g = torch.Generator()
    seed = g.seed()
    yield g
    del seed
