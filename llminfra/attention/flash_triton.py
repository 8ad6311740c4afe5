"""FlashAttention forward as a Triton kernel: one program per (query block, batch x head).

The tiling of Dao et al. 2022 (arXiv:2205.14135, Algorithm 1) with the loop order of
FlashAttention-2 (Dao 2023, arXiv:2307.08691, Algorithm 1): each program keeps one block of
BLOCK_M query rows in registers/SRAM and streams the keys and values past it BLOCK_N at a time,
keeping the running max ``m_i``, running sum ``l_i`` and the un-normalised accumulator, and
divides by ``l_i`` once at the end. Exponentials use base 2 (``exp(x) = 2^(x·log2 e)``).

Runs on CUDA GPUs; on CPU tensors it runs only under Triton's interpreter, which is switched on
by setting ``TRITON_INTERPRET=1`` in the environment before ``triton`` is first imported (the
package never reads or sets that variable). Without ``triton`` installed the package still
imports and :func:`flash_attention_triton` raises ``ImportError``. Taught in chapter 06.
"""

from __future__ import annotations

import math

import torch

from llminfra.attention.flash_tuning import tuned_tiles
from llminfra.attention.shapes import check_attention_call, check_block, check_qkv, default_scale

try:
    import triton
    import triton.language as tl
except ImportError:  # the package must import without triton
    triton = None

#: dtypes the kernel accepts (float32 dots are done in IEEE fp32, not TF32)
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2_E = 1.4426950408889634

