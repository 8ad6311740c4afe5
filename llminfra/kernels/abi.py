"""The C library's interface, declared once: every exported function's argument and return
types, the structures ``decode_stack.c`` reads, every error code, and :func:`load`, which binds
them all to a build and checks it.

Python and C agree on nothing by themselves: ``ctypes`` passes whatever it is told to, so a
signature written twice, once here and once in C, that drifts apart compiles, loads and then
reads the wrong registers. So each signature is written in one place on each side — the
header in ``csrc/`` for C, :data:`FUNCTIONS` here — and :func:`load` refuses a build that
lacks any of them or was built from another version of the sources (:data:`MAX_K`,
:data:`PATHS`). Every other module takes its functions from the :class:`Library` that
:func:`load` returns (``lib.w4a8_gemm(…)``); none sets ``argtypes`` or looks a symbol up
itself. A kernel's return code is 0, or a negative code whose meaning is in :data:`ERRORS`
(:func:`refusal` words it). Chapter 12.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from llminfra.kernels.build import cached_build_problem

_p, _i, _f, _l = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long

#: the widest K every code path's block table holds (``MAX_K`` in w4a8.c: 1000 blocks of 8
#: groups of 32 on the AVX2 path); a build whose ``w4a8_max_k()`` differs is another version
MAX_K = 32 * 8 * 1000
#: ``w4a8_lanes()`` of each code path the int4 kernel has: the int32 lanes of its dot products
PATHS = {16: "avx512-vnni", 8: "avx2", 0: "portable"}
#: the most threads one product is split over (the kernels refuse more)
MAX_THREADS = 64


class StackWeight(ctypes.Structure):
    """``stack_weight`` of decode_stack.c: one product's weight ``(N, K)``, int4 as
    ``w4a8_pack`` leaves it (``codes``, ``d``, ``m``) or fp32 (``codes`` NULL: ``w`` for up to
    ``skinny_rows`` rows, its ``panels`` for up to ``panel_rows``)."""

    _fields_ = [("codes", _p), ("d", _p), ("m", _p), ("w", _p), ("panels", _p), ("N", _i),
                ("K", _i), ("skinny_rows", _i), ("panel_rows", _i)]


class StackLayer(ctypes.Structure):
    """``stack_layer`` of decode_stack.c: a layer's norm gains, four products, K and V pools."""

    _fields_ = [("attn_norm", _p), ("ffn_norm", _p), ("qkv", StackWeight), ("wo", StackWeight),
                ("w13", StackWeight), ("w2", StackWeight), ("k", _p), ("v", _p)]


class StackModel(ctypes.Structure):
    """``stack_model`` of decode_stack.c: the model's sizes and the step's shared settings."""

    _fields_ = [("n_layers", _i), ("dim", _i), ("H", _i), ("H_kv", _i), ("d", _i), ("ffn", _i),
                ("passes", _i), ("threads", _i), ("B", _i), ("W", _i), ("pool_blocks", _i),
                ("eps", _f), ("scale", _f), ("rot_rows", _l), ("slots", _l), ("rot", _p),
                ("embedding", _p), ("final_norm", _p), ("pool", _p)]


#: the products' arguments: x, W (or its panels), r, y, M, N, K, x_stride, gated, norm, eps,
#: threads, pool
_F32_GEMM = (_i, (_p, _p, _p, _p, _i, _i, _i, _i, _i, _p, _f, _i, _p))
#: every function a build must export: ``name -> (restype, argtypes)``, by source file
FUNCTIONS = {
    # w4a8.c: x, codes, d, m, y, M, N, K, x_stride, gated, norm, eps, passes, threads, pool
    "w4a8_gemm": (_i, (_p, _p, _p, _p, _p, _i, _i, _i, _i, _i, _p, _f, _i, _i, _p)),
    "w4a8_pack": (_i, (_p, _p, _i, _i)),                 # codes u, packed, N, K
    "w4a8_lanes": (_i, ()),
    "w4a8_max_k": (_i, ()),
    "w4a8_swiglu": (None, (_p, _p, _p, _i)),              # gate, up, a, K
    # thread_pool.c
    "w4a8_pool_new": (_p, (_i,)),
    "w4a8_pool_free": (None, (_p,)),
    "w4a8_pool_size": (_i, (_p,)),
    # f32_skinny.c and f32_panels.c
    "f32_skinny_gemm": _F32_GEMM,
    "f32_panel_gemm": _F32_GEMM,
    "f32_panel_pack": (_i, (_p, _p, _i, _i)),            # W, panels, N, K
    # paged_decode.c: q, q_row, k, v, tables, lens, out, n, H, H_kv, d, B, W, pool_blocks,
    # scale, threads, pool
    "paged_decode_f32": (_i, (_p, _l, _p, _p, _p, _p, _p, _i, _i, _i, _i, _i, _i, _i, _f, _i,
                              _p)),
    # qkv, N, row_stride, positions, rot, P, H, H_kv, d, slots, S, k, v
    "rope_write_f32": (_i, (_p, _i, _l, _p, _p, _l, _i, _i, _i, _p, _l, _p, _p)),
    # decode_stack.c: model, layers, output, tokens, vocab, positions, slots, tables, n, W,
    # rows, n_rows, x, work, logits
    "w4a8_decode_stack": (_i, (ctypes.POINTER(StackModel), ctypes.POINTER(StackLayer),
                               ctypes.POINTER(StackWeight), _p, _l, _p, _p, _p, _i, _i, _p, _i,
                               _p, _p, _p)),
}
#: functions a build may export, bound where it does: ``const char *llminfra_kernels_isa(void)``,
#: the code path the C side chose (the header declares it; a build of older sources lacks it,
#: and :attr:`Library.isa` then reads the path off ``w4a8_lanes()``)
OPTIONAL_FUNCTIONS = {"llminfra_kernels_isa": (ctypes.c_char_p, ())}
#: what a build must export
SYMBOLS = tuple(FUNCTIONS)

