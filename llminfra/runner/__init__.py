"""The fast path, above the engine: the runner ``serve`` hands ``LLMEngine``, and what it runs on.

The engine a learner reads (:mod:`llminfra.engine`) runs the readable model; everything here
makes the same step faster from outside, and the tests tie the answers to the readable ones:

* :mod:`.fused` — the model's weights fused (one q/k/v matrix, one gate/up matrix);
* :mod:`.matmul` — the matmuls they are applied through, typed (``F.linear``, oneDNN, the C
  kernels, any ``linear(W) -> f``);
* :mod:`.fast_layer` — the fast decoder layer, written once (the readable block's twin), with
  the cache and the attention brought by its caller;
* :mod:`.fast_step` — one step of the fused model over the paged pool, in few torch calls (the
  readable account of the one-call C step);
* :mod:`.fast_runner` — :class:`FastRunner`: the step's inputs in persistent buffers, CUDA
  graphs per batch bucket; :func:`fast_runner` is what ``LLMEngine(runner=…)`` takes;
* :mod:`.fast_decode` — :class:`FastDecoder`, the same layer for one sequence on its own dense
  cache (benchmarks, speculative drafts);
* :mod:`.prepacked` — oneDNN's prepacked weights, the kernel vLLM's CPU backend uses;
* :mod:`.decode_stack` — the whole decode step in one call of the C library;
* :mod:`.kernel_set` — :class:`KernelSet`: matmul, attention and whole step as one object;
* :mod:`.kernel_choice` — which kernels this machine gets (``serve``'s ``--matmul``,
  ``--runner``, ``--quantization``);
* :mod:`.ladder` — chapter 12's rung: a matrix-vector product's floor, the blocked reference,
  the C-excerpt helper and the decode-step timers.

The C library itself is :mod:`llminfra.kernels`. Chapter 12.
"""

from llminfra.runner.fast_decode import FastDecoder
from llminfra.runner.fast_runner import FastRunner, fast_runner, graph_buckets, runner_for
from llminfra.runner.kernel_set import KernelSet, skinny_kernels, w4a8_kernels

__all__ = ["FastDecoder", "FastRunner", "fast_runner", "graph_buckets", "runner_for", "KernelSet",
           "skinny_kernels", "w4a8_kernels"]