if triton is not None:
    @triton.jit
    def _flash_block(start, q, m_i, l_i, acc, K, V, b, hk, skb, skh, skt, skd,
                     svb, svh, svt, svd, rows, cols0, dims, S, D, offset, qk_scale,
                     CAUSAL: tl.constexpr, PRECISION: tl.constexpr, DOT_FP32: tl.constexpr):
        """One key block of the online softmax (keys start .. start + BLOCK_N - 1)."""
        cols = start + cols0
        kT = tl.load(K + b * skb + hk * skh + cols[None, :] * skt + dims[:, None] * skd,
                     mask=(cols[None, :] < S) & (dims[:, None] < D), other=0.0)
        if DOT_FP32:
            kT = kT.to(tl.float32)
        s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        keep = cols[None, :] < S
        if CAUSAL:
            keep = keep & (cols[None, :] <= offset + rows[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key seen yet
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * svb + hk * svh + cols[:, None] * svt + dims[None, :] * svd,
                    mask=(cols[:, None] < S) & (dims[None, :] < D), other=0.0)
        if DOT_FP32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def _flash_fwd_kernel(Q, K, V, O, qk_scale,
                          sqb, sqh, sqt, sqd, skb, skh, skt, skd,
                          svb, svh, svt, svd, sob, soh, sot, sod,
                          H, G, T, S, D, offset,
                          CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                          DOT_FP32: tl.constexpr, WHILE_LOOP: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // G  # grouped-query attention: G query heads share key/value head hk
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols0 = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dims[None, :] * sqd,
                    mask=(rows[:, None] < T) & (dims[None, :] < D), other=0.0)
        if DOT_FP32:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        hi = S
        if CAUSAL:  # keys after the block's last query are never seen: stop there
            hi = tl.minimum(S, tl.maximum(offset + (pid_m + 1) * BLOCK_M, 0))
        if WHILE_LOOP:   # the interpreter (Triton 3.6 cannot take a tensor bound in range)
            start = 0
            while start < hi:
                m_i, l_i, acc = _flash_block(start, q, m_i, l_i, acc, K, V, b, hk, skb, skh,
                                             skt, skd, svb, svh, svt, svd, rows, cols0, dims,
                                             S, D, offset, qk_scale, CAUSAL, PRECISION,
                                             DOT_FP32)
                start += BLOCK_N
        else:            # compiled: a for loop, which Triton software-pipelines (num_stages)
            for start in range(0, hi, BLOCK_N):
                m_i, l_i, acc = _flash_block(start, q, m_i, l_i, acc, K, V, b, hk, skb, skh,
                                             skt, skd, svb, svh, svt, svd, rows, cols0, dims,
                                             S, D, offset, qk_scale, CAUSAL, PRECISION,
                                             DOT_FP32)
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a row that saw no key: zeros
        tl.store(O + b * sob + h * soh + rows[:, None] * sot + dims[None, :] * sod,
                 out.to(O.dtype.element_ty), mask=(rows[:, None] < T) & (dims[None, :] < D))


def _interpreting() -> bool:
    """True when triton was imported under its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return triton is not None and type(_flash_fwd_kernel).__name__ == "InterpretedFunction"


def _tile(q, k, v, causal: bool, softmax_scale, block_m, block_n, num_warps, num_stages):
    """``(block_m, block_n, num_warps, num_stages)`` for one call: on CUDA with no tile given,
    the autotuned one (:func:`~llminfra.attention.flash_tuning.tuned_tiles`); else what was
    given, 64 × 64 and 2 stages by default. ``num_warps`` may stay None (chosen by d)."""
    if block_m is None and block_n is None and q.is_cuda:
        tile = tuned_tiles(q, causal, lambda t: flash_attention_triton(
            q, k, v, causal, block_m=t[0], block_n=t[1], softmax_scale=softmax_scale,
            num_warps=t[2], num_stages=t[3]))
        block_m, block_n = tile[0], tile[1]
        num_warps, num_stages = num_warps or tile[2], num_stages or tile[3]
    block_m, block_n = block_m or 64, block_n or 64
    for name, bs in (("block_m", block_m), ("block_n", block_n)):
        if check_block(name, bs) < 16 or bs & (bs - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {bs}")
    return block_m, block_n, num_warps, num_stages or 2


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           causal: bool = False, *, block_m: int | None = None,
                           block_n: int | None = None, softmax_scale: float | None = None,
                           num_warps: int | None = None,
                           num_stages: int | None = None) -> torch.Tensor:
    """FlashAttention forward in Triton; same contract as :func:`flash_attention`.

    Dao et al. 2022 (arXiv:2205.14135, Algorithm 1) with FlashAttention-2's loop order (Dao 2023,
    arXiv:2307.08691): grid = (ceil(T / block_m), B·H); each program streams all key blocks
    past its query block. Shapes: q ``(B, H, T, d)``, k and v ``(B, H_kv, S, d)`` with
    ``H_kv | H``; returns ``(B, H, T, d)`` in q's dtype (accumulation in float32). Any T, S and d
    (d is padded to a power of two ≥ 16 inside the kernel). ``block_m`` and ``block_n`` must be
    powers of two ≥ 16; left None on CUDA, the tile (with ``num_warps`` and ``num_stages``) is
    autotuned once per device, d, causal and dtype (:mod:`.flash_tuning`); on the CPU 64 × 64.

    ``causal``: the T queries are the LAST T of the S positions (decoding with a KV cache), query
    i sees keys ``j <= S - T + i``; key blocks past a query block's last query are not loaded.
    A query that sees no key (T > S) gets zeros. ``causal`` must be a bool. Forward only: inputs
    that require grad, with autograd recording, are refused with a ``ValueError``.

    CUDA tensors run compiled; CPU tensors need ``TRITON_INTERPRET=1`` set before triton was
    imported (else Triton refuses the CPU pointers and a ``RuntimeError`` says so).
    """
    if triton is None:
        raise ImportError("flash_attention_triton needs the `triton` package "
                          "(pip install 'llminfra[gpu]'); use flash_attention on CPU")
    B, H, H_kv, T, S, d = check_qkv(q, k, v, dtypes=TRITON_DTYPES)
    causal = check_attention_call("flash_attention_triton", causal, q, k, v)
    block_m, block_n, num_warps, num_stages = _tile(q, k, v, causal, softmax_scale, block_m,
                                                    block_n, num_warps, num_stages)
    o = torch.empty_like(q)
    qk_scale = default_scale(d, softmax_scale) * _LOG2_E
    block_d = max(16, triton.next_power_of_2(d))
    grid = (triton.cdiv(T, block_m), B * H)
    # Triton 3.9's interpreter gets bf16 tl.dot wrong (errors ~1e10, seen here), so on the CPU
    # the dots are done in float32; on a GPU bf16/fp16 use the tensor cores, fp32 stays IEEE.
    dot_fp32 = q.device.type == "cpu" or q.dtype == torch.float32
    precision = "ieee" if dot_fp32 else "tf32"
    try:
        _flash_fwd_kernel[grid](
            q, k, v, o, qk_scale, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            H, H // H_kv, T, S, d, S - T,
            CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
            PRECISION=precision, DOT_FP32=dot_fp32, WHILE_LOOP=_interpreting(),
            num_warps=num_warps or (4 if block_d <= 64 else 8),
            num_stages=num_stages)
    except (ValueError, RuntimeError) as e:
        if q.device.type == "cpu":
            raise RuntimeError(
                "flash_attention_triton got CPU tensors: on the CPU it runs only under Triton's "
                "interpreter (start Python with TRITON_INTERPRET=1 set, before triton is "
                f"imported); Triton said: {e}") from e
        raise
    return o


def attention_tflops(B: int, H: int, T: int, S: int, d: int, causal: bool,
                     seconds: float) -> float:
    """Achieved TFLOP/s of an attention forward: ``4·B·H·d`` FLOPs (two matmuls) per visible
    (query, key) pair: ``T·S`` pairs, or under the causal mask (queries the last T of S)
    ``T·(S − T) + T²/2`` — exactly half of ``T·S`` when T == S, the convention of Dao 2023,
    arXiv:2307.08691, section 4.1, and about ``S`` per query when decoding (T ≪ S)."""
    pairs = T * (S - T) + T * T / 2 if causal else T * S
    flops = 4.0 * B * H * d * pairs
    return flops / seconds / 1e12 if seconds > 0 else math.inf
