"""Answer checkers for chapter 03 (``solutions/03_precision_and_quantization.ipynb``):
absmax int8, group-wise int4 with packing, and one GPTQ column update.

Each checker builds named cases from one seed. Always there, in the same places: an all-zero
input (absmax) or group (int4); exact .5 ties; a 3-D tensor whose quotients ``x / scale`` are
±(k + 0.7), where rounding and truncation differ; a largest magnitude that is negative (absmax
and int4); for int4 two groups a row and a value that rounds one way with the fp16 scale and the
other with the fp32 one; for GPTQ the first and the last-but-one column. The learner's function
is compared with the package's (:mod:`llminfra.quant`) and the message names the usual mistake
the wrong answer matches: dividing by 128 (or 255) instead of 127, ``max`` instead of
``max |x|``, one scale per row, truncating instead of rounding, the fp32 scale where the fp16
one is stored, swapped nibbles, a missing offset of 8, a division by zero, the error not
divided by ``[H⁻¹]_ii``, the update's sign, the last column left out, a column of ``H⁻¹`` used
instead of a row, the input modified in place. A right int4 quantizer more than 20× slower than
the package's (a Python loop over groups or values) gets a note under its ✓ line; one that
allocates with ``torch.empty`` and fills every element passes.

Rounding ties: ``round`` means to nearest; a value exactly halfway between two integers (up to
the float rounding of the division) may go either way, and both are accepted.

Rules: absmax (Dettmers et al., 2022, arXiv:2208.07339, §2); GPTQ's update (Frantar et al.,
2022, arXiv:2210.17323, Algorithm 1).
"""

from __future__ import annotations

import random

import torch

from llminfra.course.checking import (Case, CheckFailed, Speed, as_like, checker, describe,
                                      run_checks, seeded)
from llminfra.course.checking import torch_generator as _gen
from llminfra.quant import quantize
from llminfra.quant.gptq import column_update, inverse_hessian_factor
from llminfra.quant.rtn import absmax_quantize

TIE_BAND = 1e-4  # |x/scale - (k + ½)| below this counts as a tie (float rounding of the division)


