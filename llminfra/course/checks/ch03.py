"""Answer checkers for chapter 03 (``solutions/03_precision_and_quantization.ipynb``):
absmax int8, group-wise int4 with packing, and one GPTQ column update.

Each checker draws fresh random tensors, compares the learner's function with the package's
(:mod:`llminfra.quant`) and, when the wrong answer matches a usual mistake, names it:
dividing by 128 instead of 127, ``max`` instead of ``max |x|``, truncating instead of rounding,
swapped nibbles, a missing offset of 8, the error not divided by ``[H⁻¹]_ii``, a column of
``H⁻¹`` used instead of a row.

Rules: absmax (Dettmers et al., 2022, arXiv:2208.07339, §2); GPTQ's update (Frantar et al.,
2022, arXiv:2210.17323, Algorithm 1).
"""

from __future__ import annotations

import torch

from llminfra.course.checking import CheckFailed, fresh_rng, run_checks
from llminfra.course.checking import torch_generator as _gen
from llminfra.quant import quantize
from llminfra.quant.gptq import column_update, inverse_hessian_factor
from llminfra.quant.rtn import absmax_quantize


class CaseTensor(torch.Tensor):
    """A tensor whose repr is short (shape and a seed-free summary), for readable messages."""

    def __repr__(self) -> str:
        return f"<tensor {tuple(self.shape)} {str(self.dtype).replace('torch.', '')}>"


def _tensor(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(CaseTensor)


def _plain(t):
    return t.as_subclass(torch.Tensor) if isinstance(t, torch.Tensor) else t



# ---- exercise 1: absmax int8 ----------------------------------------------------------------

def _absmax_reference(x):
    q, s = absmax_quantize(_plain(x), 8)
    return q, float(s)


def _absmax_learner(fn):
    def call(x):
        out = fn(x.clone())
        if not (isinstance(out, tuple) and len(out) == 2):
            raise CheckFailed(f"absmax_int8 must return a tuple (q, scale), got {type(out).__name__}")
        q, s = out
        if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
            raise CheckFailed(f"q must be a torch.int8 tensor, got {getattr(q, 'dtype', type(q).__name__)}"
                              " — use .to(torch.int8) after rounding and clamping")
        return _plain(q), float(s)
    return call


def _absmax_hint(args, kwargs, expected, got) -> str:
    x = _plain(args[0]).float()
    q_got, s_got = got

    def near(a, b):
        return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-30)

    if float(x.abs().max()) == 0:
        return "an all-zero tensor has scale 0: return q = 0 (no division by zero, no NaN)"
    if near(s_got, expected[1]):
        trunc = torch.trunc(x / expected[1]).clamp(-127, 127).to(torch.int8)
        if torch.equal(q_got, trunc):
            return "you truncated (int() / .to(int8) directly) instead of rounding to nearest"
        return "the scale is right but q is not round(x / scale) clamped to [-127, 127]"
    if near(s_got, float(x.abs().max()) / 128):
        return "you divided by 128: the symmetric int8 range is [-127, 127], so scale = max|x| / 127"
    if near(s_got, float(x.max()) / 127):
        return "you used max(x), not max(|x|): a negative value can have the largest magnitude"
    return "expected scale = max|x| / 127 and q = round(x / scale)"


def check_absmax_int8(fn) -> int:
    """``fn(x) -> (q int8, scale)`` for per-tensor symmetric absmax int8."""
    rng = fresh_rng()
    cases = []
    for _ in range(6):
        g = _gen(rng)
        shape = (rng.randint(1, 9), rng.randint(1, 70))
        x = torch.randn(*shape, generator=g) * rng.choice([0.01, 1.0, 30.0])
        if rng.random() < 0.5:
            x.view(-1)[0] = -x.abs().max() * 2  # the largest magnitude is negative
        cases.append(((_tensor(x),), {}))
    cases.append(((_tensor(torch.zeros(3, 5)),), {}))
    return run_checks("absmax_int8", _absmax_learner(fn), _absmax_reference, cases,
                      rel=1e-6, hint=_absmax_hint)


# ---- exercise 2: group-wise int4 with packing ------------------------------------------------

def _int4_reference(w, group_size):
    qt = quantize(_plain(w), f"int4-g{group_size}-sym")
    return qt.codes, qt.scale


