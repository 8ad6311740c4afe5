"""One serving step of the fused model over a paged K/V pool, in few torch calls.

The engine's fast model runner (:mod:`llminfra.engine.model_runner`) calls these two functions
on :class:`~llminfra.model.fused.FusedWeights`; every input is a device tensor the runner
built for the step, and no Python list reaches a layer:

* :func:`decode_step` — every sequence brings one token (the common step). Inputs of fixed
  shape for a batch size, so a CUDA graph captured once replays it: tokens, positions and slots
  ``(n,)``, block tables ``(n, W)``. A padding lane (a graph bucket larger than the batch) is
  token 0 at position 0 whose slot and blocks are the cache's scratch block.
* :func:`mixed_step` — some sequences bring several tokens (a prompt chunk, or drafts to
  verify): the decode lanes first, as above, then the others padded to the longest
  (``T``) in one attention call — no Python loop over sequences.

One layer, in torch calls (25 on a decode step; the test counts them)::

    h = rms_norm(x)                          1      qkv = wqkv(h)                  1
    r = rotate(qkv) (q, k by e^{imθ}; v by 1) 5     write K, V of the step          3
    q = r[:, :H]                             1      attention (gather, SDPA)       7
    x = wo.add(attn, x)                      1      h = rms_norm(x)                1
    gate, up = w13(h).chunk(2)               2      x = w2.add(silu(gate)·up, x)   3

The pool of layer l is ``cache.layer_blocks(l)`` ``(2·(num_blocks + 1), B, H_kv, d)``: K block
b at row b, V block b at row ``num_blocks + 1 + b``. A token's K and V go to slot s (row s of
the K half, ``(num_blocks + 1)·B + s`` of the V half) with one ``index_copy_``; attention
gathers K and V of the sequences' blocks with one ``index_select`` and masks by position
(query at position p sees keys 0 .. p), so padded keys and padding lanes change nothing.

A decode step's attention can skip that copy: a kernel walks each sequence's block table and
reads its keys where they lie, up to its length — the Triton kernel on CUDA
(:mod:`llminfra.attention.paged_triton`), and on the CPU the C kernel
``llminfra/quant/paged_decode.c`` (built into the w4a8 library, one ctypes call a layer, on the
library's thread pool). At 16 sequences of SmolLM2-135M the gather and the padded SDPA were a
third of the CPU step. Chapter 05.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llminfra.model.fused import FusedWeights


@dataclass
class PrefillInputs:
    """The multi-token sequences of a mixed step, padded to ``T`` queries each.

    ``pad_rows`` ``(n_p·T,)``: the row of each padded query among the multi-token
    sequences' queries ``(N_p, …)`` (pads repeat a valid row); ``pad_positions`` ``(n_p·T,)``: each padded query's position (0 for a pad: it sees
    key 0 only); ``unpad_rows`` ``(N_p,)``: where each real query sits in the padded
    ``(n_p·T)``; ``block_tables`` ``(n_p, W)``."""

    T: int
    pad_rows: torch.Tensor
    pad_positions: torch.Tensor
    unpad_rows: torch.Tensor
    block_tables: torch.Tensor


#: one layer's pool, views of the same memory: ``(2·(num_blocks+1)·B, H_kv, d)`` token rows
#: (written), ``(2·(num_blocks+1), B, H_kv, d)`` blocks (gathered), and its K and V halves
#: ``(num_blocks+1, B, H_kv, d)`` (read in place by the decode kernels: Triton, C)
Pool = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def layer_pools(cache) -> list[Pool]:
    """The views of every layer's pool of a :class:`~llminfra.kvcache.PagedKVCache`."""
    pools = []
    for layer in range(cache.n_layers):
        blocks = cache.layer_blocks(layer)
        half = blocks.shape[0] // 2
        pools.append((blocks.flatten(0, 1), blocks, blocks[:half], blocks[half:]))
    return pools


#: what ``paged_decode_f32`` (llminfra/quant/paged_decode.c) returns for input it refuses
C_KERNEL_ERRORS = {-2: "a size or thread count out of range",
                   -3: "a context length outside 1 .. W·B (the block table's keys)",
                   -4: "a block id of a table outside the pool",
                   -5: "no memory for a thread's state"}


@functools.cache
def _c_decode(threads: int):
    """``(fn, pool)``: the C paged decode kernel (``llminfra/quant/paged_decode.c``, built into
    the w4a8 library) with its ctypes argument types, and a w4a8 ``ThreadPool`` of ``threads``
    (``ValueError`` outside 1 .. 64); None where the library does not build (no C compiler)."""
    try:
        from llminfra.quant import w4a8
        lib = w4a8.library()
    except (ImportError, RuntimeError, OSError):
        return None
    fn = c_function(lib)
    return None if fn is None else (fn, w4a8.ThreadPool(threads, lib))


