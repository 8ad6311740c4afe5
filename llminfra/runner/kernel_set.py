"""The kernels a fast runner multiplies, attends and steps with, as one typed object.

A :class:`KernelSet` names what the fused weights (:class:`~llminfra.runner.fused.FusedWeights`)
are built with and what the step then calls:

* ``matmul`` — ``matmul(W, bias) -> BaseMatmul``: how each fused matrix is applied
  (:mod:`llminfra.runner.matmul`; None: the model's own kind, ``F.linear`` or oneDNN's
  prepacked weights);
* ``attention`` — the C paged decode attention
  (:class:`~llminfra.kernels.paged_decode.PagedDecodeKernel`, with its ``rope_write``) or None
  (torch's gather and SDPA; Triton on CUDA);
* ``step`` — ``step(weights, pools) -> DecodeStack | None``: the whole decode step in one C
  call (:mod:`llminfra.runner.decode_stack`), or None (the Python step).

The three share one thread pool where they are the package's C kernels
(:mod:`llminfra.kernels`). :func:`skinny_kernels` (fp32) and :func:`w4a8_kernels` (int4 × int8)
build them; :meth:`KernelSet.of` wraps any ``linear(W) -> f`` (e.g.
:func:`llminfra.quant.int4_linear`). Which set a machine gets is
:mod:`llminfra.runner.kernel_choice`. Chapter 12.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llminfra.kernels import f32_skinny, paged_decode, w4a8
from llminfra.kernels.library import library
from llminfra.runner import decode_stack
from llminfra.runner.matmul import BaseMatmul, FunctionMatmul, SkinnyMatmul


@dataclass(frozen=True)
class KernelSet:
    """What the fast runner's weights multiply with (``matmul``), its decode attention
    (``attention``) and its one-call step (``step``); see the module."""

    name: str
    matmul: Callable[..., BaseMatmul] | None = None
    attention: paged_decode.PagedDecodeKernel | None = None
    step: Callable | None = None

    @classmethod
    def of(cls, linear: Callable[[torch.Tensor], Callable], name: str = "linear") -> KernelSet:
        """Every matrix applied through ``linear(W) -> f`` (``f(x) = x · Wᵀ``) as a
        :class:`~llminfra.runner.matmul.FunctionMatmul`: where ``f`` is a
        :class:`~llminfra.runner.matmul.FusingLinear`, as
        :class:`~llminfra.kernels.w4a8.W4A8Weight` is, the fast paths hand it the norms and
        SwiGLU."""
        return cls(name, lambda weight, bias=None: FunctionMatmul(linear(weight), weight, bias))


def skinny_kernels(threads: int | None = None, max_rows: int = f32_skinny.MAX_ROWS,
                   panel_max_rows: int = f32_skinny.PANEL_MAX_ROWS) -> KernelSet:
    """fp32 on the package's C kernels: each matrix a
    :class:`~llminfra.runner.fused.SkinnyMatmul` sharing one
    :func:`~llminfra.kernels.f32_skinny.kernel` — at most ``max_rows`` rows on
    ``f32_skinny.c``, up to ``panel_max_rows`` on ``f32_panels.c``, more on ``F.linear`` —
    with the C paged decode attention and the one-call step on the same thread pool.
    ``RuntimeError`` where the C kernels cannot be built."""
    kernel = f32_skinny.kernel(threads, max_rows, panel_max_rows)
    return KernelSet("skinny", lambda weight, bias=None: SkinnyMatmul(weight, bias, kernel=kernel),
                     paged_decode.kernel(pool=kernel.owner),
                     decode_stack.builder(library(), kernel.owner, 1))


def w4a8_kernels(passes: int = 1, threads: int | None = None) -> KernelSet:
    """int4 weights × int8 activations (:class:`~llminfra.kernels.w4a8.w4a8_linear`) with the
    C paged decode attention and the one-call step on the same thread pool. ``RuntimeError``
    where the C kernels cannot be built."""
    linear = w4a8.w4a8_linear(passes=passes, threads=threads)
    return KernelSet("w4a8", KernelSet.of(linear).matmul, paged_decode.kernel(pool=linear.pool),
                     decode_stack.builder(linear.lib, linear.pool, passes))
