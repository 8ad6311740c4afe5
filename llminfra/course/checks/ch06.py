"""Answer checkers for chapter 06 (``solutions/06_flash_attention.ipynb``): a one-pass (online)
softmax, and one tiled attention forward pass.

Each checker builds named cases from one seed, compares the learner's answer with the package's
(:func:`llminfra.attention.online_softmax`, :func:`llminfra.attention.flash_attention`) and,
when the answer is wrong, names the usual mistake it matches. The cases that reach each branch
come first in every run: for the softmax, rows thousands apart with the maximum last (a running
max started at 0 or shared by all rows underflows to 0/0; a sum not rescaled is wrong), then
values ≈ -3000 that float32 cannot hold (a softmax computed in float32 fails every run); for the
attention, grouped-query (8 over 2, 6 over 3), multi-query and multi-head layouts, causal and
not, T = S, T < S and one decode query, a batch of two, T and S that no block size divides.
NaN rows are traced to the mask's offset where they are the rows a wrong offset hides; a right
attention more than 10× slower than the package's tiles gets a note (the chapter's point).

Sources: Milakov & Gimelshein 2018 (arXiv:1805.02867, Algorithm 3); Dao et al. 2022
(FlashAttention, arXiv:2205.14135, Algorithm 1).
"""

from __future__ import annotations

import math
import random

import torch

from llminfra.attention import flash_attention, online_softmax
from llminfra.course.checking import (Case, CheckFailed, Speed, checker, compare, run_checks,
                                      seeded)
from llminfra.course.checking import torch_generator as _gen

__all__ = ["check_online_softmax", "check_tiled_attention", "CheckFailed"]


# ------------------------------------------------------------------ online softmax
def _rows_apart(rng: random.Random) -> torch.Tensor:
    """Three rows: ~N(0, 1000²) with its largest value last, ≈ -3000 and ≈ +1000 (± 10).
    Without the running max exp overflows (rows 0 and 2); a max started at 0 underflows row 1
    to 0 / 0; one max for all rows underflows rows 1 and 2; without rescaling the sum (the
    max grows at the last column) row 0 does not sum to 1."""
    g = _gen(rng)
    cols = rng.randint(3, 40)
    x = torch.randn(3, cols, generator=g, dtype=torch.float64)
    x[0] *= 1000
    x[1] = x[1] * 10 - 3000
    x[2] = x[2] * 10 + 1000
    x[0, -1] = x.abs().max() + 50
    return x


def _float32_blind(rng: random.Random) -> torch.Tensor:
    """Two rows of values ≈ -3000 (as in case 1) that float32 cannot hold: each is a float32
    number moved by 0.45 of its spacing there (2⁻¹², about 2.4e-4), up or down, so a softmax
    computed in float32 is off by about 5e-5, five times float32's own tolerance on the
    result, while float64 holds them exactly."""
    base = -3000 + torch.tensor([0.0, -0.5, 0.25, -1.0, 0.5, -0.25], dtype=torch.float64)
    shift = 0.45 * 2.0**-12 * torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    x = (base + shift)[torch.randperm(6, generator=_gen(rng))]
    return torch.stack([x, x.flip(0)])


def _softmax_cases(rng: random.Random, n: int = 8) -> list[Case]:
    x = _rows_apart(rng)
    cases = [Case(f"x of shape {tuple(x.shape)}, rows thousands apart: ~N(0, 1000²) with its "
                  "largest value last, ≈ -3000, ≈ +1000", (x,)),
             Case("x of shape (2, 6), values ≈ -3000 that float32 cannot hold (float64 in, "
                  "float64 precision out)", (_float32_blind(rng),))]
    for i in range(2, n):
        rows, cols = rng.randint(1, 4), rng.randint(1, 40)
        scale = [1000.0, 1.0, 10.0][i % 3]  # 1000: exp overflows without the running max
        x = torch.randn(rows, cols, generator=_gen(rng), dtype=torch.float64) * scale
        cases.append(Case(f"x of shape {tuple(x.shape)}, values ~N(0, {scale:g}²)", (x,)))
    return cases


def _softmax_hint(args, kwargs, expected, got) -> str:
    if not isinstance(got, torch.Tensor):
        return f"return a tensor, not {type(got).__name__}"
    if got.shape != expected.shape:
        return f"return the same shape as x {tuple(expected.shape)}, got {tuple(got.shape)}"
    got = got.double()
    if not torch.isfinite(got).all():
        x = args[0]
        bad = ~torch.isfinite(got).all(-1)
        row_max = x.amax(-1)
        if not bool(bad[row_max == x.max()].any()):  # the row that holds the overall max is fine
            if bool((row_max[bad] > 0).any()):
                return ("rows far below the largest value of x came out inf/nan: keep one "
                        "running max PER ROW (shape (rows, 1)), not one for the whole tensor")
            return ("rows whose values are all far below 0 came out 0/0: start the running max "
                    "at -inf, not 0 (exp(x - 0) underflows to 0)")
        return ("the result has inf/nan: subtract the running max before exp, and rescale the "
                "running sum by exp(m_old - m_new) when the max grows")
    if torch.allclose(got, online_softmax(args[0].float()).double(), rtol=1e-6, atol=1e-9):
        return ("you computed in float32: x is float64 and so is every statistic — create m "
                "and l with dtype=x.dtype (torch.full's default is float32)")
    sums = got.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
        worst = int((sums - 1).abs().argmax())
        return (f"row {worst} sums to {float(sums[worst]):.6g}, not 1 (rows sum to 1 when the "
                "running sum is right): when the max grows, multiply the running sum by "
                "exp(m_old - m_new); divide by the final sum at the end")
    return "each row sums to 1 but the values differ from softmax(x)"


