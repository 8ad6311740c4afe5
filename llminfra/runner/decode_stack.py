"""A decode step in one C call: ``decode_stack.c`` beside this file, for int4 (w4a8) and fp32
weights on the package's C kernels.

The fast runner's decode step (:func:`llminfra.runner.fast_step.decode_step`) on the C kernels
makes six ctypes calls a layer — the q/k/v product with its RMSNorm, RoPE and the K/V write,
paged attention, the output product, the gate/up product, the down product — and a residual
add after two of them: about 240 Python calls a step of SmolLM2-135M, each 5–15 µs.
``w4a8_decode_stack`` makes the same calls from C, in the same order, on the same inputs, with
the same float adds, so the logits are the same bits as the Python step's
(``tests/test_decode_stack.py``); the Python step stays the readable account of it. Measured
2026-12-06 on the 2-core Xeon, the engine's int4 decode step (two threads, median of a 64-token
answer, the two alternated in one process): one sequence 6.1–6.4 → 3.7–3.85 ms, sixteen
25.9–26.6 → 22.5–22.9 ms.

:func:`builder` is what :func:`llminfra.kernels.w4a8.w4a8_linear` and
:class:`llminfra.kernels.f32_skinny.skinny_linear` hand the engine as their ``decode_stack``:
``build(weights, pools)`` returns a :class:`DecodeStack` for fused weights whose every matrix
is a product of those kernels without bias (w4a8, or fp32 ``SkinnyMatmul``), on fp32 CPU pools
— else None, and the runner keeps the Python step. Chapter 05.
"""

from __future__ import annotations

import ctypes

import torch

from llminfra.runner.fused import SkinnyMatmul

_p, _i, _f, _l = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long
#: what ``w4a8_decode_stack`` returns for input it refuses (and its callees' codes, offset)
ERRORS = {-1: "no memory for the step's int32 block tables",
          -6: "a token outside the vocabulary, a position or block id outside int, or a "
              "logits row outside the step",
          -11: "a product ran out of memory", -12: "a product refused its sizes",
          -22: "RoPE refused its sizes", -23: "a position outside the rotation table",
          -24: "a slot outside the pool", -32: "attention refused its sizes",
          -33: "a context length outside the block table",
          -34: "a block id outside the pool", -35: "no memory for attention's state"}


class _Weight(ctypes.Structure):
    _fields_ = [("codes", _p), ("d", _p), ("m", _p), ("w", _p), ("panels", _p), ("N", _i),
                ("K", _i), ("skinny_rows", _i), ("panel_rows", _i)]


class _Layer(ctypes.Structure):
    _fields_ = [("attn_norm", _p), ("ffn_norm", _p), ("qkv", _Weight), ("wo", _Weight),
                ("w13", _Weight), ("w2", _Weight), ("k", _p), ("v", _p)]


class _Model(ctypes.Structure):
    _fields_ = [("n_layers", _i), ("dim", _i), ("H", _i), ("H_kv", _i), ("d", _i), ("ffn", _i),
                ("passes", _i), ("threads", _i), ("B", _i), ("W", _i), ("pool_blocks", _i),
                ("eps", _f), ("scale", _f), ("rot_rows", _l), ("slots", _l), ("rot", _p),
                ("embedding", _p), ("final_norm", _p), ("pool", _p)]


def c_function(lib: ctypes.CDLL):
    """``w4a8_decode_stack`` of a build of the w4a8 library with its argument types."""
    fn = lib.w4a8_decode_stack
    fn.argtypes = [_p, _p, _p, _p, _l, _p, _p, _p, _i, _i, _p, _i, _p, _p, _p]
    fn.restype = _i
    return fn


def _weight(matmul) -> _Weight | None:
    """The C view of a product: w4a8 (a ``FunctionMatmul`` of :func:`w4a8_linear`'s ``f``) or
    fp32 on the C kernels (a ``SkinnyMatmul`` with its panels); None for any other matmul or
    one with a bias."""
    if getattr(matmul, "bias", None) is not None:
        return None
    if isinstance(matmul, SkinnyMatmul):
        if matmul.panels is None or matmul.weight.dtype != torch.float32:
            return None
        N, K = matmul.weight.shape
        return _Weight(None, None, None, matmul.weight.data_ptr(), matmul.panels.data_ptr(), N,
                       K, matmul.skinny_rows, min(matmul.c_rows, 2 ** 31 - 1))
    w = getattr(getattr(matmul, "f", None), "weight", None)
    if not isinstance(w, dict) or "codes" not in w:
        return None
    N, K = w["shape"]
    return _Weight(w["codes"].data_ptr(), w["d"].data_ptr(), w["m"].data_ptr(), None, None, N, K,
                   0, 0)


