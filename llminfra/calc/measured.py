"""Measure, on the CPU and exactly, what a training step and an inference pass hold in memory.

The calculator (:mod:`llminfra.calc.memory`) predicts memory from the architecture; this module
measures it on a real ``torch.nn.Module`` so the two can be compared (chapter 01). Every number
is bytes of tensor storage, counted once per storage (views and tied weights are not counted
twice):

* parameters: ``Σ numel · element_size`` over the module's distinct parameter storages;
* gradients: the same over ``p.grad`` after ``backward()``;
* optimizer state: every tensor in ``optimizer.state`` after ``step()`` — for AdamW
  (Loshchilov & Hutter, 2017, arXiv:1711.05101, Alg. 2) two moments ``exp_avg`` and
  ``exp_avg_sq`` of each parameter's size plus a one-element ``step`` counter per tensor;
* activations: the tensors autograd saves for backward, seen through
  ``torch.autograd.graph.saved_tensors_hooks`` during the forward pass, deduplicated by storage,
  parameters excluded (:func:`saved_activations`);
* inference peak: the largest sum of live tensor storages created during a ``no_grad`` forward,
  output included, tracked op by op with a ``TorchDispatchMode`` (:func:`peak_forward_bytes`).
  Scratch memory that a kernel allocates and frees inside one op is not a tensor and is not seen.

Both methods are validated in ``tests/test_measured.py`` on small networks whose saved and live
tensors are worked out by hand. Taught in chapter 01 (``notebooks/01_training_vs_inference``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def tensor_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view or a tied weight counts once).

    Example: a (1000, 10) float32 tensor and its transpose -> 40,000 bytes, not 80,000.
    """
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def parameter_bytes(module: torch.nn.Module) -> int:
    """Bytes of ``module``'s parameters (``P · bytes per element``; tied weights counted once)."""
    return tensor_storage_bytes(module.parameters())


