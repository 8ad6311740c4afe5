"""int4 weights × int8 activations on the CPU: the integer dot products llama.cpp decodes with.

PyTorch's packed-int4 CPU kernel (:mod:`llminfra.quant.cpu_kernels`) turns every 4-bit code
into a float before it multiplies, so on one core it is bound by that unpacking, not by memory.
llama.cpp multiplies differently: it quantizes the activations too, to int8 in groups of 32
(Q8_1), and takes each group's dot product in integers — on AVX-512 VNNI one ``vpdpbusd``
multiplies 64 codes by 64 activations and adds them — so the float work is done once per group
of 32 weights instead of once per weight. ``csrc/w4a8.c`` does the same:

* ``W`` is stored as Q4_1 stores it: per group of 32 along ``K``, codes ``u ∈ [0, 15]`` and an
  fp16 scale ``d`` and offset ``m``, ``w = d·u + m`` (0.625 bytes a weight, what PyTorch's
  kernel reads too);
* each row of ``x`` becomes ``q = round(x · 127 / max|x|)`` per group, ``dx = max|x| / 127``;
* a group adds ``d·dx·Σ u·q + m·dx·Σ q`` to the dot product.

The activations' rounding is the price: the products differ from the float ones by a fraction
of a percent of their scale (``tests/test_w4a8.py`` bounds it), which changes a greedy token
wherever two logits nearly tie — llama.cpp pays the same. ``passes=2`` multiplies the rounding
error too (about 15-bit activations, a second dot product per weight); ``bench real`` counts
how often each keeps the answers of the same int4 weights with fp32 activations.

The library is built for this CPU (:mod:`llminfra.kernels.build`) and loaded through
:mod:`llminfra.kernels.abi`; :func:`build_info` says which code path was compiled:
``"avx512-vnni"`` (16 groups per instruction), ``"avx2"`` (8, with AVX-VNNI where the CPU has
it) or ``"portable"`` (a plain C loop, correct everywhere, not fast). ``python -m llminfra bench
real`` measures it against PyTorch's int4 kernel; the recorded run is
``llminfra/data/bench_real_cpu.json`` (``decode_ms_per_token``: ``fast_int4`` against
``fast_int4_torch``, with ``int4_kernel_build`` the path). Without a compiler
:func:`available` is ``False`` and :func:`library` raises ``RuntimeError`` saying why; the
course then uses PyTorch's int4 kernel (:func:`llminfra.quant.int4_linear`).

``threads`` (default: torch's thread count, :func:`default_threads`) split a product's output
columns (the rows of ``W``) and the rows of ``x`` it quantizes; each output is one thread's dot
product of its own row of ``W``, so the bits are the same for any thread count
(``tests/test_w4a8.py``). :func:`w4a8_linear` keeps its threads between calls in a
:class:`ThreadPool` (``thread_pool.c``: they spin 50 µs after each call, then sleep). Chapters
08 and 12.
"""

from __future__ import annotations

import torch

from llminfra.quant import packing
from llminfra.kernels.huge_pages import Arena
from llminfra.quant.quantize_tensor import quantize
from llminfra.quant.tensor import QuantizedTensor
from llminfra.kernels.abi import Library, refusal
from llminfra.kernels.build import SOURCE, build, cache_dir, cached_build_problem  # noqa: F401
from llminfra.kernels.library import (MAX_K, MAX_THREADS, PATHS, SYMBOLS, ThreadPool,  # noqa: F401
                                      _check_threads, available, build_info, check_cpu,
                                      default_threads, library, load, unavailable_reason)

#: the weights' group size (Q4_1's and Q8_1's)
GROUP = 32
#: K must be a multiple of this (the kernel reads groups in pairs)
K_MULTIPLE = 64


def _check_rows(*counts: int) -> None:
    """Row counts the C code takes as ``int``."""
    for n in counts:
        if not 0 <= n < 2 ** 31:
            raise ValueError(f"the w4a8 kernel takes fewer than 2**31 rows, got {n}")


def _check_k(K: int) -> None:
    if K % K_MULTIPLE or not 0 < K <= MAX_K:
        raise ValueError(f"the w4a8 kernel needs K (the input width) a positive multiple of "
                         f"{K_MULTIPLE} up to {MAX_K}, got {K}")