def _int4_learner(fn):
    def call(w, group_size):
        out = fn(w.clone(), group_size)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise CheckFailed("quantize_int4 must return a tuple (packed, scales)")
        packed, scales = out
        rows, cols = w.shape
        if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 \
                or tuple(packed.shape) != (rows, cols // 2):
            raise CheckFailed(f"packed must be a uint8 tensor of shape {(rows, cols // 2)} (two codes "
                              f"per byte), got {getattr(packed, 'dtype', type(packed).__name__)} "
                              f"{tuple(getattr(packed, 'shape', ()))}")
        if not isinstance(scales, torch.Tensor) or scales.dtype != torch.float16 \
                or tuple(scales.shape) != (rows, cols // group_size):
            raise CheckFailed(f"scales must be a float16 tensor of shape {(rows, cols // group_size)}, "
                              f"got {getattr(scales, 'dtype', type(scales).__name__)} "
                              f"{tuple(getattr(scales, 'shape', ()))}")
        return _plain(packed), _plain(scales)
    return call


def _int4_hint(args, kwargs, expected, got) -> str:
    packed, scales = got
    if not torch.equal(scales, expected[1]):
        ratio = float((scales.float() / expected[1].float()).median())
        if abs(ratio - 7 / 8) < 1e-3:
            return "divide the group's max|w| by 7 (codes -7..7), not by 8"
        return "scales differ: scale = max|w| over each group of group_size columns / 7, as float16"
    swapped = (expected[0] >> 4) | ((expected[0] & 0x0F) << 4)
    if torch.equal(packed, swapped):
        return "nibbles swapped: the even column goes in the LOW 4 bits, the odd one in the HIGH 4"
    return ("codes differ: q = round(w / scale) with the float16 scale, clamped to [-7, 7], stored as "
            "q + 8 (0..15); byte = code[2j] | code[2j+1] << 4")


def check_quantize_int4(fn) -> int:
    """``fn(w, group_size) -> (packed uint8 (rows, cols/2), scales fp16 (rows, cols/group))``."""
    rng = fresh_rng()
    cases = []
    for _ in range(5):
        g = _gen(rng)
        gs = rng.choice([16, 32, 64, 128])
        w = torch.randn(rng.randint(1, 8), gs * rng.randint(1, 4), generator=g) * rng.choice([0.02, 1.0])
        cases.append(((_tensor(w), gs), {}))
    return run_checks("quantize_int4", _int4_learner(fn), _int4_reference, cases, rel=0.0,
                      hint=_int4_hint)


# ---- exercise 3: one GPTQ column update ------------------------------------------------------

def _gptq_reference(W, Hinv, i, q):
    return column_update(_plain(W), _plain(Hinv), i, _plain(q))[0]


def _gptq_learner(fn):
    def call(W, Hinv, i, q):
        W0 = _plain(W).clone()
        out = fn(_plain(W).clone(), _plain(Hinv), i, _plain(q))
        if not isinstance(out, torch.Tensor) or out.shape != W0.shape:
            raise CheckFailed(f"gptq_column_step must return the updated W of shape {tuple(W0.shape)}")
        return _plain(out)
    return call


def _gptq_hint(args, kwargs, expected, got) -> str:
    W, Hinv, i, q = (_plain(a) for a in args)
    err = W[:, i] - q
    no_div = W.clone()
    no_div[:, i:] -= err[:, None] * Hinv[i, i:][None, :]
    if torch.allclose(got, no_div):
        return "divide the rounding error by Hinv[i, i] before spreading it: err = (w_i - q) / Hinv[i, i]"
    col = W.clone()
    col[:, i:] -= (err / Hinv[i, i])[:, None] * Hinv[i:, i][None, :]
    if torch.allclose(got, col):
        return "use the ROW Hinv[i, i:] (upper Cholesky factor), not the column Hinv[i:, i]"
    if not torch.allclose(got[:, i], q):
        return "after the update column i must equal q: include column i itself (W[:, i:])"
    if not torch.allclose(got[:, :i], W[:, :i]):
        return "columns before i are already quantized: leave W[:, :i] unchanged"
    return "expected W[:, i:] -= ((W[:, i] - q) / Hinv[i, i]) ⊗ Hinv[i, i:]"


def check_gptq_column_step(fn) -> int:
    """``fn(W, Hinv, i, q) -> W_updated`` (one step of GPTQ's Algorithm 1)."""
    rng = fresh_rng()
    cases = []
    for _ in range(5):
        g = _gen(rng)
        rows, C = rng.randint(1, 6), rng.randint(3, 12)
        W = torch.randn(rows, C, generator=g, dtype=torch.float64)
        X = torch.randn(4 * C, C, generator=g, dtype=torch.float64)
        Hinv = inverse_hessian_factor(2 * X.T @ X / (4 * C))
        i = rng.randrange(C - 1)
        q = torch.round(W[:, i] * 4) / 4
        cases.append(((_tensor(W), _tensor(Hinv), i, _tensor(q)), {}))
    return run_checks("gptq_column_step", _gptq_learner(fn), _gptq_reference, cases,
                      rel=1e-9, abs_=1e-12, hint=_gptq_hint)