def _accept_ties(q_got: torch.Tensor, q_ref: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``q_got`` with every tie position where it took the other neighbour set to ``q_ref``'s
    value (``t`` = the exact quotient ``x / scale`` in float64)."""
    tie = ((t.abs() - t.abs().floor()) - 0.5).abs() < TIE_BAND
    other = (q_got.long() - q_ref.long()).abs() == 1
    return torch.where(tie & other, q_ref.to(q_got.dtype), q_got)


# ---- exercise 1: absmax int8 ----------------------------------------------------------------

def _absmax_reference(x):
    q, s = absmax_quantize(x, 8)
    return q, float(s)


def _absmax_normalize_for(current: list):
    """The normaliser of the case in ``current[0]``: checks the types, accepts ties."""
    def normalize(expected, got):
        return _absmax_normalize(current[0], expected, got)
    return normalize


def _absmax_normalize(x, expected, got):
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise CheckFailed(f"absmax_int8 must return a tuple (q, scale), got {describe(got)}")
    q, s = got
    if not torch.is_tensor(q) or q.dtype != torch.int8:
        raise CheckFailed(f"q must be a torch.int8 tensor, got {describe(q)} — use "
                          ".to(torch.int8) after rounding and clamping")
    s = as_like(expected[1], s)
    q_ref, s_ref = expected
    if isinstance(s, float) and q.shape == q_ref.shape and s_ref > 0:
        return _accept_ties(q, q_ref, x.double() / s_ref), s
    return q, s


def _absmax_hint(args, kwargs, expected, got) -> str:
    x = args[0].float()
    q_got, s_got = got
    if torch.is_tensor(s_got) and s_got.numel() > 1:
        return (f"one scale for the whole tensor (per-tensor absmax): the max of |x| over all "
                f"of x, not one per row (you returned {s_got.numel()} scales)")
    if not isinstance(s_got, float):
        return f"scale must be a number (a float or a 0-d tensor), got {describe(s_got)}"

    def near(a, b):
        return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-30)

    if float(x.abs().max()) == 0:
        return "an all-zero tensor has scale 0: return q = 0 (no division by zero, no NaN)"
    if near(s_got, expected[1]):
        t = x.double() / expected[1]
        frac = t.abs() - t.abs().floor()  # away from integers and ties, where noise can't flip
        clear = ((frac - 0.5).abs() > 1e-3) & (frac > 1e-3) & (frac < 1 - 1e-3)
        trunc = torch.trunc(t).clamp(-127, 127).to(torch.int8)
        if torch.equal(q_got[clear], trunc[clear]):
            return "you truncated (int() / .to(int8) directly) instead of rounding to nearest"
        return "the scale is right but q is not round(x / scale) clamped to [-127, 127]"
    if near(s_got, float(x.abs().max()) / 128):
        return "you divided by 128: the symmetric int8 range is [-127, 127], so scale = max|x| / 127"
    if near(s_got, float(x.abs().max()) / 255) or near(s_got, float(x.max() - x.min()) / 255):
        return ("that is an asymmetric (255-level) scale: absmax int8 is symmetric, "
                "scale = max|x| / 127")
    if near(s_got, float(x.max()) / 127):
        return "you used max(x), not max(|x|): a negative value can have the largest magnitude"
    return "expected scale = max|x| / 127 and q = round(x / scale)"


def _absmax_cases(rng: random.Random) -> list[Case]:
    zero_hint = ("on an all-zero tensor the scale is 0 and x / 0 is NaN: return q = 0 (and "
                 "scale 0) without dividing")
    cases = [Case("all-zero x of shape (3, 5)", (torch.zeros(3, 5),), nonfinite_hint=zero_hint)]
    k = torch.randint(-126, 126, (4, 16), generator=_gen(rng)).double() + 0.5
    ties = (k * 2.0**-4).float()  # x / scale = k + ½ exactly: scale 2**-4 is a power of two
    ties.view(-1)[0] = 127 * 2.0**-4
    cases.append(Case("exact .5 ties: x = (k + ½)·2⁻⁴, max|x| = 127·2⁻⁴, shape (4, 16)", (ties,)))
    k = torch.randint(0, 126, (2, 3, 4), generator=_gen(rng)).double() + 0.7
    sign = torch.randint(0, 2, (2, 3, 4), generator=_gen(rng)).double() * 2 - 1
    away = (sign * k * 2.0**-4).float()  # x / scale = ±(k + 0.7): round and trunc differ
    away.view(-1)[-1] = -127 * 2.0**-4
    cases.append(Case("x / scale = ±(k + 0.7), scale 2⁻⁴: rounding to nearest is not "
                      "truncation; largest magnitude negative; 3-D shape (2, 3, 4)", (away,)))
    for n in range(4):
        shape = (rng.randint(1, 9), rng.randint(2, 70))
        spread = [0.01, 1.0, 30.0][n % 3]
        x = torch.randn(*shape, generator=_gen(rng)) * spread
        negative = n % 2 == 0
        if negative:
            x.view(-1)[rng.randrange(x.numel())] = -x.abs().max() * 2
        cases.append(Case(f"x of shape {shape} ~ N(0, {spread:g}²)"
                          + (", largest magnitude negative" if negative else ""), (x,)))
    return cases


@checker
def check_absmax_int8(fn, seed: int | None = None) -> int:
    """``fn(x) -> (q int8, scale)`` for per-tensor symmetric absmax int8; an all-zero tensor
    (guard), exact .5 ties (either neighbour accepted) and a 3-D tensor whose quotients are
    ±(k + 0.7) (rounding, not truncation) and whose largest magnitude is negative, in every
    run."""
    seed, rng = seeded(seed)
    current: list = [None]

    def learner(x):
        current[0] = x
        return fn(x)

    return run_checks("absmax_int8", learner, _absmax_reference, _absmax_cases(rng), rel=1e-6,
                      hint=_absmax_hint, seed=seed, replay="ch03.check_absmax_int8",
                      normalize=_absmax_normalize_for(current), owner=fn)


# ---- exercise 2: group-wise int4 with packing ------------------------------------------------

def _int4_reference(w, group_size):
    qt = quantize(w, f"int4-g{group_size}-sym")
    return qt.codes, qt.scale


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    out = torch.stack([packed & 0x0F, packed >> 4], dim=-1)
    return out.reshape(packed.shape[0], -1).long()


def _int4_normalize_for(w_of_case):
    def normalize(expected, got):
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise CheckFailed(f"quantize_int4 must return a tuple (packed, scales), got {describe(got)}")
        packed, scales = got
        rows, cols = expected[0].shape[0], expected[0].shape[1] * 2
        group_size = cols // expected[1].shape[1]
        if not torch.is_tensor(packed) or packed.dtype != torch.uint8 \
                or tuple(packed.shape) != (rows, cols // 2):
            raise CheckFailed(f"packed must be a uint8 tensor of shape {(rows, cols // 2)} (two "
                              f"codes per byte), got {describe(packed)}")
        if not torch.is_tensor(scales) or scales.dtype != torch.float16 \
                or tuple(scales.shape) != (rows, cols // group_size):
            raise CheckFailed(f"scales must be a float16 tensor of shape "
                              f"{(rows, cols // group_size)}, got {describe(scales)}")
        if torch.equal(scales, expected[1]):
            s = scales.double().repeat_interleave(group_size, dim=1)
            t = w_of_case[0].double() / torch.where(s == 0, torch.ones_like(s), s)
            codes = _accept_ties(_unpack(packed) - 8, _unpack(expected[0]) - 8, t) + 8
            packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
        return packed, scales
    return normalize


def _int4_hint(args, kwargs, expected, got) -> str:
    w, group_size = args
    packed, scales = got
    if not torch.equal(scales, expected[1]):
        rows, cols = w.shape
        G = w.float().reshape(rows, cols // group_size, group_size)
        if torch.equal(scales, (G.amax(-1) / 7).to(torch.float16)):
            return ("you used max(w), not max(|w|): a group's largest magnitude can be "
                    "negative")
        if torch.equal(scales, (G.abs().amax(-1) / 8).to(torch.float16)):
            return "divide the group's max|w| by 7 (codes -7..7), not by 8"
        ratio = float((scales.float() / expected[1].float()).nanmedian())
        if abs(ratio - 7 / 8) < 1e-3:
            return "divide the group's max|w| by 7 (codes -7..7), not by 8"
        return ("scales differ: scale = max|w| over each group of group_size consecutive "
                "columns / 7, as float16")
    swapped = (expected[0] >> 4) | ((expected[0] & 0x0F) << 4)
    if torch.equal(packed, swapped):
        return "nibbles swapped: the even column goes in the LOW 4 bits, the odd one in the HIGH 4"
    rows, cols = w.shape
    G = w.float().reshape(rows, cols // group_size, group_size)
    s32 = (G.abs().amax(-1, keepdim=True) / 7)
    s32 = torch.where(s32 == 0, torch.ones_like(s32), s32)
    codes32 = (torch.round(G / s32).clamp(-7, 7) + 8).long().reshape(rows, cols)
    mine, ref = _unpack(packed), _unpack(expected[0])
    differ = mine != ref  # where ties were accepted the codes already read as the reference's
    if bool(differ.any()) and torch.equal(mine[differ], codes32[differ]):
        return ("you rounded with the float32 scale max|w| / 7, but what is stored is its "
                "float16 rounding: divide by scales.float() (what you store is what you use)")
    if (expected[1] == 0).any():
        zero = (expected[1] == 0).repeat_interleave(group_size, dim=1)
        if torch.equal(mine[~zero], ref[~zero]) and not torch.equal(mine[zero], ref[zero]):
            return ("an all-zero group has scale 0: its codes are 8 (q = 0); don't divide by the "
                    "zero scale (0/0 is NaN)")
    return ("codes differ: q = round(w / scale) with the float16 scale, clamped to [-7, 7], "
            "stored as q + 8 (0..15); byte = code[2j] | code[2j+1] << 4")


def _fp16_discriminating(rng: random.Random, group_size: int) -> torch.Tensor:
    """One row whose first group holds a value that rounds to k with the fp16 scale and to
    k + 1 with the fp32 scale (or the other way round)."""
    g = _gen(rng)
    while True:
        w = torch.randn(1, group_size, generator=g)
        s32 = w.abs().max() / 7
        s16 = s32.half().float()
        if (s16 - s32).abs() > 2e-4 * s32:  # the fp16 rounding of the scale is visible
            break
    k = 5.5
    w[0, 1 if w[0, 0].abs() == w.abs().max() else 0] = k * (s16 + s32) / 2
    return w


def _int4_cases(rng: random.Random) -> list[Case]:
    zero_hint = ("an all-zero group has scale 0 and w / 0 is NaN: give it codes 8 (q = 0) "
                 "without dividing, e.g. divide by 1 where the scale is 0")
    cases = []
    w = torch.randn(3, 64, generator=_gen(rng))
    w[1, 32:] = 0
    w[0, 5] = -(w[0, :32].abs().max() + 0.5)  # a group whose largest magnitude is negative
    cases.append(Case("w (3, 64), group_size 32 (two groups a row), row 1's second group all "
                      "zero, row 0's first group's largest magnitude negative", (w, 32),
                      nonfinite_hint=zero_hint))
    cases.append(Case("w (1, 16), group_size 16, a value between the fp16 and fp32 "
                      "scales' rounding boundaries", (_fp16_discriminating(rng, 16), 16)))
    for n in range(4):
        gs = rng.choice([16, 32, 64, 128])
        rows, spread = rng.randint(1, 8), [0.02, 1.0][n % 2]
        w = torch.randn(rows, gs * rng.randint(1, 4), generator=_gen(rng)) * spread
        cases.append(Case(f"w {tuple(w.shape)} ~ N(0, {spread:g}²), group_size {gs}", (w, gs)))
    return cases


@checker
def check_quantize_int4(fn, seed: int | None = None) -> int:
    """``fn(w, group_size) -> (packed uint8 (rows, cols/2), scales fp16 (rows, cols/group))``;
    an all-zero group and a value that only the stored fp16 scale rounds right in every run."""
    seed, rng = seeded(seed)
    current: list = [None]

    def learner(w, group_size):
        current[0] = w
        return fn(w, group_size)

    timing = torch.randn(256, 1024, generator=_gen(random.Random(0)))
    speed = Speed(Case("w (256, 1024), group_size 128", (timing, 128)),
                  against="the package's quantize (whole tensors at once)",
                  point="quantizing a model's weights with a few whole-tensor operations, "
                        "not a Python loop over groups or values", factor=20)
    return run_checks("quantize_int4", learner, _int4_reference, _int4_cases(rng), rel=0.0,
                      hint=_int4_hint, seed=seed, replay="ch03.check_quantize_int4",
                      normalize=_int4_normalize_for(current), owner=fn, speed=speed)


# ---- exercise 3: one GPTQ column update ------------------------------------------------------

def _gptq_reference(W, Hinv, i, q):
    return column_update(W, Hinv, i, q)[0]


def _gptq_hint(args, kwargs, expected, got) -> str:
    W, Hinv, i, q = args
    if not torch.is_tensor(got) or got.shape != expected.shape:
        return f"return the updated W, a tensor of shape {tuple(expected.shape)}"
    got = got.double()
    tol = dict(rtol=1e-5, atol=1e-6)
    err = W[:, i] - q
    no_div = W.clone()
    no_div[:, i:] -= err[:, None] * Hinv[i, i:][None, :]
    wrong_sign = W.clone()
    wrong_sign[:, i:] += (err / Hinv[i, i])[:, None] * Hinv[i, i:][None, :]
    if torch.allclose(got, wrong_sign, **tol):
        return ("the update has the wrong sign: err = (W[:, i] - q) / Hinv[i, i] is what rounding "
                "removed; SUBTRACT err ⊗ Hinv[i, i:] (column i then equals q)")
    if torch.allclose(got, no_div, **tol):
        return "divide the rounding error by Hinv[i, i] before spreading it: err = (w_i - q) / Hinv[i, i]"
    col = W.clone()
    col[:, i:] -= (err / Hinv[i, i])[:, None] * Hinv[i:, i][None, :]
    if torch.allclose(got, col, **tol):
        return "use the ROW Hinv[i, i:] (upper Cholesky factor), not the column Hinv[i:, i]"
    if not torch.allclose(got[:, i], q, **tol):
        return "after the update column i must equal q: include column i itself (W[:, i:])"
    if not torch.allclose(got[:, :i], W[:, :i], **tol):
        return "columns before i are already quantized: leave W[:, :i] unchanged"
    if torch.allclose(got[:, :-1], expected[:, :-1], **tol) \
            and not torch.allclose(got[:, -1], expected[:, -1], **tol):
        return "the last column was left out: update every column from i to the end, W[:, i:]"
    return "expected W[:, i:] -= ((W[:, i] - q) / Hinv[i, i]) ⊗ Hinv[i, i:]"


@checker
def check_gptq_column_step(fn, seed: int | None = None) -> int:
    """``fn(W, Hinv, i, q) -> W_updated`` (one step of GPTQ's Algorithm 1), leaving its inputs
    unchanged; column 0, the last-but-one column and random ones in every run."""
    seed, rng = seeded(seed)
    cases = []
    for n in range(5):
        g = _gen(rng)
        rows, C = rng.randint(2, 6), rng.randint(3, 12)
        W = torch.randn(rows, C, generator=g, dtype=torch.float64)
        X = torch.randn(4 * C, C, generator=g, dtype=torch.float64)
        Hinv = inverse_hessian_factor(2 * X.T @ X / (4 * C))
        i = [0, C - 2][n] if n < 2 else rng.randrange(1, C - 1)
        q = torch.round(W[:, i] * 4) / 4
        cases.append(Case(f"W {tuple(W.shape)} float64, column i={i}, Hinv ({C}, {C}) from "
                          f"{4 * C} random samples", (W, Hinv, i, q)))
    return run_checks("gptq_column_step", fn, _gptq_reference, cases, rel=1e-9, abs_=1e-12,
                      hint=_gptq_hint, seed=seed, replay="ch03.check_gptq_column_step", pure=True)
