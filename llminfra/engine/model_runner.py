"""The model runner: one scheduled step in, the logits of every caught-up sequence out.

:class:`~llminfra.engine.engine.LLMEngine` decides *what* runs (the scheduler); the runner
runs it on the device — the split of vLLM's ``GPUModelRunner`` and nano-vllm's
``ModelRunner`` — and the engine samples the tokens from its logits
(:func:`~llminfra.engine.sampler.sample_step`, the same for every runner)::

    SchedulerOutput ─▶ step inputs (device tensors) ─▶ forward ─▶ logits ─▶ sample ─▶ tokens

A runner is any object with ``forward(scheduled, padding, caught) -> logits`` (and a ``name``).
The engine's own is :class:`~llminfra.engine.readable_runner.ReadableRunner`, the teaching path:
``cache.prepare_step`` builds the step's :class:`~llminfra.attention.StepMetadata` and the
readable :class:`~llminfra.model.Transformer` runs it, layer by layer, as chapter 05 draws it.

A faster runner comes from outside, as a factory ``(model, cache, device, *, max_num_seqs) ->
runner``: :func:`llminfra.runner.fast_runner` (fused weights, the C kernels, CUDA graphs; chapter
12) is one. The engine imports nothing of it — speed is applied to the engine from outside,
the way gpt-fast applies it to its model — and the tests tie the two runners' answers.
"""

from __future__ import annotations

from llminfra.engine.readable_runner import PAD_TOKEN_ID, ReadableRunner  # noqa: F401

#: the runner the engine names itself; any other comes as a factory
RUNNERS = ("readable",)


def make_runner(runner, model, cache, device, *, max_num_seqs: int = 64):
    """The runner ``runner`` says: ``"readable"`` (:class:`ReadableRunner`) or a factory
    ``runner(model, cache, device, max_num_seqs=…)`` (e.g. :func:`llminfra.runner.fast_runner`).
    ``ValueError`` for any other value (the fast runner by name: it lives in
    :mod:`llminfra.runner`)."""
    if runner == "readable":
        return ReadableRunner(model, cache, device)
    if callable(runner):
        return runner(model, cache, device, max_num_seqs=max_num_seqs)
    if runner == "fast":
        raise ValueError("runner='fast': the fast runner lives outside the engine; pass "
                         "runner=llminfra.runner.fast_runner(...) (its kernels, CUDA graphs)")
    raise ValueError(f"runner {runner!r}; allowed: 'readable' or a runner factory such as "
                     "llminfra.runner.fast_runner()")
