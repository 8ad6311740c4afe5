"""The serving engine of chapter 05: requests, sampling, scheduler, engine, metrics.

``LLMEngine(model, tokenizer, ...)`` runs continuous (or static / dynamic) batching on the paged
KV cache of :mod:`llminfra.kvcache`; one :class:`~llminfra.attention.StepMetadata` per step
carries the ragged batch through the model. Modules, one concept each:

* :mod:`.sampling_params` — :class:`SamplingParams`, and the one rule on a request's length
  (prompt + ``max_tokens`` within the context and the KV pool), which the engine and the
  server both apply;
* :mod:`.sequence` — requests, sequences and their state machine; a sequence's text, decoded
  incrementally (a few tokens per step); what a request gives back after each step
  (:class:`RequestOutput`, :class:`CompletionOutput`);
* :mod:`.scheduler_io` — what goes in and out of the scheduler: :class:`SchedulerConfig`,
  :class:`SchedulerOutput`;
* :mod:`.scheduler` — continuous batching, chunked prefill, admission by free blocks,
  preemption; the verbs every other part asks (the one writer of a sequence's fields);
* :mod:`.scheduler_update` — ``update_from_output``, the one writer of a step's result, and
  the stop rules (JSON complete, stop strings, stop tokens, length);
* :mod:`.static_batch` — the static and dynamic baselines (padding rows, worst-case reservation);
* :mod:`.model_runner` — the step on the device: which runner (:func:`make_runner`);
* :mod:`.readable_runner` — the readable forward on the step's metadata;
* :mod:`.fast_runner` — the fused forward, CUDA graphs for decode;
* :mod:`.spec_decode` — speculative decoding: exact verification, the adaptive γ;
* :mod:`.draft_proposers` — who guesses the drafts: prompt lookup, a draft model;
* :mod:`.sampler` — greedy / temperature / top-k / top-p with per-sequence generators; a
  step's tokens from any runner's logits (drafts verified);
* :mod:`.engine` — :class:`LLMEngine`;
* :mod:`.metrics` — timestamps, TTFT / TPOT / latency percentiles, throughput.

The same scheduler against a step-time model (no GPU needed) is :mod:`llminfra.sim`; more than
one engine (the KV handoff, disaggregated prefill/decode, routers) is :mod:`llminfra.cluster`.
Neither is imported here: the engine knows nothing above it.
"""

from llminfra.engine.engine import LLMEngine, default_num_blocks
from llminfra.engine.metrics import RequestMetrics, percentile, summarize
from llminfra.engine.sampling_params import SamplingParams
from llminfra.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from llminfra.engine.sequence import (CompletionOutput, Request, RequestOutput, Sequence,
                                      SequenceStatus)
from llminfra.engine.spec_decode import SpeculativeConfig

__all__ = ["LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics",
           "summarize", "percentile", "Scheduler", "SchedulerConfig", "SchedulerOutput",
           "Request", "Sequence", "SequenceStatus", "default_num_blocks",
           "SpeculativeConfig"]