def pack(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
         lib: Library | None = None) -> dict:
    """Weights ``w = scale·codes + offset`` per group of 32 — ``codes`` integers in [0, 15]
    ``(N, K)``, ``scale`` and ``offset`` ``(N, K/32)`` — in the kernel's layout:
    ``{"codes": uint8 (N, K/2), "d": fp16 bits (N, K/32), "m": …, "shape": (N, K)}``, on the
    CPU. ``ValueError`` naming a tensor on another device or shapes that do not fit."""
    for name, t in (("codes", codes), ("scale", scale), ("offset", offset)):
        check_cpu(name, t)
    lib = library() if lib is None else lib
    if codes.dim() != 2:
        raise ValueError(f"codes must be 2-D (N, K), got shape {tuple(codes.shape)}")
    N, K = codes.shape
    _check_k(K)
    G = K // GROUP
    for name, t in (("scale", scale), ("offset", offset)):
        if tuple(t.shape) != (N, G):
            raise ValueError(f"{name} must have shape {(N, G)} (one per group of {GROUP}), "
                             f"got {tuple(t.shape)}")
    if codes.numel() and not (0 <= int(codes.min()) and int(codes.max()) <= 15):
        raise ValueError(f"codes must lie in [0, 15], got {int(codes.min())} .. "
                         f"{int(codes.max())}")
    u = codes.to(torch.uint8).contiguous()
    _check_rows(N)
    packed = torch.empty(N, K // 2, dtype=torch.uint8)
    status = lib.w4a8_pack(u.data_ptr(), packed.data_ptr(), N, K)
    if status:
        raise ValueError(f"{refusal('w4a8_pack', status)}: K = {K}, N = {N}")
    half = lambda t: t.detach().to(torch.float16).contiguous().view(torch.int16)
    return {"codes": packed, "d": half(scale), "m": half(offset), "shape": (N, K)}


def prepare(q: QuantizedTensor, lib: Library | None = None) -> dict | None:
    """:func:`pack` of an int4 weight quantized in groups of 32 (``int4-g32``: ``w = (u − z)·s``,
    so ``d = s``, ``m = −z·s``; symmetric ``z = 8``); ``None`` for any other scheme or a ``K``
    that is not a multiple of 64."""
    if len(q.shape) != 2:
        return None
    N, K = q.shape
    if not (q.kind == "int" and q.bits == 4 and q.input_scale is None and q.layout.group == GROUP
            and K % K_MULTIPLE == 0 and q.layout.rows == N):
        return None
    u = packing.unpack(q.codes, 4, K).reshape(N, K)
    s = q.scale.float().reshape(N, K // GROUP)
    z = q.zero.float().reshape(N, K // GROUP) if q.zero is not None else torch.full_like(s, 8.0)
    return pack(u, s, -z * s, lib)


def dequantize(w: dict, lib: Library | None = None) -> torch.Tensor:
    """The float32 ``(N, K)`` weight the kernel multiplies by (``d·u + m`` with the fp16 ``d``
    and ``m`` it holds), for checking it."""
    lib = library() if lib is None else lib
    N, K = w["shape"]
    G = K // GROUP
    nibbles = torch.stack([w["codes"] & 15, w["codes"] >> 4], dim=-1).reshape(N, K)
    u = nibbles[:, _slot_of(K, lib)].float().reshape(N, G, GROUP)   # back in natural order
    d = w["d"].view(torch.float16).float().reshape(N, G, 1)
    m = w["m"].view(torch.float16).float().reshape(N, G, 1)
    return (u * d + m).reshape(N, K)


def _slot_of(K: int, lib: Library) -> torch.Tensor:
    """For each natural position k, the nibble (2·byte + high) :func:`pack` puts it in: found by
    packing probe rows whose codes spell k in base 16, then reading each slot's k back."""
    k = torch.arange(K)
    digits = max(1, -(-(K - 1).bit_length() // 4))
    rows = torch.stack([(k >> (4 * i)) & 15 for i in range(digits)]).to(torch.uint8)
    packed = torch.empty(digits, K // 2, dtype=torch.uint8)
    lib.w4a8_pack(rows.contiguous().data_ptr(), packed.data_ptr(), digits, K)
    nib = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(digits, K).long()
    k_at_slot = sum(nib[i] << (4 * i) for i in range(digits))
    slot = torch.empty(K, dtype=torch.long)
    slot[k_at_slot] = k
    return slot


def w4a8_mm(x: torch.Tensor, w: dict, lib: Library | None = None,
            passes: int = 1, threads: int | None = None) -> torch.Tensor:
    """``x (M, K) @ Wᵀ -> (M, N)`` float32 from :func:`pack`'s ``w``, ``x`` quantized to int8
    per group of 32 on the way in (``passes=2``: its rounding error too, see
    :func:`w4a8_linear`), on ``threads`` threads started for this call (None: torch's thread
    count; the same bits for any count). ``ValueError`` naming a tensor on another device, a
    weight not in :func:`pack`'s dtypes, or shapes that do not fit."""
    _check_passes(passes)
    threads = _check_threads(threads)
    check_cpu("x", x)
    for name, dtype in (("codes", torch.uint8), ("d", torch.int16), ("m", torch.int16)):
        check_cpu(f"w[{name!r}]", w[name], dtype)
    if x.dim() != 2 or x.shape[1] != w["shape"][1]:
        raise ValueError(f"x must have shape (M, {w['shape'][1]}), got {tuple(x.shape)}")
    return _multiply(library() if lib is None else lib, w, x.detach().float(), passes,
                     threads=threads)


def _multiply(lib: Library, w: dict, x: torch.Tensor, passes: int,
              norm: torch.Tensor | None = None, eps: float = 0.0,
              gated: bool = False, threads: int = 1,
              pool: ThreadPool | None = None) -> torch.Tensor:
    """``a · Wᵀ`` in ``x``'s dtype, ``a`` formed from ``x (..., K or 2K)`` as ``w4a8_gemm`` in
    the C file says (``gated``: silu(gate)·up; ``norm``: RMSNorm with these gains), on
    ``pool``'s threads, else on ``threads`` started for the call."""
    threads = threads if pool is None else pool.threads
    if x.device.type != "cpu":
        raise ValueError(f"x is on {x.device}: the w4a8 kernel reads CPU memory only")
    N, K = w["shape"]
    width = 2 * K if gated else K
    if x.shape[-1] != width:
        raise ValueError(f"x must end in {width} features{' (gate and up)' if gated else ''}, "
                         f"got shape {tuple(x.shape)}")
    x32 = x if x.dtype == torch.float32 and x.is_contiguous() else x.to(torch.float32).contiguous()
    if norm is not None:
        check_cpu("norm", norm)                         # a meta norm's NULL would mean "none"
        if tuple(norm.shape) != (K,):
            raise ValueError(f"norm must have shape ({K},), got {tuple(norm.shape)}")
        norm = norm.to(torch.float32).contiguous()      # no copy when it is so already
    _check_k(K)
    y = torch.empty(*x.shape[:-1], N)
    if not y.numel():
        return y if x.dtype == torch.float32 else y.to(x.dtype)
    _check_rows(N, y.numel() // N)
    status = lib.w4a8_gemm(x32.data_ptr(), w["codes"].data_ptr(), w["d"].data_ptr(),
                           w["m"].data_ptr(), y.data_ptr(), y.numel() // N, N, K, width,
                           int(gated), None if norm is None else norm.data_ptr(), float(eps),
                           passes, threads, None if pool is None else pool.handle)
    if status == -1:
        raise MemoryError(f"w4a8: no memory for the int8 copy of x {tuple(x.shape)}")
    if status:
        raise ValueError(f"{refusal('w4a8_gemm', status)}: K = {K}, {y.numel() // N} rows, "
                         f"N = {N}, passes = {passes}, threads = {threads}")
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def _check_passes(passes) -> None:
    if passes not in (1, 2) or isinstance(passes, bool):
        raise ValueError(f"passes must be 1 (int8 activations) or 2 (int8 and its rounding "
                         f"error: about 15 bits), got {passes!r}")


class W4A8Weight:
    """One weight on the w4a8 kernel (made by :class:`w4a8_linear`): ``f(x) = x · Wᵀ``, and
    ``f.fused(x, norm=g, eps=ε)`` = ``f(RMSNorm(x)·g)``, ``f.fused(x, gated=True)`` =
    ``f(silu(gate)·up)`` of ``x = [gate | up]`` (the kernel forms them while it quantizes
    ``x``). ``weight``: :func:`pack`'s dict; ``threads``: its pool's; ``nbytes``: what a
    product reads."""

    def __init__(self, lib: Library, weight: dict, passes: int, pool: ThreadPool):
        self.lib, self.weight, self.passes, self.pool = lib, weight, passes, pool
        self.threads = pool.threads
        self.nbytes = sum(weight[k].numel() * weight[k].element_size()
                          for k in ("codes", "d", "m"))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _multiply(self.lib, self.weight, x, self.passes, pool=self.pool)

    def fused(self, x: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 1e-5,
              gated: bool = False) -> torch.Tensor:
        return _multiply(self.lib, self.weight, x, self.passes, norm, eps, gated, pool=self.pool)


class w4a8_linear:
    """``linear(W) -> f``: quantizes ``W`` to int4 once (``int4-g32``, round to nearest with a
    zero point: the codes of :func:`llminfra.quant.int4_linear`), on huge pages
    (:mod:`.huge_pages`), and returns the :class:`W4A8Weight` that multiplies with the w4a8
    kernel. ``passes=2`` rounds what the int8 rounding of ``x`` left to int8 as well and adds
    that product too (activations good to about 15 bits: greedy tokens then follow the int4
    weights with fp32 activations) for a second dot product per weight. ``threads`` (None:
    :func:`default_threads` when called) split each product's rows on one :class:`ThreadPool`
    the weights share (``pool``); the same bits for any count. The runner's kernel set
    (:func:`llminfra.runner.kernel_set.w4a8_kernels`) adds the C attention and the one-call
    step on the same pool. ``RuntimeError`` where the kernel cannot be built
    (:func:`available`), ``ValueError`` for a weight whose input width is not a multiple of
    64."""

    def __init__(self, passes: int = 1, threads: int | None = None):
        _check_passes(passes)
        self.passes, self.lib, self.arena = passes, library(), Arena()
        self.pool = ThreadPool(threads, self.lib)

    def __call__(self, weight: torch.Tensor) -> W4A8Weight:
        if weight.dim() != 2:
            raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
        _check_k(weight.shape[1])
        w = prepare(quantize(weight.detach().float(), f"int4-g{GROUP}"), self.lib)
        w.update({k: self.arena.copy(w[k]) for k in ("codes", "d", "m")})
        return W4A8Weight(self.lib, w, self.passes, self.pool)
