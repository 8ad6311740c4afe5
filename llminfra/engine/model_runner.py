"""The model runner: one scheduled step in, the logits of every caught-up sequence out.

:class:`~llminfra.engine.engine.LLMEngine` decides *what* runs (the scheduler); the runner
runs it on the device — the split of vLLM's ``GPUModelRunner`` and nano-vllm's
``ModelRunner`` — and the engine samples the tokens from its logits
(:func:`~llminfra.engine.sampler.sample_step`, the same for every runner)::

    SchedulerOutput ─▶ step inputs (device tensors) ─▶ forward ─▶ logits ─▶ sample ─▶ tokens

Two runners, the same answers (the tests tie them), each in a module of its own:

* :class:`~llminfra.engine.readable_runner.ReadableRunner` — the teaching path:
  ``cache.prepare_step`` builds the step's :class:`~llminfra.attention.StepMetadata` and the
  readable :class:`~llminfra.model.Transformer` runs it, layer by layer, as chapter 05 draws
  it. About 110 torch calls a layer.
* :class:`~llminfra.engine.fast_runner.FastRunner` — the same weights fused from outside
  (:mod:`llminfra.model.fused`) and one step of :mod:`llminfra.model.fast_step`: 25 calls a
  layer. The step's inputs (tokens, positions, slots, block tables) are built on the host in
  one array and copied into one persistent device buffer per step. With ``cuda_graphs`` a
  decode step runs from a CUDA graph captured once per batch-size bucket (1, 2, 4, 8, then
  every 16 up to ``max_num_seqs``): the batch is padded to its bucket (padding lanes write and
  read the cache's scratch block) and the graph replays the whole step as one launch. On a CPU
  ``cuda_graphs="emulate"`` takes the same path — the same buffers, the same padded function
  call, without a graph — so the tests check every bucket's tokens against the eager step
  where no GPU is.

Chapter 05 (the engine) and chapter 08 (why a GPU decode step needs graphs).
"""

from __future__ import annotations

from llminfra.engine.fast_runner import FastRunner, graph_buckets  # noqa: F401 - re-exported
from llminfra.engine.readable_runner import PAD_TOKEN_ID, ReadableRunner  # noqa: F401

#: ``runner`` choices of :func:`make_runner`
RUNNERS = ("readable", "fast")


def make_runner(runner: str, model, cache, device, *, max_num_seqs: int = 64, cuda_graphs=None,
                linear=None):
    """``"readable"`` or ``"fast"`` (:data:`RUNNERS`). ``linear`` (fast runner only): a
    ``linear(W) -> f`` applied to each fused matrix and the output matrix — e.g.
    :func:`llminfra.quant.w4a8.w4a8_linear`, int4 weights on the w4a8 kernel for any batch
    (``llminfra serve --quantization w4a8``); None: the model's own kind of matmul.
    ``ValueError`` for another name, or for a model the fast runner cannot take (its message
    says why)."""
    if runner == "readable":
        if cuda_graphs:
            raise ValueError("CUDA graphs need runner='fast'; the readable runner runs eagerly")
        if linear is not None:
            raise ValueError("a linear for the fused matrices needs runner='fast' (the fused "
                             "weights are what it applies to)")
        return ReadableRunner(model, cache, device)
    if runner == "fast":
        return FastRunner(model, cache, device, max_num_seqs=max_num_seqs,
                          cuda_graphs=cuda_graphs, linear=linear)
    raise ValueError(f"runner {runner!r}; allowed: {RUNNERS}")
