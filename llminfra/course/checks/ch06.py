"""Answer checkers for chapter 06 (``solutions/06_flash_attention.ipynb``): a one-pass (online)
softmax, and one tiled attention forward pass.

Each checker draws fresh random cases, compares the learner's answer with the package's
(:func:`llminfra.attention.online_softmax`, :func:`llminfra.attention.flash_attention`) and,
when the answer is wrong, names the usual mistake it matches.

Sources: Milakov & Gimelshein 2018 (arXiv:1805.02867, Algorithm 3); Dao et al. 2022
(FlashAttention, arXiv:2205.14135, Algorithm 1).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from llminfra.attention import flash_attention, online_softmax
from llminfra.course.checking import CheckFailed, fresh_rng, run_checks
from llminfra.course.checking import torch_generator as _gen

__all__ = ["check_online_softmax", "check_tiled_attention", "CheckFailed"]


@dataclass(frozen=True)
class _Case:
    """One random input, shown by its shapes (not by its numbers) in failure messages."""

    tensors: tuple
    options: tuple
    label: str

    def __repr__(self) -> str:
        return self.label



# ------------------------------------------------------------------ online softmax
def _softmax_cases(rng: random.Random, n: int = 8) -> list:
    cases = []
    for i in range(n):
        rows, cols = rng.randint(1, 4), rng.randint(1, 40)
        scale = [1.0, 10.0, 1000.0][i % 3]  # 1000: exp overflows without the running max
        x = torch.randn(rows, cols, generator=_gen(rng), dtype=torch.float64) * scale
        cases.append(((_Case((x,), (), f"x of shape {tuple(x.shape)}, values ~N(0, {scale:g}²)"),), {}))
    return cases


def _softmax_hint(args, kwargs, expected, got) -> str:
    if not isinstance(got, torch.Tensor):
        return f"return a tensor, not {type(got).__name__}"
    if got.shape != expected.shape:
        return f"return the same shape as x {tuple(expected.shape)}, got {tuple(got.shape)}"
    if not torch.isfinite(got).all():
        return ("the result has inf/nan: subtract the running max before exp, and rescale the "
                "running sum by exp(m_old - m_new) when the max grows")
    sums = got.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
        return (f"rows sum to {sums.tolist()}, not 1: when the max grows, multiply the running "
                "sum by exp(m_old - m_new); divide by the final sum at the end")
    return "each row sums to 1 but the values differ from softmax(x)"


def check_online_softmax(fn, n_cases: int = 8) -> int:
    """Check ``fn(x) -> softmax(x)`` along the last dim of a 2-D float64 tensor (one pass for
    the statistics) against :func:`llminfra.attention.online_softmax` on fresh random cases."""
    return run_checks("online_softmax", lambda case: fn(*case.tensors),
                      lambda case: online_softmax(*case.tensors),
                      _softmax_cases(fresh_rng(), n_cases), rel=1e-9, abs_=1e-12,
                      hint=_softmax_hint)


# ------------------------------------------------------------------ tiled attention
def _attention_cases(rng: random.Random, n: int = 6) -> list:
    cases = []
    for i in range(n):
        H_kv = rng.choice([1, 2])
        H = H_kv * rng.choice([1, 2])
        T = rng.randint(1, 40)
        S = T + (0 if i % 2 == 0 else rng.randint(1, 30))  # S > T: the queries are the last T
        d = rng.choice([4, 8, 16])
        causal = i % 3 != 2
        block_q, block_k = rng.randint(2, 16), rng.randint(2, 16)
        g = _gen(rng)
        q = torch.randn(1, H, T, d, generator=g, dtype=torch.float64)
        k, v = (torch.randn(1, H_kv, S, d, generator=g, dtype=torch.float64) for _ in range(2))
        label = (f"q {tuple(q.shape)}, k/v {tuple(k.shape)}, causal={causal}, "
                 f"block_q={block_q}, block_k={block_k}")
        cases.append(((_Case((q, k, v), (causal, block_q, block_k), label),), {}))
    return cases


def _attention_hint(args, kwargs, expected, got) -> str:
    (q, k, v), (causal, block_q, block_k) = args[0].tensors, args[0].options
    if not isinstance(got, torch.Tensor):
        return f"return a tensor, not {type(got).__name__}"
    if got.shape != expected.shape:
        return f"the output has q's shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    if causal:
        unmasked = flash_attention(q, k, v, False)
        if torch.allclose(got, unmasked, atol=1e-9):
            return "this is the non-causal result: mask keys j > S - T + i with -inf"
        T, S = q.shape[2], k.shape[2]
        if S > T:
            top_left = flash_attention(q, k[:, :, :T], v[:, :, :T], True)
            if torch.allclose(got, top_left, atol=1e-9):
                return ("the mask is aligned top-left: with T < S the queries are the LAST T "
                        "positions, query i sees keys j <= S - T + i")
    if q.shape[1] != k.shape[1]:
        return "check the grouped-query layout: query head h reads key/value head h // (H / H_kv)"
    return ("values differ: check the rescaling of l_i and O_i by exp(m_old - m_new) "
            "and the blocks at the end (T, S not multiples of the block sizes)")


def check_tiled_attention(fn, n_cases: int = 6) -> int:
    """Check ``fn(q, k, v, causal, block_q, block_k)`` (tiled attention, any T <= S, GQA) against
    :func:`llminfra.attention.flash_attention` on fresh random float64 cases."""
    def call(f):
        return lambda case: f(*case.tensors, *case.options)

    def ref(q, k, v, causal, block_q, block_k):
        return flash_attention(q, k, v, causal, block_q=block_q, block_k=block_k)

    return run_checks("tiled_attention", call(fn), call(ref),
                      _attention_cases(fresh_rng(), n_cases), rel=1e-7, abs_=1e-9,
                      hint=_attention_hint)