def c_function(lib: ctypes.CDLL):
    """``paged_decode_f32`` of a build of the w4a8 library with its argument types (None where
    the build lacks it)."""
    fn = getattr(lib, "paged_decode_f32", None)
    if fn is None:                 # pragma: no cover - a library built without paged_decode.c
        return None
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, ctypes.c_long, p, p, p, p, p, i, i, i, i, i, i, i, ctypes.c_float, i, p]
    fn.restype = i
    return fn


def _torch_threads() -> int:
    """torch's thread count, at most 64: the rule of :func:`llminfra.quant.w4a8.default_threads`
    (kept here: the step reads it without importing the quant package)."""
    return min(torch.get_num_threads(), 64)


def _c_attend(kernel, block_tables: torch.Tensor, lens: torch.Tensor, K: torch.Tensor,
              heads: tuple[int, int, int], q_row: int):
    """``attend(q, pool)`` on the C kernel ``kernel`` (:func:`_c_decode`): each sequence's
    blocks read in place up to its length (``lens`` ``(n,)``), one ctypes call a layer, into
    one ``(n, H·d)`` buffer. ``K`` a K pool (its shape), ``heads`` ``(H, H_kv, d)``; q
    ``(n, H, d)`` with unit strides in a row of heads, its rows ``q_row`` floats apart."""
    fn, pool = kernel
    n, W = block_tables.shape
    P, B = K.shape[:2]
    H, H_kv, d = heads
    tables = block_tables.to(torch.int32).contiguous()
    lens = lens.to(torch.int32).contiguous()
    out = torch.empty(n, H * d, dtype=torch.float32)      # every layer's: wo.add reads it first
    rest = (tables.data_ptr(), lens.data_ptr(), out.data_ptr(), n, H, H_kv, d, B, W, P,
            d ** -0.5, pool.threads, pool.handle)

    def attend(q, p, _alive=(tables, lens)):     # the closure holds what rest points into
        rc = fn(q.data_ptr(), q_row, p[2].data_ptr(), p[3].data_ptr(), *rest)
        if rc:
            raise ValueError(f"paged_decode_f32 refused its input: {C_KERNEL_ERRORS.get(rc, rc)}")
        return out
    return attend


def paged_attention_c(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, context_lens: torch.Tensor,
                      threads: int | None = None) -> torch.Tensor:
    """Decode attention through block tables on the C kernel, checked: the contract of
    :func:`llminfra.attention.paged_triton.paged_attention_triton` on CPU fp32 tensors. q
    ``(N, H, d)``; K and V pools ``(num_blocks, B, H_kv, d)``; ``block_tables`` ``(N, W)``;
    ``context_lens`` ``(N,)`` in 1 .. W·B; ``threads`` 1 .. 64 (None: torch's thread count).
    Returns ``(N, H, d)``. ``ValueError`` for what the kernel cannot read, ``RuntimeError``
    where the w4a8 library does not build."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= 64):
        raise ValueError(f"threads must be an int in 1..64 (None: torch's), got {threads!r}")
    kernel = _c_decode(_torch_threads() if threads is None else threads)
    if kernel is None:
        raise RuntimeError("the C paged decode kernel needs the w4a8 library, which does not "
                           "build here (llminfra.quant.w4a8.unavailable_reason())")
    tensors = (q, k_cache, v_cache, block_tables, context_lens)
    if any(not isinstance(t, torch.Tensor) or t.device.type != "cpu" for t in tensors) or \
            any(t.dtype != torch.float32 for t in tensors[:3]) or \
            any(t.is_floating_point() for t in tensors[3:]):
        raise ValueError("q, k_cache and v_cache must be fp32 CPU tensors, block_tables and "
                         "context_lens integer CPU tensors")
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape or \
            k_cache.shape[3] != q.shape[2] or q.shape[1] % k_cache.shape[2] or \
            block_tables.dim() != 2 or block_tables.shape[0] != q.shape[0] or \
            context_lens.shape != (q.shape[0],):
        raise ValueError(f"need q (N, H, d), pools (num_blocks, B, H_kv, d) with H a multiple "
                         f"of H_kv, block_tables (N, W), context_lens (N,); got q "
                         f"{tuple(q.shape)}, pools {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)}, {tuple(block_tables.shape)}, "
                         f"{tuple(context_lens.shape)}")
    (N, H, d), H_kv = q.shape, k_cache.shape[2]
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    attend = _c_attend(kernel, block_tables, context_lens, k_cache, (H, H_kv, d), H * d)
    return attend(q, (None, None, k_cache, v_cache)).view(N, H, d)


def _triton_decode():
    """The Triton paged decode launcher where triton imports (else None)."""
    try:
        from llminfra.attention.paged_triton import paged_decode_launch, triton
    except ImportError:          # pragma: no cover - an attention module that fails to import
        return None
    return paged_decode_launch if triton is not None else None


def _layer(w: FusedWeights, i: int, x: torch.Tensor, rot: torch.Tensor, pool: Pool,
           write_rows: torch.Tensor, N: int, attend) -> torch.Tensor:
    """Block i on the step's ``x`` ``(N, dim)``; ``attend(q, blocks) -> (N, H·d)``."""
    c, layer = w.config, w.layers[i]
    H, H_kv, d = c.n_heads, c.n_kv_heads, c.head_dim
    h = F.rms_norm(x, (c.dim,), layer.attn_norm, c.norm_eps)
    r = w.rotate(layer.wqkv(h), rot, N)                            # (N, H + 2·H_kv, d)
    pool[0].index_copy_(0, write_rows, r[:, H:].reshape(2 * N, H_kv, d))  # K, V of each token
    x = layer.wo.add(attend(r[:, :H], pool), x)
    h = F.rms_norm(x, (c.dim,), layer.ffn_norm, c.norm_eps)
    gate, up = layer.w13(h).chunk(2, dim=-1)
    return layer.w2.add(F.silu(gate) * up, x)


