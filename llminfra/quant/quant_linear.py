"""``QuantLinear``: a drop-in for ``nn.Linear`` that stores a :class:`QuantizedTensor`
(packed codes + scales) and dequantizes on the fly, ``y = x · dequant(W)ᵀ + b``.

With ``act_quant="int8"`` it is the dynamic W8A8 scheme instead (Dettmers et al., 2022,
LLM.int8(), arXiv:2208.07339, §3.1 "vector-wise quantization", without the outlier split):
each token's activations are quantized on the fly with their own absmax scale ``s_x``, the
weights carry one scale per output row ``s_w``, the product is an integer matmul with int32
accumulation, and ``y = (x_q W_qᵀ) · s_x s_wᵀ``.

Fast paths (weight-only, on CPU, activations in bf16 / fp16 / fp32): an int8 per-channel
symmetric weight or a group-wise int4 weight is multiplied straight from its codes by PyTorch's
own kernels (:mod:`llminfra.quant.cpu_kernels`), so decode reads 1 or ½ byte per weight instead
of writing and reading a dequantized copy — taken by default only where PyTorch vectorizes them
(bf16 activations on an x86 CPU with AVX2 / AVX-512; elsewhere its plain loop is slower than
dequantizing).
:meth:`QuantLinear.forward_reference` is the dequantize-then-matmul path they are checked
against, and the one :func:`use_kernels` ``(model, False)`` selects. Chapters 03 and 08.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import nn

from llminfra.quant import cpu_kernels
from llminfra.quant.tensor import QuantizedTensor
from llminfra.quant.quantize_tensor import quantize

_BUFFERS = ("codes", "scale", "zero", "input_scale")


def int8_matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (M, K) int8 @ b (K, N) int8`` accumulated exactly (float64), returned as int32."""
    return (a.double() @ b.double()).to(torch.int32)


def int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (M, K) int8 @ b (K, N) int8 -> int32`` with ``torch._int_mm`` where it runs,
    else :func:`int8_matmul_reference` (the two are equal; tested)."""
    try:
        return torch._int_mm(a.contiguous(), b.contiguous())
    except (RuntimeError, AttributeError):
        return int8_matmul_reference(a, b)


def quantize_per_token_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (M, K)`` -> ``(x_q int8 (M, K), s_x (M, 1))`` with ``s_x = max_k |x| / 127``."""
    s = x.abs().amax(-1, keepdim=True).float() / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.round(x.float() / s).clamp(-127, 127).to(torch.int8), s


