"""The chapter 06 checkers pass on the package's functions and fail, with a useful message, on
wrong answers and on the exercise stub."""

import math

import pytest
import torch

from llminfra.attention import flash_attention, naive_attention, online_softmax
from llminfra.course.checking import CheckFailed
from llminfra.course.checks import ch06


def test_online_softmax_passes_on_package(capsys):
    assert ch06.check_online_softmax(online_softmax) == 8
    assert "8 random cases passed" in capsys.readouterr().out


def test_online_softmax_stub_fails():
    def stub(x):
        raise NotImplementedError("your code here")
    with pytest.raises(CheckFailed, match="not implemented"):
        ch06.check_online_softmax(stub)


def test_online_softmax_without_max_overflows():
    def no_max(x):
        e = torch.exp(x)
        return e / e.sum(-1, keepdim=True)
    with pytest.raises(CheckFailed, match="subtract the running max"):
        ch06.check_online_softmax(no_max)


def test_online_softmax_without_rescale():
    def no_rescale(x):
        m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
        l = torch.zeros_like(m)
        for j in range(x.shape[-1]):
            m = torch.maximum(m, x[..., j:j + 1])
            l = l + torch.exp(x[..., j:j + 1] - m)  # forgets l * exp(m_old - m_new)
        return torch.exp(x - m) / l
    with pytest.raises(CheckFailed, match="rows sum to"):
        ch06.check_online_softmax(no_rescale)


def test_tiled_attention_passes_on_package():
    assert ch06.check_tiled_attention(
        lambda q, k, v, c, bq, bk: flash_attention(q, k, v, c, block_q=bq, block_k=bk)) == 6
    assert ch06.check_tiled_attention(lambda q, k, v, c, bq, bk: naive_attention(q, k, v, c)) == 6


def test_tiled_attention_ignoring_causal():
    with pytest.raises(CheckFailed, match="non-causal result"):
        ch06.check_tiled_attention(lambda q, k, v, c, bq, bk: naive_attention(q, k, v, False))


def test_tiled_attention_top_left_mask():
    """Aligning the causal mask top-left (query i sees keys j <= i) is wrong when T < S."""
    def top_left(q, k, v, causal, bq, bk):
        T, S = q.shape[2], k.shape[2]
        G = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), -math.inf)
        return torch.softmax(s, -1) @ v
    with pytest.raises(CheckFailed, match="top-left"):
        ch06.check_tiled_attention(top_left)


def test_tiled_attention_message_names_shapes_not_numbers():
    with pytest.raises(CheckFailed) as e:
        ch06.check_tiled_attention(lambda q, k, v, c, bq, bk: torch.zeros_like(q))
    msg = str(e.value)
    assert "q (1," in msg and "block_q=" in msg and "tensor(" in msg.split("returned", 1)[1]
