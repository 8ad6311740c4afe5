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
