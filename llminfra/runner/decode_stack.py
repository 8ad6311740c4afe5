"""A decode step in one C call: ``csrc/decode_stack.c``, for int4 (w4a8) and fp32 weights on
the package's C kernels.

The fast runner's decode step (:func:`llminfra.runner.fast_step.decode_step`) on the C kernels
makes six ctypes calls a layer — the q/k/v product with its RMSNorm, RoPE and the K/V write,
paged attention, the output product, the gate/up product, the down product — and a residual
add after two of them: some 240 Python calls a step of SmolLM2-135M, each paying the host's
cost of a call. ``w4a8_decode_stack`` makes the same calls from C, in the same order, on the
same inputs, with the same float adds, so the logits are the same bits as the Python step's
(``tests/test_decode_stack.py``); the Python step stays the readable account of it. The
recorded serving runs on the C kernels (``llminfra/data/compare_engines_cpu.json``) decode with
it; chapter 12 measures what it buys, one call a step against six a layer, on the machine
running it.

:func:`builder` is what the runner's kernel sets (:mod:`llminfra.runner.kernel_set`) hand the
fast runner as their ``step``: ``build(weights, pools)`` returns a :class:`DecodeStack` for
fused weights whose every matrix is a product of those kernels without bias (w4a8, or fp32
``SkinnyMatmul``), on fp32 CPU pools — else None, and the runner keeps the Python step. The C
structures it fills and the function's types are :mod:`llminfra.kernels.abi`'s. Chapter 12.
"""

from __future__ import annotations

import ctypes

import torch

from llminfra.kernels.abi import Library, StackLayer, StackModel, StackWeight, refusal
from llminfra.kernels.library import INT32, check_cpu, check_range
from llminfra.kernels.w4a8 import W4A8Weight
from llminfra.runner.matmul import BaseMatmul, FunctionMatmul, SkinnyMatmul


def _weight(matmul) -> StackWeight | None:
    """The C view of a product: w4a8 (a ``FunctionMatmul`` of a
    :class:`~llminfra.kernels.w4a8.W4A8Weight`) or fp32 on the C kernels (a ``SkinnyMatmul``
    with its panels); None for any other matmul or one with a bias."""
    if not isinstance(matmul, BaseMatmul) or matmul.bias is not None:
        return None
    if isinstance(matmul, SkinnyMatmul):
        if matmul.panels is None or matmul.weight.dtype != torch.float32:
            return None
        N, K = matmul.weight.shape
        return StackWeight(None, None, None, matmul.weight.data_ptr(), matmul.panels.data_ptr(),
                           N, K, matmul.skinny_rows, min(matmul.c_rows, 2 ** 31 - 1))
    if not isinstance(matmul, FunctionMatmul) or not isinstance(matmul.f, W4A8Weight):
        return None
    w = matmul.f.weight
    N, K = w["shape"]
    return StackWeight(w["codes"].data_ptr(), w["d"].data_ptr(), w["m"].data_ptr(), None,
                       None, N, K, 0, 0)


class DecodeStack:
    """The decode step of ``weights`` (:class:`~llminfra.runner.fused.FusedWeights`) over
    ``pools`` (:func:`~llminfra.runner.fast_step.layer_pools`) in one C call: call it with the
    step's tokens, positions, slots ``(n,)`` and block tables ``(n, W)`` (int64 CPU tensors) for
    the logits ``(n, V)``. Build it with :func:`builder`; it holds the pointers of both, so
    they must outlive it (the runner keeps all three)."""

    def __init__(self, fn, weights, pools, layers, output: StackWeight, pool, passes: int):
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
        self.model = StackModel(c.n_layers, c.dim, H, H_kv, d, c.ffn_dim, passes, pool.threads,
                            K.shape[1], 0, K.shape[0], c.norm_eps, d ** -0.5,
                            len(weights.rotation_pairs), K.shape[0] * K.shape[1],
                            weights.rotation_pairs.data_ptr(), weights.embedding.data_ptr(),
                            weights.norm.data_ptr(), None)    # the pool: set at each call

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 block_tables: torch.Tensor,
                 logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(n, V)``, or of ``logits_rows`` (int64) only: a row is a query with its own
        row of ``block_tables`` (a prompt chunk's rows too, as ``decode_step`` takes them).
        ``ValueError`` naming an input that is not an int64 CPU tensor of its shape (C reads
        them raw; the values C checks itself), ``RuntimeError`` once the pool is closed."""
        for name, t in (("tokens", tokens), ("positions", positions), ("slots", slots),
                        ("block_tables", block_tables)):
            check_cpu(name, t, torch.int64, contiguous=True)
        if logits_rows is not None:
            check_cpu("logits_rows", logits_rows)
        if block_tables.dim() != 2 or not (
                tokens.shape == positions.shape == slots.shape == block_tables.shape[:1]):
            raise ValueError(f"need tokens, positions, slots (n,) and block_tables (n, W), got "
                             f"{tuple(tokens.shape)}, {tuple(positions.shape)}, "
                             f"{tuple(slots.shape)}, {tuple(block_tables.shape)}")
        n, W = block_tables.shape
        check_range("the step's sequences", n, 0, INT32[1])
        check_range("the block tables' width", W, 0, INT32[1])
        self.model.pool = self.owner.handle   # the pool's own, at each call: closed, it raises
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
            raise ValueError(refusal("w4a8_decode_stack", rc))
        return logits


def _fits(weights, pools) -> bool:
    """fp32 CPU weights and pools, contiguous where C reads them."""
    tensors = [weights.embedding, weights.norm, weights.rotation_pairs]
    tensors += [t for L in weights.layers for t in (L.attn_norm, L.ffn_norm)]
    tensors += [t for p in pools for t in p[2:]]
    return weights.device.type == "cpu" and all(
        t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu"
        for t in tensors) and weights.config.dim % 64 == 0


def _shapes_fit(c, layers, output: StackWeight) -> bool:
    """Whether the products have the shapes the step passes between them."""
    H, H_kv, d = c.n_heads, c.n_kv_heads, c.head_dim
    want = (((H + 2 * H_kv) * d, c.dim), (c.dim, H * d), (2 * c.ffn_dim, c.dim),
            (c.dim, c.ffn_dim))                                    # qkv, wo, w13, w2
    return output.K == c.dim and all(
        [(w.N, w.K) for w in (L.qkv, L.wo, L.w13, L.w2)] == list(want) for L in layers)


def builder(lib: Library, pool, passes: int):
    """``build(weights, pools) -> DecodeStack | None``: the stack of fused weights whose every
    product is one of ``lib``'s kernels (w4a8 with ``passes``, or fp32 ``SkinnyMatmul``) on
    ``pool`` (a :class:`~llminfra.kernels.w4a8.ThreadPool`) without biases, on fp32 CPU pools;
    None for any other (the runner then runs the Python step)."""
    fn = lib.w4a8_decode_stack

    def build(weights, pools) -> DecodeStack | None:
        if len(pools) != len(weights.layers) or not pools or not _fits(weights, pools):
            return None
        layers = (StackLayer * len(pools))()
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