def write_rows(slots: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    """``(2N,)``: the pool rows of each token's K then V (the layout of
    ``r[:, H:].reshape(2N, H_kv, d)``), for a layer view ``(2·(num_blocks+1)·B, H_kv, d)``."""
    return torch.stack((slots, slots + (num_blocks + 1) * block_size), dim=1).flatten()


def kv_rows(block_tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """``(2·n·W,)``: the pool rows of the K blocks, then of the V blocks, of ``block_tables``
    ``(n, W)`` (once per step, for every layer's gather)."""
    blocks = block_tables.flatten()
    return torch.cat((blocks, blocks + (num_blocks + 1)))


def _gather(pool: torch.Tensor, rows: torch.Tensor, n: int, c):
    """K and V ``(n, H_kv, W·B, d)`` of the blocks at pool ``rows`` (:func:`kv_rows`)."""
    kv = pool.index_select(0, rows).view(2, n, -1, c.n_kv_heads, c.head_dim).transpose(2, 3)
    return kv.unbind(0)


def decode_attention(q: torch.Tensor, pool: Pool, rows: torch.Tensor,
                     mask: torch.Tensor, n: int, c) -> torch.Tensor:
    """One query per sequence: q ``(n, H, d)``, ``rows`` ``(2·n·W,)`` (:func:`kv_rows`),
    ``mask`` ``(n, 1, 1, W·B)``, ``c`` the model's config -> ``(n, H·d)``. The G = H / H_kv
    query heads of a group ride as G query rows of their K/V head (no repeated K/V)."""
    K, V = _gather(pool[1], rows, n, c)                          # (n, H_kv, S, d)
    out = F.scaled_dot_product_attention(q.view(n, c.n_kv_heads, -1, c.head_dim), K, V,
                                         attn_mask=mask)
    return out.reshape(n, c.n_heads * c.head_dim)


def _page_pool(pools: list[Pool]) -> tuple[int, int]:
    blocks = pools[0][1]
    return blocks.shape[0] // 2 - 1, blocks.shape[1]         # num_blocks, block size


def decode_step(w: FusedWeights, pools: list[Pool], tokens: torch.Tensor,
                positions: torch.Tensor, slots: torch.Tensor,
                block_tables: torch.Tensor, triton_kernel: bool | None = None,
                c_kernel: bool | None = None) -> torch.Tensor:
    """Logits ``(n, V)`` of one token per sequence (see the module docstring); each token's
    K/V is written to its slot first. ``pools``: :func:`layer_pools` of the cache. Attention
    is the gather + SDPA above, or a kernel that reads each sequence's blocks in place up to
    its length (1 call a layer): on CUDA (``triton_kernel=None``: where the weights are on
    CUDA; True forces it, as the tests do under ``TRITON_INTERPRET=1``) the Triton paged
    kernel; on the CPU (``c_kernel=None``: where the w4a8 library builds and the pool is fp32;
    False: gather + SDPA; True: it or ``RuntimeError``) the C kernel
    ``llminfra/quant/paged_decode.c``."""
    num_blocks, B = _page_pool(pools)
    n, W, c = len(tokens), block_tables.size(1), w.config
    rot = w.head_rotation(positions)
    rows = write_rows(slots, num_blocks, B)
    x = F.embedding(tokens, w.embedding)                      # (n, dim)
    on_cuda = w.device.type == "cuda" if triton_kernel is None else triton_kernel
    kernel = _triton_decode() if on_cuda and not B & (B - 1) else None
    fp32 = w.dtype == pools[0][2].dtype == torch.float32
    cpu = None if on_cuda or c_kernel is False or not fp32 else _c_decode(_torch_threads())
    if c_kernel and cpu is None:
        raise RuntimeError("c_kernel=True: the C paged decode kernel needs fp32 weights and "
                           "pool on the CPU and the w4a8 library (llminfra.quant.w4a8.available)")
    if kernel is not None:   # CUDA: read each sequence's blocks in place, up to its length
        tables, lens = block_tables.to(torch.int32), (positions + 1).to(torch.int32)

        def attend(q, p):
            return kernel(q, p[2], p[3], tables, lens).view(n, c.n_heads * c.head_dim)
    elif cpu is not None:    # CPU: the same in C
        H, H_kv, d = c.n_heads, c.n_kv_heads, c.head_dim    # q: r[:, :H] of (n, H + 2·H_kv, d)
        attend = _c_attend(cpu, block_tables, positions + 1, pools[0][2], (H, H_kv, d),
                           (H + 2 * H_kv) * d)
    else:
        blocks = kv_rows(block_tables, num_blocks)
        keys = torch.arange(W * B, device=w.device)
        mask = (keys <= positions[:, None]).view(n, 1, 1, -1)  # query at p sees keys 0 .. p

        def attend(q, p):
            return decode_attention(q, p, blocks, mask, n, c)
    for i, pool in enumerate(pools):
        x = _layer(w, i, x, rot, pool, rows, n, attend)
    return w.output(F.rms_norm(x, (c.dim,), w.norm, c.norm_eps))


def _prefill_attention(q: torch.Tensor, pool: torch.Tensor, pre: PrefillInputs,
                       mask: torch.Tensor, rows: torch.Tensor, c) -> torch.Tensor:
    """The multi-token sequences' queries ``(N_p, H, d)`` -> ``(N_p, H·d)``, one SDPA call."""
    n, T = pre.block_tables.shape[0], pre.T
    H, d = c.n_heads, c.head_dim
    K, V = _gather(pool[1], rows, n, c)                               # (n, H_kv, S, d)
    qp = q.index_select(0, pre.pad_rows).view(n, T, H, d).transpose(1, 2)   # (n, H, T, d)
    out = F.scaled_dot_product_attention(qp, K, V, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).reshape(n * T, H * d).index_select(0, pre.unpad_rows)


def mixed_step(w: FusedWeights, pools: list[Pool], tokens: torch.Tensor,
               positions: torch.Tensor, slots: torch.Tensor, num_decodes: int,
               decode_tables: torch.Tensor | None, pre: PrefillInputs,
               logits_rows: torch.Tensor) -> torch.Tensor:
    """Logits of ``logits_rows`` for a step whose first ``num_decodes`` flat tokens are one-token
    sequences (``decode_tables`` ``(num_decodes, W)``) and the rest multi-token sequences
    (``pre``). Queries see their own sequence's keys up to their position."""
    num_blocks, B = _page_pool(pools)
    nd, N = num_decodes, len(tokens)
    rot = w.head_rotation(positions)
    rows = write_rows(slots, num_blocks, B)
    Sp = pre.block_tables.shape[1] * B
    keys = torch.arange(max(Sp, 1 if decode_tables is None else decode_tables.shape[1] * B),
                        device=tokens.device)
    pre_mask = (keys[:Sp] <= pre.pad_positions[:, None]).view(-1, 1, pre.T, Sp)
    pre_rows = kv_rows(pre.block_tables, num_blocks)
    c = w.config
    if nd:
        Sd = decode_tables.shape[1] * B
        dec_rows = kv_rows(decode_tables, num_blocks)
        dec_mask = (keys[:Sd] <= positions[:nd, None]).view(nd, 1, 1, Sd)

    def attend(q, pool):
        out = _prefill_attention(q[nd:], pool, pre, pre_mask, pre_rows, c)
        if not nd:
            return out
        return torch.cat((decode_attention(q[:nd], pool, dec_rows, dec_mask, nd, c), out))

    x = F.embedding(tokens, w.embedding)
    for i, pool in enumerate(pools):
        x = _layer(w, i, x, rot, pool, rows, N, attend)
    return w.output(F.rms_norm(x[logits_rows], (c.dim,), w.norm, c.norm_eps))