class QuantLinear(nn.Module):
    """Linear layer with quantized weight ``W (out, in)``; see the module docstring.

    Build it with :meth:`from_linear` (``QuantLinear.from_linear(linear, "int4-g128")``) or from a
    ready :class:`QuantizedTensor` (GPTQ / AWQ). ``act_quant`` is ``None`` (weight-only) or
    ``"int8"`` (dynamic activations; needs an ``int8-channel`` weight). ``fast`` says when CPU
    inputs take the int8 / int4 kernels where the weight's layout allows: ``None`` (default)
    where they run vectorized for the input's dtype (:func:`cpu_kernels.vectorized`), ``True`` always,
    ``False`` never (:attr:`fast_path` names the one used, ``None`` if none).
    """

    def __init__(self, qweight: QuantizedTensor, bias: torch.Tensor | None = None,
                 act_quant: str | None = None, fast: bool | None = None):
        super().__init__()
        if len(qweight.shape) != 2:
            raise ValueError(f"QuantLinear needs a 2-D weight, got shape {qweight.shape}")
        if act_quant not in (None, "int8"):
            raise ValueError(f"act_quant must be None or 'int8', got {act_quant!r}")
        if act_quant == "int8" and not (qweight.kind == "int" and qweight.bits == 8
                                        and qweight.zero is None and qweight.layout.group == qweight.shape[1]
                                        and qweight.input_scale is None):
            raise ValueError(f"act_quant='int8' needs an int8-channel (symmetric, per output row) "
                             f"weight, got scheme {qweight.scheme!r}")
        if fast not in (None, True, False):
            raise ValueError(f"fast must be None (where vectorized), True or False, got {fast!r}")
        self.out_features, self.in_features = qweight.shape
        self.act_quant = act_quant
        self._meta = dataclasses.replace(qweight, codes=torch.empty(0), scale=torch.empty(0),
                                         zero=None, input_scale=None)
        for name in _BUFFERS:
            self.register_buffer(name, getattr(qweight, name))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.fast = None if fast is None else bool(fast)
        self._kernel_cache = None  # (codes version, codes data_ptr, path, tensors); built lazily

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: str, act_quant: str | None = None,
                    fast: bool | None = None) -> "QuantLinear":
        """Quantize ``linear.weight`` with round-to-nearest ``scheme`` (see :func:`quantize`)."""
        return cls(quantize(linear.weight.detach(), scheme), linear.bias, act_quant, fast)

    def _kernel(self):
        """``(path, tensors)`` of the CPU fast path for the current codes (rebuilt if the codes
        changed, e.g. by ``load_state_dict``); ``(None, None)`` when the layout has none."""
        key = (self.codes._version, self.codes.data_ptr(), self.scale._version)
        if self._kernel_cache is None or self._kernel_cache[0] != key:
            q = self.qweight
            path, tensors = None, None
            if cpu_kernels.kernels_available() and self.codes.device.type == "cpu":
                if (tensors := cpu_kernels.prepare_int8(q)) is not None:
                    path = "int8"
                elif (tensors := cpu_kernels.prepare_int4(q)) is not None:
                    path = "int4"
            self._kernel_cache = (key, path, tensors)
        return self._kernel_cache[1], self._kernel_cache[2]

    @property
    def fast_path(self) -> str | None:
        """``"int8"`` or ``"int4"`` when bf16 CPU inputs take a kernel, else ``None``."""
        return self._kernel()[0] if self._kernel_wanted(torch.bfloat16) else None

    def _kernel_wanted(self, dtype: torch.dtype) -> bool:
        if self.act_quant is not None or self.fast is False:
            return False
        return self.fast is True or cpu_kernels.vectorized(dtype)

    @property
    def qweight(self) -> QuantizedTensor:
        """The stored weight as a :class:`QuantizedTensor` (views of this module's buffers)."""
        return dataclasses.replace(self._meta, **{n: getattr(self, n) for n in _BUFFERS})

    @property
    def weight_nbytes(self) -> int:
        """Bytes the weight takes (codes, scales, zero points, input scales)."""
        return self.qweight.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (..., in) -> (..., out)``."""
        if self.act_quant == "int8":
            return self._forward_w8a8(x)
        if (x.device.type == "cpu" and x.dtype in cpu_kernels.KERNEL_DTYPES
                and x.shape[-1] == self.in_features and self._kernel_wanted(x.dtype)):
            path, t = self._kernel()
            if path is not None:
                x2 = x.reshape(-1, self.in_features)
                if path == "int8":
                    y = cpu_kernels.int8_mm(x2, t["weight"], t["scale"])
                else:
                    y = cpu_kernels.int4_mm(x2, t["packed"], t["group"], t["scale_zero"])
                if self.bias is not None:
                    y = y + self.bias.to(x.dtype)
                return y.reshape(*x.shape[:-1], self.out_features)
        return self.forward_reference(x)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize-then-matmul: ``x · dequant(W)ᵀ + b`` in ``x.dtype`` (the reference)."""
        w = self.qweight.dequantize(x.dtype)
        return nn.functional.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def _forward_w8a8(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        xq, sx = quantize_per_token_int8(x.reshape(-1, self.in_features))
        wq = (self.codes.to(torch.int16) - 128).to(torch.int8)            # (out, in)
        acc = int8_matmul(xq, wq.T)                                          # (M, out) int32
        y = acc.float() * sx * self.scale.float().reshape(1, -1)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        """Sizes, scheme and activation mode, shown by ``print(model)``."""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"scheme={self._meta.scheme!r}, act_quant={self.act_quant!r}, fast={self.fast}")


@contextlib.contextmanager
def use_kernels(model: nn.Module, fast: bool | None):
    """Within the block, every :class:`QuantLinear` of ``model`` has ``fast`` set to ``fast``
    (``False``: the dequantize-then-matmul reference everywhere); restored afterwards."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    before = [m.fast for m in layers]
    for m in layers:
        m.fast = fast
    try:
        yield model
    finally:
        for m, f in zip(layers, before):
            m.fast = f