def gradient_bytes(module: torch.nn.Module) -> int:
    """Bytes of the ``.grad`` tensors of ``module``'s parameters (0 before ``backward()``)."""
    return tensor_storage_bytes(p.grad for p in module.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes held in ``optimizer.state`` by state name, e.g. for AdamW after one step
    ``{"step": 4 · n_tensors, "exp_avg": 4 · P, "exp_avg_sq": 4 · P}`` (float32 parameters).

    The state is created lazily by the first ``step()``: before it, this is ``{}``.
    """
    out: dict[str, int] = {}
    for state in optimizer.state.values():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                out[name] = out.get(name, 0) + tensor_storage_bytes([value])
    return out


@dataclass(frozen=True)
class SavedActivations:
    """What autograd saved for backward during one forward pass.

    ``total_bytes`` counts each storage once; ``tensors`` lists ``(shape, dtype, storage bytes)``
    of every distinct storage in the order it was first saved (for a breakdown by shape).
    """

    total_bytes: int
    tensors: tuple[tuple[tuple[int, ...], str, int], ...]

    def by_shape(self) -> dict[tuple[tuple[int, ...], str], tuple[int, int]]:
        """``(shape, dtype) -> (count, bytes)`` over :attr:`tensors`."""
        out: dict[tuple[tuple[int, ...], str], tuple[int, int]] = {}
        for shape, dtype, nbytes in self.tensors:
            n, b = out.get((shape, dtype), (0, 0))
            out[(shape, dtype)] = (n + 1, b + nbytes)
        return out


def saved_activations(fn: Callable[[], torch.Tensor],
                      exclude: Iterable[torch.Tensor] = ()) -> tuple[torch.Tensor, SavedActivations]:
    """Run ``fn()`` (a forward pass returning e.g. the loss) and record the tensors autograd
    saves for backward, through ``torch.autograd.graph.saved_tensors_hooks``.

    Storages of ``exclude`` (pass the parameters: a matmul saves its weight, which is not an
    activation) are skipped. Returns ``(fn's result, SavedActivations)``; keep the result alive
    to backpropagate. Saved tensors stay alive as long as the graph, so two distinct saved
    storages can never share an address and the deduplication by address is exact.
    Example: ``Linear(d, 4d) -> ReLU -> Linear(4d, d) -> sum of squares`` on x ``(B, d)``
    saves x, the ReLU output and the final output: ``4 · (B·d + 4·B·d + B·d)`` bytes in fp32.
    """
    skip = {_storage_key(t) for t in exclude}
    found: dict[int, tuple[tuple[int, ...], str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key not in skip and key not in found and st.nbytes() > 0:
            found[key] = (tuple(t.shape), str(t.dtype).removeprefix("torch."), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    records = tuple(found.values())
    return result, SavedActivations(sum(r[2] for r in records), records)


class _LiveTensorTracker(TorchDispatchMode):
    """Tracks the storages created by dispatched ops while they are alive: ``current_bytes``
    and ``peak_bytes``. A storage is counted when an op first returns it and released when the
    last tracked tensor on it is garbage-collected; outputs that alias an op's input (views,
    in-place ops) add a reference, not bytes; views of untracked storages (parameters, inputs)
    are ignored."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, tracked tensors]
        self.current_bytes = 0
        self.peak_bytes = 0

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[key]
            self.current_bytes -= entry[0]

    def _track(self, t: torch.Tensor, input_keys: set[int]) -> None:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key == 0:
            return
        entry = self.live.get(key)
        if entry is None:
            if key in input_keys:  # a view of something made outside: not ours
                return
            entry = self.live[key] = [st.nbytes(), 0]
            self.current_bytes += st.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = tree_flatten((args, kwargs))[0]
        input_keys = {_storage_key(a) for a in inputs
                      if isinstance(a, torch.Tensor) and a.layout == torch.strided}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self._track(t, input_keys)
        return out


def peak_forward_bytes(module: torch.nn.Module, *inputs, **kwargs) -> int:
    """Peak bytes of live tensors created by ``module(*inputs, **kwargs)`` under ``no_grad``.

    The inference-pass memory beyond weights and inputs: intermediate tensors are freed as soon
    as nothing refers to them, so the peak is the largest set alive at once, and it includes the
    returned output (e.g. the ``(B, T, V)`` logits). Example: ``Linear(d, 4d) -> ReLU ->
    Linear(4d, d)`` on x ``(B, d)`` in fp32 peaks while ReLU runs, holding the first linear's
    output and ReLU's: ``4 · (4·B·d + 4·B·d)`` bytes.
    """
    tracker = _LiveTensorTracker()
    with torch.no_grad(), tracker:
        out = module(*inputs, **kwargs)
        del out
    return tracker.peak_bytes


@dataclass(frozen=True)
class TrainingStepMemory:
    """Bytes of one measured training step (forward, backward, optimizer step), by part.

    ``optimizer_states`` maps each state name to its bytes (AdamW: ``step``, ``exp_avg``,
    ``exp_avg_sq``); ``activations`` is what autograd saved for backward; ``inference_peak``
    is the peak of a ``no_grad`` forward on the same inputs (:func:`peak_forward_bytes`).
    """

    parameters: int
    gradients: int
    optimizer_states: dict[str, int]
    activations: int
    inference_peak: int
    saved: SavedActivations

    @property
    def optimizer_state_bytes(self) -> int:
        """All optimizer state, summed over state names."""
        return sum(self.optimizer_states.values())

    @property
    def training_total(self) -> int:
        """Parameters + gradients + optimizer state + saved activations."""
        return self.parameters + self.gradients + self.optimizer_state_bytes + self.activations

    @property
    def inference_total(self) -> int:
        """Parameters + the inference forward's peak."""
        return self.parameters + self.inference_peak


def measure_training_step(module: torch.nn.Module, inputs: tuple,
                          loss_fn: Callable[[torch.Tensor], torch.Tensor],
                          optimizer: torch.optim.Optimizer | None = None) -> TrainingStepMemory:
    """Measure one step ``loss_fn(module(*inputs)).backward(); optimizer.step()`` and one
    ``no_grad`` forward on the same inputs.

    ``optimizer`` defaults to ``torch.optim.AdamW(module.parameters(), lr=1e-3)``; the step
    changes the module's weights (measure a copy if that matters). Gradients are reset to
    ``None`` first so that only this step's gradients are counted.
    """
    if not isinstance(inputs, tuple):
        raise ValueError(f"inputs must be a tuple of the module's positional arguments, "
                         f"got {type(inputs).__name__}")
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the module has no trainable parameters: nothing to train")
    if optimizer is None:
        optimizer = torch.optim.AdamW(params, lr=1e-3)
    inference_peak = peak_forward_bytes(module, *inputs)
    module.zero_grad(set_to_none=True)
    loss, saved = saved_activations(lambda: loss_fn(module(*inputs)), exclude=params)
    if loss.dim() != 0:
        raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
    loss.backward()
    optimizer.step()
    return TrainingStepMemory(parameters=parameter_bytes(module), gradients=gradient_bytes(module),
                              optimizer_states=optimizer_state_bytes(optimizer),
                              activations=saved.total_bytes, inference_peak=inference_peak,
                              saved=saved)
