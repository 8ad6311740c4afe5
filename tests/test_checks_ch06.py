"""The chapter 06 checkers pass on the package's functions and fail, with a useful message, on
wrong answers and on the exercise stub."""

import math

import pytest
import torch

from llminfra.attention import flash_attention, naive_attention, online_softmax
from llminfra.course.checking import CheckFailed, NotAttempted
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


def test_tiled_attention_message_names_the_case_seed_and_mismatch():
    with pytest.raises(CheckFailed) as e:
        ch06.check_tiled_attention(lambda q, k, v, c, bq, bk: torch.zeros_like(q), seed=7)
    msg = str(e.value)
    assert "GQA 8 query heads over 2 KV heads, causal, T=37 S=64" in msg
    assert "seed 7" in msg and "first mismatch at index (0, 0, 0, 0)" in msg
    assert "largest difference" in msg and "tensor(" not in msg


def _tiled(kv_expand=lambda k, G: k.repeat_interleave(G, 1), scale=True, dtype=None):
    """A plain (untiled) attention with one chosen bug, as a learner might write it."""
    def fn(q, k, v, causal, bq, bk):
        T, S, d = q.shape[2], k.shape[2], q.shape[3]
        G = q.shape[1] // k.shape[1]
        k, v = kv_expand(k, G), kv_expand(v, G)
        s = q @ k.transpose(-2, -1) / (math.sqrt(d) if scale else 1.0)
        if causal:
            s = s.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(S - T + 1), -math.inf)
        out = torch.softmax(s, -1) @ v
        return out if dtype is None else out.to(dtype)
    return fn


@pytest.mark.parametrize("seed", range(5))
def test_tiled_attention_gqa_repeat_fails_in_every_run(seed):
    """.repeat maps query head h to K/V head h % H_kv: passed 1 run in 5 before."""
    with pytest.raises(CheckFailed, match=r"GQA 8 query heads[\s\S]*repeat_interleave"):
        ch06.check_tiled_attention(_tiled(kv_expand=lambda k, G: k.repeat(1, G, 1, 1)), seed=seed)


@pytest.mark.parametrize("seed", range(5))
def test_tiled_attention_without_gqa_mapping_fails_in_every_run(seed):
    with pytest.raises(CheckFailed, match=r"raised RuntimeError[\s\S]*hint: q has 8 heads"):
        ch06.check_tiled_attention(_tiled(kv_expand=lambda k, G: k), seed=seed)


def test_tiled_attention_missing_scale_is_named_not_gqa():
    with pytest.raises(CheckFailed, match=r"not scaled: S_ij = Q_i K_jᵀ / √d") as e:
        ch06.check_tiled_attention(_tiled(scale=False))
    assert "grouped-query" not in str(e.value)


def test_tiled_attention_float32_answers():
    """Right in float32: accepted; wrong in float32: diagnosed (once 'Float did not match
    Double' from inside the hint)."""
    assert ch06.check_tiled_attention(_tiled(dtype=torch.float32)) == 6
    with pytest.raises(CheckFailed, match="repeat_interleave"):
        ch06.check_tiled_attention(_tiled(kv_expand=lambda k, G: k.repeat(1, G, 1, 1),
                                          dtype=torch.float32))


def test_online_softmax_accepts_numpy_and_float32():
    assert ch06.check_online_softmax(lambda x: online_softmax(x).numpy()) == 8
    assert ch06.check_online_softmax(lambda x: online_softmax(x).float()) == 8


def test_stubs_are_not_attempted():
    def stub(*a):
        raise NotImplementedError("your code here")
    for check in (ch06.check_online_softmax, ch06.check_tiled_attention):
        with pytest.raises(NotAttempted):
            check(stub)
