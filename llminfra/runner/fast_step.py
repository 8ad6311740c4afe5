"""One serving step of the fused model over a paged K/V pool, in few torch calls.

The engine's fast runner (:mod:`llminfra.runner.fast_runner`) calls these two functions
on :class:`~llminfra.runner.fused.FusedWeights`; every input is a device tensor the runner
built for the step, and no Python list reaches a layer:

* :func:`decode_step` — every sequence brings one token (the common step). Inputs of fixed
  shape for a batch size, so a CUDA graph captured once replays it: tokens, positions and slots
  ``(n,)``, block tables ``(n, W)``. A padding lane (a graph bucket larger than the batch) is
  token 0 at position 0 whose slot and blocks are the cache's scratch block.
* :func:`mixed_step` — some sequences bring several tokens (a prompt chunk, or drafts to
  verify): the decode lanes first, as above, then the others padded to the longest
  (``T``) in one attention call — no Python loop over sequences.

Both run the one fast layer (:func:`llminfra.runner.fast_layer.layer`) over each layer's pool,
with this module's ``place`` (RoPE and the K/V write) and ``attend``. One layer, in torch calls
(25 on a decode step; the test counts them; a counted call is not a kernel launch — the
counter, :func:`llminfra.bench.roofline.count_torch_calls`, counts attribute reads, views,
slices and chunks too, which launch nothing)::

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
``llminfra/kernels/csrc/paged_decode.c`` (one ctypes call a layer, on the library's thread
pool), which the kernel set brings (:attr:`KernelSet.attention
<llminfra.runner.kernel_set.KernelSet>`, :mod:`llminfra.kernels.paged_decode`; ``serve`` on a
real model). With the C kernel the rotation and the K/V write are one C call as well
(``rope_write_f32``, :func:`c_place`) where the torch path makes ten. Where every matmul also
forms RMSNorm and SwiGLU in its own call (``w.fused_kernels``: the C kernels), the layer's
norms and SwiGLU are theirs. Where the weights are on the C kernels (int4 on w4a8, fp32 on
``f32_skinny``) the runner goes one step further: the same calls, made from C, for the whole
step (:mod:`llminfra.runner.decode_stack`; ``w.decode_stack``, the same logits bit for bit),
this function remaining its readable account. Where a step's time goes, call by call, is the
recorded serving profile (``llminfra/data/profile_serving_cpu.json``, ``python -m llminfra
bench serving-profile``).

With the C attention a step with prompt chunks needs no padding: each query is a row of
:func:`decode_step` with its sequence's block table and its own position, and the logits are
taken of the rows that want them (``logits_rows``); it reads each key in place where
:func:`mixed_step` gathers and pads. :func:`mixed_step` stays the path of torch's attention
(CUDA, the tiny model, ``--matmul plain``/``onednn``). Chapters 12 and 05.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from llminfra.kernels.library import check_cpu
from llminfra.kernels.paged_decode import PagedDecodeKernel, c_attend
from llminfra.runner import fast_layer
from llminfra.runner.fused import FusedWeights


@dataclass
class PrefillInputs:
    """The multi-token sequences of a mixed step, padded to ``T`` queries each.

    ``pad_rows`` ``(n_p·T,)``: the row of each padded query among the multi-token
    sequences' queries ``(N_p, …)`` (pads repeat a valid row); ``pad_positions``
    ``(n_p·T,)``: each padded query's position (0 for a pad: it sees key 0 only);
    ``unpad_rows`` ``(N_p,)``: where each real query sits in the padded ``(n_p·T)``;
    ``block_tables`` ``(n_p, W)``."""

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


def _c_decode_attend(w: FusedWeights, pools: list[Pool], tables: torch.Tensor,
                     positions: torch.Tensor, kernel: PagedDecodeKernel | None):
    """``attend`` of one-token sequences (block ``tables`` ``(n, W)``, their ``positions``) on
    the C paged decode ``kernel`` where there is one and weights and pool are fp32 on the CPU;
    None elsewhere."""
    if not _c_kernel_fits(kernel, w, pools):
        return None
    c = w.config
    H, H_kv, d = c.n_heads, c.n_kv_heads, c.head_dim    # q: r[:, :H] of (n, H + 2·H_kv, d)
    return c_attend(kernel, tables, positions + 1, pools[0][2], (H, H_kv, d), (H + 2 * H_kv) * d)


def c_place(fn, w: FusedWeights, positions: torch.Tensor, slots: torch.Tensor, S: int):
    """``place(qkv, pool) -> q`` on the C function ``rope_write_f32`` (``fn``,
    :mod:`llminfra.kernels.paged_decode`): each row's q and k heads turned by RoPE in place and
    its k and v copied to its slot (``S`` slots in a pool), one ctypes call a layer where the
    torch path makes ten. q stays in ``qkv`` (what :func:`c_attend` reads, a row apart).
    ``ValueError`` naming positions or slots that are not int64 CPU vectors of one length, or
    (at each call) a ``qkv`` or pool C cannot read as fp32 rows."""
    c = w.config
    H, H_kv, d = c.n_heads, c.n_kv_heads, c.head_dim
    for name, t in (("positions", positions), ("slots", slots)):
        check_cpu(name, t, torch.int64, contiguous=True)
    if positions.dim() != 1 or positions.shape != slots.shape:
        raise ValueError(f"positions and slots must be (N,) each, got {tuple(positions.shape)} "
                         f"and {tuple(slots.shape)}")
    table = w.rotation_pairs
    rest = (positions.data_ptr(), table.data_ptr(), len(table), H, H_kv, d, slots.data_ptr(), S)
    N, row = len(positions), (H + 2 * H_kv) * d

    def place(qkv, p, _alive=(positions, slots)):
        if not qkv.dtype == p[2].dtype == p[3].dtype == torch.float32 or \
                qkv.stride(-1) != 1 or qkv.numel() < N * row or not qkv.is_cpu:
            raise ValueError(f"rope_write_f32 reads {N} float32 CPU rows of {row} in qkv and "
                             f"float32 pools, got qkv {qkv.dtype} {tuple(qkv.shape)} on "
                             f"{qkv.device}, pools {p[2].dtype}")
        rc = fn(qkv.data_ptr(), N, row, *rest, p[2].data_ptr(), p[3].data_ptr())
        if rc:
            raise ValueError(f"rope_write_f32 refused its input (code {rc}: a position outside "
                             f"the rotation table or a slot outside the pool)")
        return qkv
    return place


def _triton_decode():
    """The Triton paged decode launcher where triton imports (else None)."""
    try:
        from llminfra.attention.paged_triton import paged_decode_launch, triton
    except ImportError:          # pragma: no cover - an attention module that fails to import
        return None
    return paged_decode_launch if triton is not None else None


def torch_place(w: FusedWeights, rot: torch.Tensor, rows: torch.Tensor, N: int):
    """``place(qkv, pool) -> q`` in torch calls: the step's ``N`` rows turned by ``rot``
    (:meth:`~llminfra.runner.fused.FusedWeights.head_rotation`) and their K and V written to
    the pool ``rows`` (:func:`write_rows`) with one ``index_copy_``."""
    c = w.config
    H, H_kv, d = c.n_heads, c.n_kv_heads, c.head_dim

    def place(qkv, pool):
        r = w.rotate(qkv, rot, N)                                   # (N, H + 2·H_kv, d)
        pool[0].index_copy_(0, rows, r[:, H:].reshape(2 * N, H_kv, d))  # K, V of a token
        return r[:, :H]
    return place


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
                c_kernel: PagedDecodeKernel | Literal[False] | None = None,
                logits_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``(n, V)`` of one token per sequence (see the module docstring) — of the rows
    ``logits_rows`` only, where given; each token's K/V is written to its slot first. A row is
    a query that sees keys 0 .. its position through its own row of ``block_tables``, so the
    rows of a prompt chunk may come here too, one row each with its sequence's table
    (:func:`uses_c_rows`: the fast runner does so where the C kernels take the step).
    ``pools``: :func:`layer_pools` of the cache. Attention is the gather + SDPA above, or a
    kernel that reads each sequence's blocks in place up to its length (1 call a layer): on
    CUDA (``triton_kernel=None``: where the weights are on CUDA; True forces it, as the tests
    do under ``TRITON_INTERPRET=1``) the Triton paged kernel; on the CPU the C kernel
    ``llminfra/kernels/csrc/paged_decode.c`` — ``c_kernel=None``: the weights' own
    (``w.paged_decode``, their kernel set's ``attention``) where weights and pool are fp32;
    False: gather + SDPA; or a :class:`~llminfra.kernels.paged_decode.PagedDecodeKernel` to
    use (its ``rope_write``, where it has one, takes RoPE and the K/V write)."""
    num_blocks, B = _page_pool(pools)
    n, W, c = len(tokens), block_tables.size(1), w.config
    x = F.embedding(tokens, w.embedding)                      # (n, dim)
    on_cuda = w.device.type == "cuda" if triton_kernel is None else triton_kernel
    kernel = _triton_decode() if on_cuda and not B & (B - 1) else None
    c_kernel = (w.paged_decode if c_kernel is None else None if c_kernel is False
                else c_kernel)
    cpu = None if on_cuda else _c_decode_attend(w, pools, block_tables, positions, c_kernel)
    if cpu is not None and c_kernel.rope_write is not None:
        place = c_place(c_kernel.rope_write, w, positions, slots, (num_blocks + 1) * B)
    else:
        place = torch_place(w, w.head_rotation(positions), write_rows(slots, num_blocks, B), n)
    if kernel is not None:   # CUDA: read each sequence's blocks in place, up to its length
        tables, lens = block_tables.to(torch.int32), (positions + 1).to(torch.int32)

        def attend(q, p):
            return kernel(q, p[2], p[3], tables, lens).view(n, c.n_heads * c.head_dim)
    elif cpu is not None:    # CPU: the same in C
        attend = cpu
    else:
        blocks = kv_rows(block_tables, num_blocks)
        keys = torch.arange(W * B, device=w.device)
        mask = (keys <= positions[:, None]).view(n, 1, 1, -1)  # query at p sees keys 0 .. p

        def attend(q, p):
            return decode_attention(q, p, blocks, mask, n, c)
    for i, pool in enumerate(pools):
        x = fast_layer.layer(w, i, x, pool, place, attend)
    return fast_layer.logits(w, x if logits_rows is None else x[logits_rows])