@checker
def check_online_softmax(fn, n_cases: int = 8, seed: int | None = None) -> int:
    """Check ``fn(x) -> softmax(x)`` along the last dim of a 2-D float64 tensor (one pass for
    the statistics) against :func:`llminfra.attention.online_softmax`. Case 1, in every run:
    rows thousands apart (overflow without the running max; underflow with a max started at 0
    or shared by the rows) with the maximum in the last column (rescaling)."""
    seed, rng = seeded(seed)
    return run_checks("online_softmax", fn, online_softmax, _softmax_cases(rng, n_cases),
                      rel=1e-9, abs_=1e-12, hint=_softmax_hint, seed=seed,
                      replay="ch06.check_online_softmax")


# ------------------------------------------------------------------ tiled attention
# (B, H, H_kv, causal, T, S): the layouts and masks the instructions name, in every run. T = 37
# and T = S = 23 are primes, so no block size (2 … 16) divides them: a last, shorter block is
# always there.
_ATTENTION_LAYOUTS = [
    (1, 8, 2, True, 37, 64),   # GQA: .repeat instead of .repeat_interleave shows (group 4)
    (2, 6, 3, False, 23, 23),  # GQA with an odd number of KV heads; a batch of two
    (1, 4, 1, True, 19, 19),   # MQA, causal, T = S
    (1, 2, 2, True, 1, 29),    # MHA, one decode query at the end of the keys
    (1, 4, 4, False, 16, 40),  # MHA, not causal, T < S
]


def _layout_name(B: int, H: int, H_kv: int, causal: bool, T: int, S: int, d: int, bq: int,
                 bk: int) -> str:
    kind = ("MHA" if H == H_kv else "MQA" if H_kv == 1 else "GQA")
    heads = (f"{H} heads" if H == H_kv else
             f"{H} query heads over {H_kv} KV head{'s' if H_kv > 1 else ''}")
    return (f"{kind} {heads}, {'causal' if causal else 'not causal'}, T={T} S={S}, batch {B}, "
            f"d={d}, block_q={bq} block_k={bk}")


def _attention_cases(rng: random.Random, n: int = 6) -> list[Case]:
    layouts = list(_ATTENTION_LAYOUTS)
    while len(layouts) < n:
        H_kv = rng.choice([1, 2, 3])
        T = rng.randint(1, 40)
        layouts.append((rng.choice([1, 2]), H_kv * rng.choice([1, 2, 4]), H_kv,
                        rng.random() < 0.5, T, T + rng.randint(0, 30)))
    cases = []
    for B, H, H_kv, causal, T, S in layouts[:max(n, 1)]:
        d = rng.choice([4, 8, 16])
        block_q, block_k = rng.randint(2, 16), rng.randint(2, 16)
        g = _gen(rng)
        q = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
        k, v = (torch.randn(B, H_kv, S, d, generator=g, dtype=torch.float64) for _ in range(2))
        cases.append(Case(_layout_name(B, H, H_kv, causal, T, S, d, block_q, block_k),
                          (q, k, v, causal, block_q, block_k)))
    return cases


def _attention_variants(q, k, v, causal) -> dict[str, torch.Tensor]:
    """Wrong answers a learner plausibly writes, each with what to say about it."""
    H, H_kv, T, S, d = q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]
    G = H // H_kv

    def attend(kk, vv, scale=1 / math.sqrt(d), top_left=False, mask=causal, diagonal=True,
               extra=0):
        s = q @ kk.transpose(-2, -1) * scale
        if mask:
            offset = (0 if top_left else S - T) + extra
            keep = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + offset - int(not diagonal)
            s = s.masked_fill(~keep, -math.inf)
        return torch.nan_to_num(torch.softmax(s, -1) @ vv)

    k_i, v_i = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    k_r, v_r = k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1)
    return {
        "this is the non-causal result: mask keys j > S - T + i with -inf": attend(k_i, v_i, mask=False),
        "the mask is aligned top-left: with T < S the queries are the LAST T positions, query i "
        "sees keys j <= S - T + i": attend(k_i, v_i, top_left=True),
        "the mask hides the query's own position: query i sees keys j <= S - T + i (mask "
        "j > S - T + i, not j >= S - T + i)": attend(k_i, v_i, diagonal=False),
        "the mask lets each query see one key too many: query i sees keys j <= S - T + i "
        "(mask j > S - T + i)": attend(k_i, v_i, extra=1),
        "the scores are not scaled: S_ij = Q_i K_jᵀ / √d": attend(k_i, v_i, scale=1.0),
        "the scores are divided by d, not √d": attend(k_i, v_i, scale=1 / d),
        "wrong grouped-query mapping: query head h reads K/V head h // (H / H_kv) — use "
        "repeat_interleave(H // H_kv, dim=1), not repeat (which gives h % H_kv)": attend(k_r, v_r),
    }