class DecodeStack:
    """The decode step of ``weights`` (:class:`~llminfra.runner.fused.FusedWeights`) over
    ``pools`` (:func:`~llminfra.runner.fast_step.layer_pools`) in one C call: call it with the
    step's tokens, positions, slots ``(n,)`` and block tables ``(n, W)`` (int64 CPU tensors) for
    the logits ``(n, V)``. Build it with :func:`builder`; it holds the pointers of both, so
    they must outlive it (the runner keeps all three)."""

    def __init__(self, fn, weights, pools, layers, output: _Weight, pool, passes: int):
        c = weights.config
        K = pools[0][2]
        self.fn, self.layers, self.output, self.owner = fn, layers, output, pool
        self._alive = (weights, pools)
        self.vocab, self.dim = output.N, c.dim
        #: the most sequences a step may have: what every fp32 product sends to its C kernels
        #: (the runner takes the Python step past it)
        every = [w for L in layers for w in (L.qkv, L.wo, L.w13, L.w2)] + [output]
        self.max_batch = min((w.panel_rows for w in every if not w.codes), default=2 ** 31 - 1)
        H, H_kv, d = c.n_heads, c.n_kv_heads, c.head_dim
        self.width = (H + 2 * H_kv) * d + H * d + 2 * c.ffn_dim + c.dim   # work floats a row
        self.model = _Model(c.n_layers, c.dim, H, H_kv, d, c.ffn_dim, passes, pool.threads,
                            K.shape[1], 0, K.shape[0], c.norm_eps, d ** -0.5,
                            len(weights.rotation_pairs), K.shape[0] * K.shape[1],
                            weights.rotation_pairs.data_ptr(), weights.embedding.data_ptr(),
                            weights.norm.data_ptr(), pool.handle)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 block_tables: torch.Tensor,
                 logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(n, V)``, or of ``logits_rows`` (int64) only: a row is a query with its own
        row of ``block_tables`` (a prompt chunk's rows too, as ``decode_step`` takes them)."""
        n, W = block_tables.shape
        work = torch.empty(n * (self.dim + self.width))
        rows = None if logits_rows is None else logits_rows.to(torch.int64).contiguous()
        logits = torch.empty(n if rows is None else len(rows), self.vocab)
        rc = self.fn(ctypes.byref(self.model), self.layers, ctypes.byref(self.output),
                     tokens.data_ptr(), self.vocab, positions.data_ptr(), slots.data_ptr(),
                     block_tables.data_ptr(), n, W,
                     None if rows is None or not len(rows) else rows.data_ptr(),
                     -1 if rows is None else len(rows), work.data_ptr(),
                     work.data_ptr() + 4 * n * self.dim, logits.data_ptr())
        if rc:
            raise ValueError(f"w4a8_decode_stack refused its input: {ERRORS.get(rc, rc)}")
        return logits


def _fits(weights, pools) -> bool:
    """fp32 CPU weights and pools, contiguous where C reads them."""
    tensors = [weights.embedding, weights.norm, weights.rotation_pairs]
    tensors += [t for L in weights.layers for t in (L.attn_norm, L.ffn_norm)]
    tensors += [t for p in pools for t in p[2:]]
    return weights.device.type == "cpu" and all(
        t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu"
        for t in tensors) and weights.config.dim % 64 == 0


def _shapes_fit(c, layers, output: _Weight) -> bool:
    """Whether the products have the shapes the step passes between them."""
    H, H_kv, d = c.n_heads, c.n_kv_heads, c.head_dim
    want = {"qkv": ((H + 2 * H_kv) * d, c.dim), "wo": (c.dim, H * d),
            "w13": (2 * c.ffn_dim, c.dim), "w2": (c.dim, c.ffn_dim)}
    return output.K == c.dim and all((getattr(L, k).N, getattr(L, k).K) == v
                                     for L in layers for k, v in want.items())


def builder(lib: ctypes.CDLL, pool, passes: int):
    """``build(weights, pools) -> DecodeStack | None``: the stack of fused weights whose every
    product is one of ``lib``'s kernels (w4a8 with ``passes``, or fp32 ``SkinnyMatmul``) on
    ``pool`` (a :class:`~llminfra.kernels.w4a8.ThreadPool`) without biases, on fp32 CPU pools;
    None for any other (the runner then runs the Python step)."""
    fn = c_function(lib)

    def build(weights, pools) -> DecodeStack | None:
        if len(pools) != len(weights.layers) or not pools or not _fits(weights, pools):
            return None
        layers = (_Layer * len(pools))()
        for L, p, out in zip(weights.layers, pools, layers):
            parts = [_weight(m) for m in (L.wqkv, L.wo, L.w13, L.w2)]
            if any(part is None for part in parts):
                return None
            out.attn_norm, out.ffn_norm = L.attn_norm.data_ptr(), L.ffn_norm.data_ptr()
            out.qkv, out.wo, out.w13, out.w2 = parts
            out.k, out.v = p[2].data_ptr(), p[3].data_ptr()
        output = _weight(weights.output)
        if output is None or not _shapes_fit(weights.config, layers, output):
            return None
        return DecodeStack(fn, weights, pools, layers, output, pool, passes)
    return build