def _c_kernel_fits(kernel: PagedDecodeKernel | None, w: FusedWeights,
                   pools: list[Pool]) -> bool:
    """A C paged decode kernel, on weights and pools that are fp32 on the CPU."""
    return (kernel is not None and w.device.type == "cpu" and
            w.dtype == pools[0][2].dtype == torch.float32)


def uses_c_rows(w: FusedWeights, pools: list[Pool]) -> bool:
    """Whether :func:`decode_step` runs its attention, RoPE and K/V write on the weights' C
    kernels (``w.paged_decode`` with ``rope_write``: fp32 weights and pools on the CPU): each
    row then reads its own keys in place, and a step with prompt chunks goes there too, a row
    a query, rather than to :func:`mixed_step`'s padded SDPA."""
    return (_c_kernel_fits(w.paged_decode, w, pools) and
            w.paged_decode.rope_write is not None)


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
    (``pre``). Queries see their own sequence's keys up to their position; the decode lanes'
    attention is the weights' C kernel where they bring one (as in :func:`decode_step`)."""
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
    # the decode lanes on the weights' C kernel where they bring one, as in decode_step
    dec_attend = (_c_decode_attend(w, pools, decode_tables, positions[:nd], w.paged_decode)
                  if nd else None)
    if nd and dec_attend is None:
        Sd = decode_tables.shape[1] * B
        dec_rows = kv_rows(decode_tables, num_blocks)
        dec_mask = (keys[:Sd] <= positions[:nd, None]).view(nd, 1, 1, Sd)

        def gathered(q, pool):
            return decode_attention(q, pool, dec_rows, dec_mask, nd, c)
        dec_attend = gathered

    def attend(q, pool):
        out = _prefill_attention(q[nd:], pool, pre, pre_mask, pre_rows, c)
        return torch.cat((dec_attend(q[:nd], pool), out)) if nd else out

    place = torch_place(w, rot, rows, N)
    x = F.embedding(tokens, w.embedding)
    for i, pool in enumerate(pools):
        x = fast_layer.layer(w, i, x, pool, place, attend)
    return fast_layer.logits(w, x[logits_rows])
