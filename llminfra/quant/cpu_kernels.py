"""PyTorch's own CPU kernels for weight-only int8 and int4 matmuls: the fast paths of
:class:`llminfra.quant.QuantLinear`.

Dequantize-then-matmul (the reference path) writes a full 16/32-bit copy of ``W`` before the
matmul, so it reads MORE bytes than an unquantized layer and saves memory but not time. These
kernels multiply straight from the packed codes, so a decode step reads ``bits/8`` bytes per
weight and saves time too — the path torchao and gpt-fast take:

* **int8, per output channel, symmetric**: ``y = x · (W_q · s)ᵀ`` with
  ``torch.ops.aten._weight_int8pack_mm(x (M, K), W_q int8 (N, K), s (N,))``;
* **int4, group-wise** (groups of 32/64/128/256 along ``K``, ``N`` a multiple of 16):
  ``torch.ops.aten._convert_weight_to_int4pack_for_cpu(u int32 (N, K), 1)`` packs the codes
  ``u ∈ [0, 15]`` once; ``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, g, SZ)``
  dequantizes as ``w = (u - 8) · s + z'`` with ``SZ (K/g, N, 2) = [s, z']``. Our asymmetric
  codes ``w = (u - z) · s`` map to it with ``z' = (8 - z) · s`` (symmetric: ``z = 8``,
  ``z' = 0``).

Each ``prepare_*`` returns the tensors a layer keeps (or ``None`` when the weight's layout does
not fit the kernel); each ``*_mm`` runs the kernel on ``x (M, K)`` of dtype bf16, fp16 or fp32.

The kernels are fast only where PyTorch vectorizes them: on x86 its AVX2 and AVX-512 code
takes bf16 activations; fp32 and fp16 activations run a plain loop
(``aten/src/ATen/native/cpu/int4mm_kernel.cpp``). :func:`vectorized` says which case a call is:
with fp32 activations the plain loop is many times slower than the fp32 matmul it replaces, so
:class:`~llminfra.quant.QuantLinear` takes the kernels by default only where they vectorize.
Chapter 08 (section 8) measures one layer on the machine that runs it, and the recorded ``bench
roofline`` run (``llminfra/data/bench_roofline_cpu.json``, ``quantized_decode``) a whole
model's decode step with each.
Checked against the dequantize-then-matmul reference in ``tests/test_roofline_quant.py``.
Chapters 03 and 08.
"""

from __future__ import annotations

import functools

import torch

from llminfra.quant import packing
from llminfra.quant.tensor import QuantizedTensor
from llminfra.quant.quantize_tensor import quantize

#: activation dtypes the kernels accept
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: int4 group sizes the CPU kernel supports
INT4_GROUPS = (32, 64, 128, 256)


def kernels_available() -> bool:
    """Whether this PyTorch build has the CPU int8 and int4 weight-only kernels."""
    ops = torch.ops.aten
    return all(hasattr(ops, n) for n in ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu",
                                         "_convert_weight_to_int4pack_for_cpu"))


def cpu_capability() -> str:
    """The instruction set PyTorch's CPU kernels were dispatched for: ``"AVX512"``, ``"AVX2"``,
    ``"DEFAULT"``, … (``torch.backends.cpu.get_cpu_capability()``)."""
    return torch.backends.cpu.get_cpu_capability()


@functools.cache
def vectorized(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the int8 / int4 kernels run vectorized here for activations of ``dtype``: an x86
    CPU with AVX2 or AVX-512 and bf16 activations (other CPUs: assumed not)."""
    return (kernels_available() and dtype == torch.bfloat16
            and cpu_capability().startswith(("AVX2", "AVX512")))


def prepare_int8(q: QuantizedTensor) -> dict | None:
    """``{"weight": int8 (N, K), "scale": fp32 (N,)}`` for a symmetric per-output-channel int8
    weight (codes are stored offset by 128), else ``None``."""
    N, K = q.shape
    if not (q.kind == "int" and q.bits == 8 and q.zero is None and q.input_scale is None
            and q.layout.group == K and q.layout.rows == N):
        return None
    w = (q.codes.to(torch.int16) - 128).to(torch.int8).reshape(N, K).contiguous()
    return {"weight": w, "scale": q.scale.float().reshape(N).contiguous()}


def prepare_int4(q: QuantizedTensor) -> dict | None:
    """``{"packed": …, "group": g, "scale_zero": fp32 (K/g, N, 2)}`` for a group-wise int4 weight
    the CPU kernel can take (``g`` in :data:`INT4_GROUPS`, ``K % g == 0``, ``N % 16 == 0``), else
    ``None``."""
    N, K = q.shape
    g = q.layout.group
    if not (q.kind == "int" and q.bits == 4 and q.input_scale is None and g in INT4_GROUPS
            and K % g == 0 and N % 16 == 0 and q.layout.rows == N):
        return None
    u = packing.unpack(q.codes, 4, K).to(torch.int32).reshape(N, K).contiguous()
    s = q.scale.float()                                                 # (N, K/g)
    z = q.zero.float() if q.zero is not None else torch.full_like(s, 8.0)
    scale_zero = torch.stack([s, (8.0 - z) * s], dim=-1).transpose(0, 1).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1)
    return {"packed": packed, "group": g, "scale_zero": scale_zero}


def int8_mm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x (M, K) @ (weight · scale)ᵀ -> (M, N)`` in ``x.dtype``, from the int8 codes."""
    return torch.ops.aten._weight_int8pack_mm(x.contiguous(), weight, scale.to(x.dtype))


def int4_mm(x: torch.Tensor, packed: torch.Tensor, group: int,
            scale_zero: torch.Tensor) -> torch.Tensor:
    """``x (M, K) @ dequant(W)ᵀ -> (M, N)`` in ``x.dtype``, from the packed int4 codes."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), packed, group,
                                                      scale_zero.to(x.dtype))


def int4_linear(group: int = 32, activations: torch.dtype = torch.bfloat16):
    """A ``linear`` for :class:`llminfra.runner.FastDecoder`: ``linear(W) -> f`` quantizes ``W``
    to int4 once (round to nearest, groups of ``group`` along the input, a zero point: the
    scheme ``int4-g{group}``) and ``f(x)`` multiplies from the packed codes with
    :func:`int4_mm`, ``x`` cast to ``activations`` (bf16: the vectorized path, see
    :func:`vectorized`) and the result cast back. ``ValueError`` for a weight the kernel cannot
    take (``N`` a multiple of 16, ``K`` of ``group``)."""
    if group not in INT4_GROUPS:
        raise ValueError(f"group must be one of {INT4_GROUPS}, got {group!r}")
    if activations not in KERNEL_DTYPES:
        raise ValueError(f"activations must be one of {KERNEL_DTYPES}, got {activations!r}")

    def prepare(weight: torch.Tensor):
        t = prepare_int4(quantize(weight.detach().float(), f"int4-g{group}"))
        if t is None:
            raise ValueError(f"a {tuple(weight.shape)} weight does not fit the int4 kernel: "
                             f"rows a multiple of 16, columns of {group}")
        packed, scale_zero = t["packed"], t["scale_zero"].to(activations)

        def apply(x: torch.Tensor) -> torch.Tensor:
            y = int4_mm(x.reshape(-1, x.shape[-1]).to(activations), packed, group, scale_zero)
            return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])
        apply.nbytes = packed.numel() * packed.element_size() + \
            scale_zero.numel() * scale_zero.element_size()
        return apply
    return prepare
