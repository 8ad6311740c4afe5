"""How a fused matrix is applied: the matmuls of the fast layer, as typed objects.

Each matrix of :class:`~llminfra.runner.fused.FusedWeights` is applied through a *matmul*
(:class:`BaseMatmul`): ``f(x) = x · Wᵀ`` and ``f.add(x, r) = r + x · Wᵀ`` — the residual added
inside the product where the kernel can (``torch.addmm`` for ``F.linear``, oneDNN's ``add``
post-op for prepacked weights), so a block's two residual adds cost no call of their own. What
a matmul can do beyond that is said by its class (``fuses``, ``adds_in_fused``), never found
by probing its attributes:

* :class:`Matmul` — ``F.linear`` on ``W`` as it is stored;
* :class:`PrepackedMatmul` — oneDNN's prepacked weight (:mod:`llminfra.runner.prepacked`);
* :class:`SkinnyMatmul` — the package's fp32 C kernels (:mod:`llminfra.kernels.f32_skinny`),
  which form RMSNorm, SwiGLU and the residual add in the product's call;
* :class:`FunctionMatmul` — any ``linear(W) -> f`` (int4, w4a8), typed by what ``f`` is
  (:class:`SizedLinear`, :class:`FusingLinear`).

Chapter 12.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from llminfra.kernels.f32_skinny import SkinnyKernel, check_weight, pack_panels
from llminfra.runner.prepacked import pack_weight


@runtime_checkable
class SizedLinear(Protocol):
    """What a ``linear(W) -> f`` may return beyond ``f(x) = x · Wᵀ``: ``nbytes``, the bytes of
    weight a product reads (int4's codes and scales: :func:`llminfra.quant.int4_linear`)."""

    nbytes: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class FusingLinear(Protocol):
    """An ``f`` that also forms RMSNorm and SwiGLU inside its own call, as
    :class:`~llminfra.kernels.w4a8.W4A8Weight` does: ``fused(x, norm=g, eps=ε)`` is
    ``f(RMSNorm(x)·g)``, ``fused(x, gated=True)`` ``f(silu(gate)·up)`` of ``x = [gate | up]``."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def fused(self, x: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 1e-5,
              gated: bool = False) -> torch.Tensor: ...


class BaseMatmul:
    """What the fast layer (:mod:`llminfra.runner.fast_layer`) asks of a fused matrix: ``f(x)``
    = ``x · Wᵀ (+ b)``, ``f.add(x, r)`` = ``r + f(x)``, ``nbytes`` (bytes a product reads),
    ``bias``, and two flags — ``fuses``: ``f.fused`` forms RMSNorm / SwiGLU in the product's
    call (see :class:`FusingLinear`); ``adds_in_fused``: ``f.fused(…, residual=r)`` adds ``r``
    in that call too. The flags are set by the class, never probed for."""

    fuses = False
    adds_in_fused = False
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + f(x)``."""
        return residual + self(x)

    def fused(self, x: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 1e-5,
              gated: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``f(RMSNorm(x)·norm)`` or ``f(silu(gate)·up)`` in the product's call, where
        ``fuses``; ``TypeError`` on a matmul that forms neither."""
        raise TypeError(f"{type(self).__name__} forms no RMSNorm or SwiGLU in its call "
                        f"(fuses is False): apply the norm with torch first")

    @property
    def nbytes(self) -> int:
        """Bytes of the weight this matmul reads."""
        raise NotImplementedError


class Matmul(BaseMatmul):
    """``x · Wᵀ (+ b)`` on a weight ``W`` ``(out, in)`` as it is stored (``F.linear``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self._wt = self.weight.t()                    # a view: addmm reads Wᵀ in place

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + x · Wᵀ`` in one call (x and residual 2-D)."""
        if self.bias is not None:
            return residual + self(x)
        return torch.addmm(residual, x, self._wt)

    @property
    def nbytes(self) -> int:
        """Bytes of the weight this matmul reads."""
        return self.weight.numel() * self.weight.element_size()


class PrepackedMatmul(Matmul):
    """The same product on oneDNN's prepacked weight (:mod:`llminfra.runner.prepacked`), the
    residual added by its ``add`` post-op."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(weight, bias)
        self._packed = pack_weight(self.weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self._packed, self.bias,
                                                         "add")


class SkinnyMatmul(Matmul):
    """A product on the package's C kernels, ``kernel``
    (:class:`llminfra.kernels.f32_skinny.SkinnyKernel`, on its thread pool): at most
    ``kernel.max_rows`` rows on ``llminfra/kernels/csrc/f32_skinny.c`` (each thread streams its
    run of ``W``'s rows once, front to back: a decode step at batch 1 or 2 is a stream of the
    weights), more, up to ``kernel.panel_max_rows`` (a decode step of many sequences, a prompt
    chunk), on ``llminfra/kernels/csrc/f32_panels.c`` (``W`` packed once in panels of 16
    columns, an outer product in registers), past that on ``F.linear`` (:class:`Matmul`). With
    a bias every row goes to oneDNN's prepacked weight (:class:`PrepackedMatmul`) and it does
    not fuse. Without one it ``fuses``: ``fused(x, norm=g, eps=ε)`` is ``f(RMSNorm(x)·g)`` and
    ``fused(x, gated=True)`` ``f(silu(gate)·up)`` of ``x = [gate | up]``, formed inside the
    kernels' call where they take the rows (SiLU's exp the w4a8 kernel's own). ``ValueError``
    for a weight the fp32 kernels cannot read, bias or not
    (:func:`~llminfra.kernels.f32_skinny.check_weight`: a bf16 or fp16 one names its dtype)."""

    adds_in_fused = True

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 kernel: SkinnyKernel):
        check_weight(weight)
        arena = kernel.arena                          # huge pages (kernels.huge_pages), or None
        if bias is None and arena is not None:
            weight = arena.copy(weight.detach())           # a copy there: W streams
        super().__init__(weight.contiguous(), bias)
        self._kernel = kernel
        self._n, self._k = self.weight.shape
        self._blas = PrepackedMatmul(self.weight, self.bias) if bias is not None else None
        #: W packed in panels of 16 columns (``f32_panels.c``), or None
        self.panels = None
        if bias is None and kernel.panel is not None and kernel.panel_max_rows > kernel.max_rows:
            numel = -(-self._n // 16) * 16 * self._k
            self.panels = pack_panels(kernel, self.weight,
                                      None if arena is None else arena.empty(numel))
        #: the most rows a product sends to ``f32_skinny.c``; to the C kernels (0: none: a bias)
        self.skinny_rows = kernel.max_rows
        self.c_rows = (0 if bias is not None else
                       kernel.panel_max_rows if self.panels is not None else kernel.max_rows)
        #: the norms and SwiGLU in the kernels' call: every product but one with a bias
        self.fuses = bias is None

    def _product(self, x: torch.Tensor, residual: torch.Tensor | None, M: int,
                 norm: torch.Tensor | None = None, eps: float = 0.0,
                 gated: bool = False) -> torch.Tensor:
        k = self._kernel
        fn, w = (k.fn, self.weight) if M <= k.max_rows else (k.panel, self.panels)
        y = torch.empty(*x.shape[:-1], self._n)
        status = fn(x.data_ptr(), w.data_ptr(), None if residual is None else residual.data_ptr(),
                    y.data_ptr(), M, self._n, self._k, x.shape[-1], gated,
                    None if norm is None else norm.data_ptr(), eps, k.threads, k.pool)
        if status:
            raise ValueError(f"{fn.__name__} refused x {tuple(x.shape)} for W "
                             f"{tuple(self.weight.shape)} on {k.threads} threads")
        return y

    def _rows_of(self, x: torch.Tensor, width: int) -> int:
        """x's rows where the C kernels take it (a decode step's, contiguous float32, ``width``
        wide), else 0."""
        M = x.numel() // width
        return (M if 0 < M <= self.c_rows and x.shape[-1] == width and x.is_contiguous()
                and x.dtype == torch.float32 and x.device.type == "cpu" else 0)

    @staticmethod
    def _fits(t: torch.Tensor, numel: int) -> bool:
        """Whether C can read ``t`` as ``numel`` floats (a residual, a norm's gains): contiguous
        float32 on the CPU, of that size."""
        return (t.is_contiguous() and t.dtype == torch.float32 and t.device.type == "cpu"
                and t.numel() == numel)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        M = self._rows_of(x, self._k)
        if M:
            return self._product(x, None, M)
        return self._blas(x) if self._blas is not None else super().__call__(x)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        M = self._rows_of(x, self._k)
        if M and self._fits(residual, M * self._n):
            return self._product(x, residual, M)
        return self._blas.add(x, residual) if self._blas is not None else super().add(x, residual)

    def fused(self, x: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 1e-5,
              gated: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``fused`` (see the class); ``residual``: ``residual + f(…)`` in the same call."""
        if not self.fuses:
            return super().fused(x, norm, eps, gated, residual)
        M = self._rows_of(x, 2 * self._k if gated else self._k)
        if M and (norm is None or self._fits(norm, self._k)) and \
                (residual is None or self._fits(residual, M * self._n)):
            return self._product(x, residual, M, norm, float(eps), bool(gated))
        if gated:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        if norm is not None:
            x = F.rms_norm(x, (self._k,), norm, eps)
        return self(x) if residual is None else self.add(x, residual)


class FunctionMatmul(BaseMatmul):
    """A ``linear(W) -> f`` of the package (int4, w4a8: :mod:`llminfra.quant`,
    :mod:`llminfra.kernels.w4a8`) as a matmul; ``add`` is ``residual + f(x)``. What ``f`` is
    decides the rest: a :class:`SizedLinear` says its ``nbytes`` (else ``W``'s own), a
    :class:`FusingLinear` ``fuses`` and its ``fused`` is passed on."""

    def __init__(self, f: Callable[[torch.Tensor], torch.Tensor], weight: torch.Tensor,
                 bias: torch.Tensor | None = None):
        self.f, self.bias = f, None if bias is None else bias.detach()
        self._nbytes = (f.nbytes if isinstance(f, SizedLinear)
                        else weight.numel() * weight.element_size())
        self.fuses = isinstance(f, FusingLinear)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.f(x)
        return y if self.bias is None else y + self.bias

    def fused(self, x: torch.Tensor, norm: torch.Tensor | None = None, eps: float = 1e-5,
              gated: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``f.fused`` (without the bias, which the caller adds); ``residual`` added after."""
        if not self.fuses:
            return super().fused(x, norm, eps, gated, residual)
        y = self.f.fused(x, norm=norm, eps=eps, gated=gated)
        return y if residual is None else residual + y

    @property
    def nbytes(self) -> int:
        """Bytes of the weight ``f`` reads."""
        return int(self._nbytes)
