"""The same model on oneDNN's prepacked fp32 matmul: each weight reordered once, not per call.

``F.linear`` on a CPU hands ``x · Wᵀ`` to a BLAS ``sgemm`` that takes ``W`` as it is stored and
re-arranges panels of it into the layout its inner loop reads, on every call. In a decode step
``x`` has one row per running sequence, so that re-arrangement is most of the work: the weight
is read, written and read again for a handful of rows. oneDNN (the CPU library inside PyTorch)
can reorder the weight *once* into its blocked layout and multiply from that layout ever after
(``torch.ops.mkldnn._reorder_linear_weight`` then ``torch.ops.mkldnn._linear_pointwise``). The
arithmetic is the same product; only the order of the additions inside each dot product
differs, so results agree to float32 rounding, not bit for bit (the tests hold them to a
tolerance, and the greedy tokens to each other).

This is what vLLM's CPU backend does with every unquantized linear layer on x86
(``dispatch_cpu_unquantized_gemm`` in ``vllm/model_executor/layers/utils.py``: a oneDNN matmul
handler built once from the weight). ``python -m llminfra bench real`` measures both kernels on
SmolLM2, side by side with Hugging Face ``transformers`` (whose layers call ``F.linear``).

* :func:`prepacked` — a copy of a model whose ``nn.Linear`` layers multiply from prepacked
  weights; it shares every parameter with the original (no weight is copied; the packed
  weights are extra memory, about the size of the linear weights again). For inference: the
  packed weights are a snapshot, re-pack after changing the weights.
* :func:`onednn_linear` — the same kernel as a ``linear(W) -> f`` for
  :class:`~llminfra.runner.fast_decode.FastDecoder`.

Chapter 08 (where the time of a decode step goes).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

#: the number of rows oneDNN is told to expect when it chooses the packed layout (a decode
#: step's batch); any number of rows works with it
BATCH_HINT = 16


def available() -> bool:
    """True where this PyTorch build has oneDNN and its prepacked linear ops (x86 and Arm
    builds of PyTorch ship it; a build without it gets a clear error from :func:`prepacked`)."""
    return bool(torch.backends.mkldnn.is_available()
                and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _require_onednn() -> None:
    if not available():
        raise RuntimeError("this PyTorch build has no oneDNN prepacked linear "
                           "(torch.backends.mkldnn.is_available() is False): use the model as "
                           "it is")


def _require(weight: torch.Tensor) -> None:
    _require_onednn()
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"oneDNN prepacking here takes a 2-D float32 CPU weight, got "
                         f"{weight.dtype} {tuple(weight.shape)} on {weight.device}")


def pack_weight(weight: torch.Tensor, batch_hint: int = BATCH_HINT) -> torch.Tensor:
    """``weight`` ``(out, in)`` reordered into oneDNN's blocked layout (an opaque tensor)."""
    _require(weight)
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), batch_hint)


def packed_linear(x: torch.Tensor, packed: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x · Wᵀ (+ bias)`` from :func:`pack_weight`'s ``packed``; x ``(..., in)`` float32."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def onednn_linear(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``linear(W) -> f`` with ``f(x) = x · Wᵀ`` on the prepacked weight (FastDecoder's hook)."""
    packed = pack_weight(weight)
    return lambda x: packed_linear(x, packed)


class PrepackedLinear(nn.Module):
    """An ``nn.Linear`` that multiplies from a prepacked copy of its weight. ``weight`` and
    ``bias`` are the original layer's parameters (the state dict is unchanged); inputs that are
    not float32 go to ``F.linear`` as an ``nn.Linear`` would (which refuses a dtype mismatch)."""

    def __init__(self, linear: nn.Linear, batch_hint: int = BATCH_HINT):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        _require(linear.weight)
        self.batch_hint = batch_hint
        # packed on the first call (not a buffer: never saved); a model whose steps run on the
        # fused weights of the engine's fast runner never calls it, and never pays its memory
        self._packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or self.weight.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)
        if self._packed is None:
            self._packed = pack_weight(self.weight, self.batch_hint)
        return packed_linear(x, self._packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN prepacked"


def prepacked(model: nn.Module, batch_hint: int = BATCH_HINT) -> nn.Module:
    """A copy of ``model`` (sharing all its parameters and buffers) whose float32 CPU
    ``nn.Linear`` layers are :class:`PrepackedLinear`; the original is left as it was.
    ``RuntimeError`` without oneDNN; ``ValueError`` if the model has no such layer."""
    _require_onednn()
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    fast = copy.deepcopy(model, shared)
    swapped = 0
    for parent in list(fast.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 \
                    and child.weight.device.type == "cpu" and not child.weight.is_meta:
                setattr(parent, name, PrepackedLinear(child, batch_hint))
                swapped += 1
    if not swapped:
        raise ValueError(f"{type(model).__name__} has no float32 CPU nn.Linear to prepack "
                         "(a quantized or GPU model keeps its own kernels)")
    return fast.eval()
