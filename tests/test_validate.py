"""The shared guards of llminfra.validate (positive_int, non_negative_int): what they accept,
what they refuse, and the message they give."""

from __future__ import annotations

import numpy as np
import pytest

from llminfra.validate import non_negative_int, positive_int


@pytest.mark.parametrize("value", [1, 2, 16, 10**12])
def test_positive_ints_pass_through(value):
    assert positive_int("n", value) is value


@pytest.mark.parametrize("value", [0, -1, True, False, 2.0, 1.5, "3", None, np.int64(4)])
def test_everything_else_is_refused_naming_the_value(value):
    with pytest.raises(ValueError, match=r"^num_blocks must be a positive integer, got ") as e:
        positive_int("num_blocks", value)
    assert str(e.value).endswith(repr(value))


def test_where_prefixes_the_owner():
    with pytest.raises(ValueError, match=r"^PagedKVCache: block_size must be a positive integer, "
                                         r"got 0$"):
        positive_int("block_size", 0, where="PagedKVCache: ")
    with pytest.raises(ValueError, match=r"^ModelConfig\.n_layers must be a positive integer"):
        positive_int("n_layers", -3, where="ModelConfig.")


def test_numpy_ints_pass_once_converted():
    """NumPy scalars are refused (see the module docstring); ``int(x)`` is the way in."""
    assert positive_int("batch", int(np.int64(4))) == 4


def test_non_negative_int_allows_zero_and_refuses_the_rest():
    assert non_negative_int("start_pos", 0) == 0 and non_negative_int("gamma", 7) == 7
    for bad in (-1, True, 0.0, np.int64(0), None):
        with pytest.raises(ValueError, match=r"^gamma must be an integer >= 0, got "):
            non_negative_int("gamma", bad)
    with pytest.raises(ValueError, match=r"^llama: mtp_layers must be an integer >= 0, got -2$"):
        non_negative_int("mtp_layers", -2, where="llama: ")
