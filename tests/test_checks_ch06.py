"""The chapter 06 checkers pass on the package's functions and fail, with a useful message, on
wrong answers and on the exercise stub."""

import math
import re

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


def test_online_softmax_wants_a_tensor():
    """The exercise asks for a tensor: a NumPy array of the right numbers is told so."""
    with pytest.raises(CheckFailed, match="expected a torch.Tensor .* got ndarray"):
        ch06.check_online_softmax(lambda x: online_softmax(x).numpy())


def test_stubs_are_not_attempted():
    def stub(*a):
        raise NotImplementedError("your code here")
    for check in (ch06.check_online_softmax, ch06.check_tiled_attention):
        with pytest.raises(NotAttempted):
            check(stub)


# ---- every branch has a fixed case: a wrong answer that ignores one fails on every seed, there
SEEDS = range(8)


def softmax_one_pass(x, m0=-math.inf, per_row=True, rescale=True, use_max=True):
    """Algorithm 3 of Milakov & Gimelshein, with one of the usual slips switched on."""
    shape = x.shape[:-1] + (1,) if per_row else ()
    m = torch.full(shape, m0, dtype=x.dtype)
    l = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    for j in range(x.shape[-1]):
        x_j = x[..., j:j + 1]
        m_new = torch.maximum(m, x_j if per_row else x_j.max()) if use_max else torch.zeros_like(m)
        l = l * (torch.exp(m - m_new) if rescale and use_max else 1) + torch.exp(x_j - m_new)
        m = m_new
    return torch.exp(x - m) / l


@pytest.mark.parametrize("slip, message", [
    (dict(use_max=False), "subtract the running max"),
    (dict(m0=0.0), "start the running max at -inf, not 0"),
    (dict(per_row=False), "PER ROW"),
    (dict(rescale=False), "rows sum to 1 when the running sum is right"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_online_softmax_slips_fail_every_run_at_case_1(slip, message, seed):
    """A running max started at 0 passed 97 % of runs and one max shared by all rows 25 %: the
    values were never all far below 0, nor rows far apart. Case 1 has both, in every run."""
    assert ch06.check_online_softmax(softmax_one_pass, seed=seed) == 8
    with pytest.raises(CheckFailed, match=message) as e:
        ch06.check_online_softmax(lambda x: softmax_one_pass(x, **slip), seed=seed)
    assert "case 1 of 8: x of shape (3, " in str(e.value) and "rows thousands apart" in str(e.value)


def tiled_slip(q, k, v, causal, bq, bk, *, last_q=True, last_k=True, skip_top_left=False,
               batch=True, diagonal=True, offset=True):
    """The tiled loop of the exercise, with one of the usual slips switched on: the last,
    shorter query or key block dropped, key blocks skipped as if the causal diagonal were
    top-left, only sequence 0 of the batch computed, the query's own position masked, the
    mask aligned top-left (no S - T offset)."""
    if not batch:
        one = tiled_slip(q[:1], k[:1], v[:1], causal, bq, bk)
        return torch.cat([one, torch.zeros_like(q[1:])])
    B, H, T, d = q.shape
    S = k.shape[2]
    G = H // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    out = torch.zeros_like(q)
    for i0 in range(0, T if last_q else T - bq + 1, bq):
        Q_i = q[:, :, i0:i0 + bq] / math.sqrt(d)
        rows = torch.arange(i0, i0 + Q_i.shape[2]).unsqueeze(1)
        m = torch.full(Q_i.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros_like(Q_i)
        for j0 in range(0, S if last_k else S - bk + 1, bk):
            if causal and skip_top_left and j0 > i0 + Q_i.shape[2] - 1:
                break
            S_ij = Q_i @ k[:, :, j0:j0 + bk].transpose(-2, -1)
            if causal:
                cols = torch.arange(j0, j0 + S_ij.shape[-1]).unsqueeze(0)
                last = (S - T if offset else 0) + rows
                hidden = cols > last if diagonal else cols >= last
                S_ij = S_ij.masked_fill(hidden, -math.inf)
            m_new = torch.maximum(m, S_ij.amax(-1, keepdim=True))
            P, scale = torch.exp(S_ij - m_new), torch.exp(m - m_new)
            l = l * scale + P.sum(-1, keepdim=True)
            acc = acc * scale + P @ v[:, :, j0:j0 + bk]
            m = m_new
        out[:, :, i0:i0 + bq] = acc / l
    return out


@pytest.mark.parametrize("slip, case, message", [
    (dict(batch=False), r"case 2 of 6: GQA 6 query heads over 3 KV heads, not causal, T=23 "
                        r"S=23, batch 2", "sequence 0 of the batch is right"),
    (dict(diagonal=False), r"case 1 of 6: GQA 8 query heads .*causal, T=37 S=64",
     "hides the query's own position"),
    (dict(offset=False), r"case 1 of 6: .*causal, T=37 S=64", "aligned top-left"),
    (dict(skip_top_left=True), r"case 1 of 6: .*causal, T=37 S=64", "shifted by S - T"),
    (dict(last_q=False), r"case 1 of 6: .*T=37 S=64", "blocks at the end"),
    (dict(last_k=False), r"case [12] of 6: .*(T=37 S=64|T=23 S=23)", "blocks at the end"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_tiled_attention_slips_fail_every_run_at_their_case(slip, case, message, seed):
    """Every case had a batch of one, so code that handled sequence 0 alone passed every run;
    case 2 now has two. T = 37 and T = S = 23 are primes: a dropped last block always shows."""
    assert ch06.check_tiled_attention(tiled_slip, seed=seed) == 6
    with pytest.raises(CheckFailed, match=message) as e:
        ch06.check_tiled_attention(lambda *a: tiled_slip(*a, **slip), seed=seed)
    assert re.search(case, str(e.value))


@pytest.mark.parametrize("wrong, message", [
    (lambda q, k, v, c, bq, bk: naive_attention(q, k, v, False), "non-causal result"),
    (_tiled(scale=False), "not scaled"),
    (_tiled(kv_expand=lambda k, G: k.repeat(1, G, 1, 1)), "repeat_interleave"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_tiled_attention_layout_slips_fail_every_run_at_case_1(wrong, message, seed):
    with pytest.raises(CheckFailed, match=message) as e:
        ch06.check_tiled_attention(wrong, seed=seed)
    assert "case 1 of 6: GQA 8 query heads over 2 KV heads, causal, T=37 S=64" in str(e.value)
