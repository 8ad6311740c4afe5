"""Which kernels a machine gets: what ``serve``'s ``--matmul``, ``--runner`` and
``--quantization`` mean on this model and this CPU.

``serve`` asks three questions here, and hands the answers to the engine from outside
(:func:`llminfra.runner.fast_runner`): which matmul (:func:`resolve_matmul`: ``F.linear``,
oneDNN's prepacked weights, or the package's C kernels where they build), which runner
(:func:`resolve_runner`: the fused fast step wherever the fused weights take the model) and,
for ``--quantization``, which kernel set (:func:`quantized_kernels`). Where the C kernels cannot
be built here (:func:`llminfra.kernels.w4a8.available`: no compiler, a failed build) the answer
is a torch path, never an error. Chapter 12.
"""

from __future__ import annotations

import torch

from llminfra.kernels import w4a8
from llminfra.runner import prepacked
from llminfra.runner.fast_runner import fast_runner
from llminfra.runner.fused import unsupported
from llminfra.runner.kernel_set import KernelSet, skinny_kernels, w4a8_kernels

#: ``--matmul`` choices: ``auto`` (see :func:`resolve_matmul`), ``F.linear`` as the model is,
#: :mod:`llminfra.runner.prepacked`, or ``skinny``: every product on the package's C kernels
#: (:mod:`llminfra.kernels.f32_skinny`), a step in one C call (:mod:`llminfra.runner.decode_stack`)
MATMULS = ("auto", "plain", "onednn", "skinny")
#: ``--runner`` choices: the readable model, the fused fast step, or ``auto``
#: (:func:`resolve_runner`)
RUNNERS = ("auto", "readable", "fast")
#: ``--quantization`` choices
QUANTIZATIONS = (None, "w4a8")


def check_choices(matmul: str, runner: str, quantization: str | None) -> None:
    """``ValueError`` naming a ``--matmul``, ``--runner`` or ``--quantization`` outside its
    choices, or a quantization asked of the readable runner."""
    if matmul not in MATMULS:
        raise ValueError(f"matmul {matmul!r}; allowed: {MATMULS}")
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r}; allowed: {RUNNERS}")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r}; allowed: {QUANTIZATIONS}")
    if quantization is not None and runner == "readable":
        raise ValueError(f"quantization={quantization!r} runs on the fast runner; "
                         f"runner='readable' cannot take it")


def engine_runner(net, model: str, matmul: str = "auto", runner: str = "auto",
                  cuda_graphs: bool | None = None, quantization: str | None = None):
    """``(net, runner)`` for ``LLMEngine(net, …, runner=runner)``: the model ``net`` (loaded
    from ``model``; prepacked for oneDNN where that is the matmul) and the engine's runner —
    ``"readable"``, or :func:`~llminfra.runner.fast_runner` on the kernels the choices mean
    here (:func:`resolve_matmul`, :func:`resolve_runner`, :func:`quantized_kernels`).
    ``ValueError`` for a choice the model or the runner cannot take."""
    check_choices(matmul, runner, quantization)
    kind = resolve_matmul(matmul, model) if quantization is None else None
    if matmul == "auto" and kind in ("skinny", "onednn") and not _float32(net):
        kind = "plain"             # both read fp32 weights only: a 16-bit model on F.linear
    if kind == "skinny" and resolve_runner(runner, net) == "readable":
        if matmul == "skinny":
            raise ValueError("matmul='skinny' runs on the fast runner; runner='readable' (or a "
                             "model the fused weights do not take) cannot take it")
        kind = "onednn"
    if kind == "onednn":
        net = prepacked.prepacked(net)
    kernels = skinny_kernels() if kind == "skinny" else quantized_kernels(quantization)
    chosen = "fast" if kernels is not None else resolve_runner(runner, net)
    if chosen == "readable":
        if cuda_graphs:
            raise ValueError("CUDA graphs need the fast runner; the readable runner runs "
                             "eagerly")
        return net, "readable"
    return net, fast_runner(kernels=kernels, cuda_graphs=cuda_graphs)


def _float32(net) -> bool:
    """Whether every floating parameter of ``net`` is float32 (what the C kernels and oneDNN's
    prepacking read; ``matmul='skinny'`` refuses any other by name)."""
    return all(p.dtype == torch.float32 for p in net.parameters() if p.is_floating_point())


def quantized_kernels(quantization: str | None, threads: int | None = None) -> KernelSet | None:
    """The fast runner's kernels for ``--quantization``: None (the model's own weights), or for
    ``"w4a8"`` :func:`~llminfra.runner.kernel_set.w4a8_kernels` (int4 weights, int8
    activations, the course's C kernel, on ``threads`` split by output rows; None: torch's
    thread count, with the C paged decode attention and the one-call step on the same threads;
    ``RuntimeError`` naming the reason where it cannot be built)."""
    if quantization is None:
        return None
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r}; allowed: {QUANTIZATIONS}")
    return w4a8_kernels(threads=threads)


def resolve_runner(runner: str, net) -> str:
    """The model runner ``runner`` means for the model ``net``: ``"auto"`` is ``"fast"`` (the
    fused step: 25 torch calls a layer instead of about 110, the same greedy tokens) wherever
    the fused weights take the model (:func:`llminfra.runner.fused.unsupported`), and
    ``"readable"`` for a mixture of experts or a quantized model. What each runner's step
    costs is recorded beside its torch calls in ``llminfra/data/bench_engine_cpu.json``
    (``python -m llminfra bench engine``): fewer calls buy most where a step's weights are
    few, and little where reading the weights sets the pace."""
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r}; allowed: {RUNNERS}")
    if runner != "auto":
        return runner
    return "readable" if unsupported(net) is not None else "fast"


def resolve_matmul(matmul: str, model: str) -> str:
    """The kernel ``matmul`` means for ``model``: ``"auto"`` is ``"skinny"`` for a real model
    (anything but ``"tiny"``) where this PyTorch has oneDNN's prepacked linear and the
    package's C kernels build (:func:`llminfra.kernels.w4a8.available`): products of one or two
    rows stream the weights through ``f32_skinny.c``, more rows (a decode step of many
    sequences, a prompt chunk) take ``f32_panels.c``'s outer product from weights packed once
    in panels, and the whole decode step is one C call. Without a C compiler it is
    ``"onednn"`` (weights prepacked once for oneDNN, the kernel vLLM's CPU backend uses;
    ``python -m llminfra bench real`` times it against ``F.linear``, the recorded run
    ``llminfra/data/bench_real_cpu.json``), and ``"plain"`` for the tiny model: its weights
    sit in cache, where repacking them on each call costs little, and the course's stored
    tiny-model outputs are ``F.linear``'s."""
    if matmul not in MATMULS:
        raise ValueError(f"matmul {matmul!r}; allowed: {MATMULS}")
    if matmul != "auto":
        return matmul
    if str(model).strip().lower() == "tiny" or not prepacked.available():
        return "plain"
    return "skinny" if w4a8.available() else "onednn"