_PRODUCT = {-1: "no memory for the formed or int8 copy of x",
            -2: "a size, passes or thread count out of range"}
_ROPE = {-2: "a size out of range", -3: "a position outside the rotation table",
         -4: "a slot outside the pool"}
_ATTENTION = {-2: "a size or thread count out of range",
              -3: "a context length outside 1 .. W·B (the block table's keys)",
              -4: "a block id of a table outside the pool",
              -5: "no memory for a thread's state"}
#: what each function's negative return codes mean; ``w4a8_decode_stack`` passes on its
#: callees' codes offset by -10 (a product), -20 (RoPE and the K/V write), -30 (attention)
ERRORS = {
    "w4a8_gemm": _PRODUCT, "f32_skinny_gemm": _PRODUCT, "f32_panel_gemm": _PRODUCT,
    "w4a8_pack": {-2: f"K not a positive multiple of 64 up to {MAX_K}, or N below 0"},
    "f32_panel_pack": {-2: "N or K below 0"},
    "paged_decode_f32": _ATTENTION, "rope_write_f32": _ROPE,
    "w4a8_decode_stack": {
        -1: "no memory for the step's int32 block tables",
        -6: "a token outside the vocabulary, a position or block id outside int, or a logits "
            "row outside the step",
        **{rc - 10: f"a product: {why}" for rc, why in _PRODUCT.items()},
        **{rc - 20: f"RoPE and the K/V write: {why}" for rc, why in _ROPE.items()},
        **{rc - 30: f"attention: {why}" for rc, why in _ATTENTION.items()}},
}


def refusal(name: str, rc: int) -> str:
    """``"<name> refused its input (code rc: what it means)"`` for a C function's return code
    (:data:`ERRORS`)."""
    return f"{name} refused its input (code {rc}: {ERRORS.get(name, {}).get(rc, 'unknown')})"


_Fn = ctypes._CFuncPtr


@dataclass(frozen=True)
class Library:
    """A loaded build (:func:`load`): its file, the ``ctypes.CDLL`` and each function of
    :data:`FUNCTIONS` with its types bound, as an attribute of the same name."""

    path: Path
    cdll: ctypes.CDLL
    w4a8_gemm: _Fn
    w4a8_pack: _Fn
    w4a8_lanes: _Fn
    w4a8_max_k: _Fn
    w4a8_swiglu: _Fn
    w4a8_pool_new: _Fn
    w4a8_pool_free: _Fn
    w4a8_pool_size: _Fn
    f32_skinny_gemm: _Fn
    f32_panel_gemm: _Fn
    f32_panel_pack: _Fn
    paged_decode_f32: _Fn
    rope_write_f32: _Fn
    w4a8_decode_stack: _Fn
    #: :data:`OPTIONAL_FUNCTIONS`: None where the build does not export it
    llminfra_kernels_isa: _Fn | None = None

    @property
    def lanes(self) -> int:
        """The int4 kernel's int32 lanes (``w4a8_lanes()``, a key of :data:`PATHS`)."""
        return self.w4a8_lanes()

    @property
    def isa(self) -> str:
        """The code path compiled for this CPU: ``llminfra_kernels_isa()`` where the build
        exports it, else :data:`PATHS` of ``w4a8_lanes()`` (``"avx512-vnni"``, ``"avx2"``,
        ``"portable"``)."""
        if self.llminfra_kernels_isa is not None:
            return self.llminfra_kernels_isa().decode()
        return PATHS.get(self.lanes, f"unknown ({self.lanes} lanes)")


def _exports(cdll: ctypes.CDLL, name: str) -> bool:
    try:
        cdll[name]
    except AttributeError:
        return False
    return True


def _bind(cdll: ctypes.CDLL, name: str, types) -> _Fn:
    """A fresh function object of ``name`` (not ``cdll``'s shared attribute) with its types."""
    fn = cdll[name]
    fn.restype, fn.argtypes = types[0], list(types[1])
    return fn


def load(path: Path) -> Library:
    """The build at ``path``, every function of :data:`FUNCTIONS` bound once. ``RuntimeError``
    with the reason, before anything is loaded, for a file :func:`cached_build_problem`
    refuses; after, for a library that lacks one of :data:`SYMBOLS` or was built from another
    version of the sources (its ``w4a8_max_k()`` not :data:`MAX_K`; its lanes not in
    :data:`PATHS` where it does not name its ISA itself)."""
    path = Path(path)
    problem = cached_build_problem(path)
    if problem is not None:
        raise RuntimeError(f"llminfra kernels: not loading {path}: {problem}")
    cdll = ctypes.CDLL(str(path))
    missing = [name for name in SYMBOLS if not _exports(cdll, name)]
    if missing:
        raise RuntimeError(f"llminfra kernels: {path} is not a build of llminfra/kernels/csrc: "
                           f"it lacks {', '.join(missing)}")
    bound = {name: _bind(cdll, name, types) for name, types in FUNCTIONS.items()}
    bound.update({name: _bind(cdll, name, types) for name, types in OPTIONAL_FUNCTIONS.items()
                  if _exports(cdll, name)})
    lib = Library(path, cdll, **bound)
    known = lib.lanes in PATHS or lib.llminfra_kernels_isa is not None
    if lib.w4a8_max_k() != MAX_K or not known:
        raise RuntimeError(f"llminfra kernels: {path} was built from another version of "
                           f"csrc/ (its widest K is {lib.w4a8_max_k()}, this module's {MAX_K}; "
                           f"its lanes {lib.lanes}, known {sorted(PATHS)})")
    return lib
