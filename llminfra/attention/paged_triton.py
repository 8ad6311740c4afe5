"""Paged decode attention as one Triton kernel: read K/V straight from the block pool.

The PyTorch version (:func:`llminfra.attention.paged.paged_attention`) first gathers
every sequence's K/V into a dense tensor — an extra write and read of all of it. This kernel
never forms that tensor: program ``(n, h)`` walks sequence n's block table, loads one block of
keys ``(B, d)`` at a time from wherever it lies in the pool, and keeps a running softmax (the
online softmax of Milakov & Gimelshein, 2018, arXiv:1805.02867, as used by FlashAttention, Dao
et al., 2022, arXiv:2205.14135, Alg. 1):

    m_new = max(m, max_j s_j),  l = l·e^(m - m_new) + Σ_j e^(s_j - m_new),
    acc = acc·e^(m - m_new) + Σ_j e^(s_j - m_new) v_j,   o = acc / l

This is the structure of vLLM's PagedAttention kernel (Kwon et al., 2023, arXiv:2309.06180,
§4.1, §5), without its warp-level tuning. It runs on CUDA tensors, and on CPU tensors when the
process set ``TRITON_INTERPRET=1`` before importing triton (that is how the tests run it); the
package itself never reads that variable. Block size must be a power of two.

Taught in chapter 04.
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional (the `gpu` extra)
    triton = None

if triton is not None:
    @triton.jit
    def _paged_block(j, q, m_i, l_i, acc, K, V, BT, n, ctx, scale, kv_h, s_kb, s_kt, s_kh,
                     s_btn, offs_t, offs_d, d_mask, BLOCK_SIZE: tl.constexpr):
        """One block of the online softmax: block j of sequence n's table."""
        block = tl.load(BT + n * s_btn + j)                      # physical block id
        t_mask = (j * BLOCK_SIZE + offs_t) < ctx
        off = block * s_kb + offs_t[:, None] * s_kt + kv_h * s_kh + offs_d[None, :]
        mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(K + off, mask=mask, other=0.0).to(tl.float32)   # (B, d)
        v = tl.load(V + off, mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale                   # (B,)
        s = tl.where(t_mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        return m_new, l_i, acc

    @triton.jit
    def _paged_decode_kernel(Q, K, V, O, BT, CTX, scale, group,
                             s_qn, s_qh, s_kb, s_kt, s_kh, s_btn, s_on, s_oh,
                             HEAD_DIM, BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
                             WHILE_LOOP: tl.constexpr):
        n = tl.program_id(0)
        h = tl.program_id(1)
        kv_h = h // group                                        # grouped-query attention
        offs_d = tl.arange(0, BLOCK_D)
        offs_t = tl.arange(0, BLOCK_SIZE)
        d_mask = offs_d < HEAD_DIM
        q = tl.load(Q + n * s_qn + h * s_qh + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        ctx = tl.load(CTX + n)
        m_i = tl.max(tl.full([BLOCK_SIZE], float("-inf"), tl.float32), axis=0)
        l_i = tl.sum(tl.zeros([BLOCK_SIZE], tl.float32), axis=0)
        acc = tl.zeros([BLOCK_D], tl.float32)
        n_blocks = tl.cdiv(ctx, BLOCK_SIZE)
        if WHILE_LOOP:   # the interpreter (Triton 3.6 cannot take a tensor bound in range)
            j = 0
            while j < n_blocks:
                m_i, l_i, acc = _paged_block(j, q, m_i, l_i, acc, K, V, BT, n, ctx, scale,
                                             kv_h, s_kb, s_kt, s_kh, s_btn, offs_t, offs_d,
                                             d_mask, BLOCK_SIZE)
                j += 1
        else:
            for j in range(0, n_blocks):
                m_i, l_i, acc = _paged_block(j, q, m_i, l_i, acc, K, V, BT, n, ctx, scale,
                                             kv_h, s_kb, s_kt, s_kh, s_btn, offs_t, offs_d,
                                             d_mask, BLOCK_SIZE)
        out = acc / l_i
        tl.store(O + n * s_on + h * s_oh + offs_d, out.to(O.dtype.element_ty), mask=d_mask)


def _interpreting() -> bool:
    """True when triton was imported under its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return triton is not None and type(_paged_decode_kernel).__name__ == "InterpretedFunction"


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """Decode attention through block tables in one Triton kernel; same contract and result as
    :func:`llminfra.attention.paged.paged_attention`.

    q ``(N, H, d)``; k_cache/v_cache ``(num_blocks, B, H_kv, d)`` contiguous, B a power of two;
    block_tables ``(N, max_blocks)``; context_lens ``(N,)`` all ≥ 1. Returns ``(N, H, d)``.
    """
    if triton is None:
        raise RuntimeError("paged_attention_triton needs triton (pip install 'llminfra[gpu]'); "
                           "use llminfra.attention.paged_attention on this machine")
    if not q.is_cuda and not _interpreting():
        raise ValueError(f"q is on {q.device}: the Triton kernel needs CUDA tensors, or "
                         "TRITON_INTERPRET=1 set before triton is imported; use "
                         "llminfra.attention.paged_attention for CPU tensors")
    N, H, d = q.shape
    num_blocks, B, H_kv, d_k = k_cache.shape
    if k_cache.shape != v_cache.shape or d_k != d or H % H_kv:
        raise ValueError(f"pool {tuple(k_cache.shape)}/{tuple(v_cache.shape)} does not fit q "
                         f"{tuple(q.shape)}: need equal d and H a multiple of H_kv")
    if B & (B - 1):
        raise ValueError(f"block_size {B} must be a power of two for the Triton kernel")
    if block_tables.shape[0] != N or context_lens.shape != (N,) or int(context_lens.min()) < 1 \
            or int(context_lens.max()) > block_tables.shape[1] * B:
        raise ValueError("need block_tables (N, max_blocks) and context_lens (N,) in "
                         f"1..max_blocks·B; got {tuple(block_tables.shape)}, "
                         f"{context_lens.tolist()}")
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    bt = block_tables.to(device=q.device, dtype=torch.int32).contiguous()
    ctx = context_lens.to(device=q.device, dtype=torch.int32).contiguous()
    return paged_decode_launch(q, k_cache, v_cache, bt, ctx, scale)


def paged_decode_launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, context_lens: torch.Tensor,
                        scale: float | None = None) -> torch.Tensor:
    """The kernel launch of :func:`paged_attention_triton` without its checks and copies: no
    host synchronisation, so a CUDA graph can capture it (the engine's fast runner calls it
    with inputs it built itself). q ``(N, H, d)`` with unit stride in d; K and V pools with the
    same strides, unit stride in d; ``block_tables`` ``(N, W)`` and ``context_lens`` ``(N,)``
    int32. Returns ``(N, H, d)``."""
    N, H, d = q.shape
    B, H_kv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty((N, H, d), dtype=q.dtype, device=q.device)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    _paged_decode_kernel[(N, H)](
        q, k_cache, v_cache, out, block_tables, context_lens, scale, H // H_kv,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        d, BLOCK_SIZE=B, BLOCK_D=triton.next_power_of_2(d), WHILE_LOOP=_interpreting())
    return out