def _attention_hint(args, kwargs, expected, got) -> str:
    q, k, v, causal, block_q, block_k = args
    if not isinstance(got, torch.Tensor):
        return f"return a tensor, not {type(got).__name__}"
    if got.shape != expected.shape:
        return f"the output has q's shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    got = got.double()
    for why, wrong in _attention_variants(q, k, v, causal).items():
        if compare(wrong, got, 1e-5, 1e-6) is None and compare(wrong, expected, 1e-5, 1e-6):
            return why
    if expected.shape[0] > 1 and compare(expected[:1], got[:1], 1e-7, 1e-9) is None:
        return ("sequence 0 of the batch is right, the others are not: q, k and v are "
                "(B, H, …, d); keep the batch dimension in every slice and product")
    if not torch.isfinite(got).all():
        return _nonfinite_attention_hint(got, causal, q.shape[2], k.shape[2])
    skipped = ("; if you skip key blocks above the diagonal: it is shifted by S - T, so a block "
               "is hidden only when its first key > S - T + the block's last query"
               if causal and q.shape[2] < k.shape[2] else "")
    return ("values differ: check the rescaling of l_i and O_i by exp(m_old - m_new) "
            "and the blocks at the end (T, S not multiples of the block sizes)" + skipped)


def _nonfinite_attention_hint(got, causal: bool, T: int, S: int) -> str:
    """NaN rows: with the right mask every query sees key 0, so no row is ever fully masked —
    NaN rows come from the mask's offset (named when the rows are the ones it hides wholly),
    else from a first block whose scores are all -inf (m = -inf, exp(-inf - -inf))."""
    bad = ~torch.isfinite(got).all(-1).reshape(-1, T).any(0)  # (T,): rows with inf / nan
    offsets = {T - S: "the mask's offset has the wrong sign (j > i - (S - T)): query i sees "
                      "keys j <= S - T + i, so every query sees key 0",
               -1: "the mask hides key 0 from query 0: query i sees keys j <= S - T + i"}
    if causal:
        for offset, why in offsets.items():
            hidden = (torch.arange(S)[None, :] <= torch.arange(T)[:, None] + offset).sum(-1) == 0
            if offset < 0 and torch.equal(bad, hidden):
                return f"rows 0-{int(hidden.sum()) - 1} came out inf/nan: {why}"
    return (f"{int(bad.sum())} of {T} query rows came out inf/nan: with the right mask no row "
            "is fully masked (every query sees key 0); a block whose scores are all -inf taken "
            "first gives m = -inf: start m at -inf and guard exp(-inf - -inf), or check the "
            "mask's offset S - T")


def _attention_error_hint(args, kwargs, error) -> str:
    q, k = args[0], args[1]
    if q.shape[1] != k.shape[1] and "size of tensor" in str(error):
        return (f"q has {q.shape[1]} heads but k and v have {k.shape[1]}: query head h reads "
                f"K/V head h // (H / H_kv); expand k and v with repeat_interleave(H // H_kv, dim=1)")
    return ""


@checker
def check_tiled_attention(fn, n_cases: int = 6, seed: int | None = None) -> int:
    """Check ``fn(q, k, v, causal, block_q, block_k)`` (tiled attention, any T <= S, GQA) against
    :func:`llminfra.attention.flash_attention` on float64 cases: GQA (8 over 2, 6 over 3), MQA
    and MHA, causal and not, T = S, T < S and one decode query, a batch of two, in every run."""
    def ref(q, k, v, causal, block_q, block_k):
        return flash_attention(q, k, v, causal, block_q=block_q, block_k=block_k)

    seed, rng = seeded(seed)
    g = _gen(random.Random(0))
    q, k, v = (torch.randn(1, 4, 256, 32, generator=g, dtype=torch.float64) for _ in range(3))
    speed = Speed(Case("MHA 4 heads, causal, T=S=256, d=32, block_q=block_k=64",
                       (q, k, v, True, 64, 64)),
                  against="the package's flash_attention (one (block_q × block_k) tile of "
                          "matrix products at a time)",
                  point="tiles of whole matrix products — a loop over single queries or keys "
                        "does the same arithmetic far slower", factor=10)
    return run_checks("tiled_attention", fn, ref, _attention_cases(rng, n_cases), rel=1e-7,
                      abs_=1e-9, hint=_attention_hint, seed=seed,
                      replay="ch06.check_tiled_attention", on_error=_attention_error_hint,
                      speed=speed)
