"""The common mistakes of source 000's checklist section, as rules over a draft plan.

A :class:`DraftPlan` is what someone writes down before deploying: the model and GPUs, how much
memory they counted, the speed-up they expect, the batch, the pipeline, the utilisation.
:func:`find_mistakes` returns the codes of :data:`MISTAKES` the draft makes, each decided by the
course's own models. Taught in chapter 10 (exercise 10.2 writes it again).
"""

from __future__ import annotations

from dataclasses import dataclass

from llminfra.calc.memory import DEFAULT_RESERVE_FRACTION, kv_bytes_per_token, weight_bytes
from llminfra.calc.roofline import decode_time_per_token_s, ttft_s
from llminfra.parallel.pipeline import bubble_fraction
from llminfra.specs import get_gpu

#: code -> what the mistake is (source 000, "checklist and common mistakes")
MISTAKES = {
    "weights_only": "counted only the weights: the KV cache of the expected load does not fit",
    "headline_factor": "expects a benchmark's headline speed-up on its own set-up",
    "throughput_over_ttft": "raised the batch for throughput until TTFT or TPOT misses its target",
    "naive_pipeline": "a pipeline without micro-batches leaves most GPU time idle",
    "low_utilization": "GPUs held for a load that keeps them mostly idle",
}


@dataclass(frozen=True)
class DraftPlan:
    """A plan as written before deploying.

    ``model``, ``dtype``, ``gpu``, ``n_gpus`` (tensor-parallel GPUs of one replica);
    ``context_tokens`` and ``concurrency`` the load it must hold; ``memory_counted_bytes`` what
    the author budgeted; ``expected_speedup`` the factor they expect from a new engine and
    ``measured_speedup`` what a run on their own set-up gave (None if not measured);
    ``batch``, ``prompt_tokens``, ``ttft_target_s``, ``tpot_target_s``;
    ``pipeline_stages`` and ``micro_batches``; ``utilization`` the share of time the GPUs work.
    """

    model: str
    gpu: str
    n_gpus: int = 1
    dtype: str = "bf16"
    context_tokens: int = 4096
    concurrency: int = 1
    memory_counted_bytes: float = 0.0
    expected_speedup: float = 1.0
    measured_speedup: float | None = None
    batch: int = 1
    prompt_tokens: int = 1024
    ttft_target_s: float = 2.0
    tpot_target_s: float = 0.1
    pipeline_stages: int = 1
    micro_batches: int = 1
    utilization: float = 0.5


def find_mistakes(d: DraftPlan) -> set[str]:
    """The codes of :data:`MISTAKES` that ``d`` makes:

    * ``weights_only`` — weights + ``concurrency · context · KV bytes/token`` exceed the usable
      memory of ``n_gpus`` (10 % held back), although the weights alone fit;
    * ``headline_factor`` — ``expected_speedup`` above ``measured_speedup`` (or above 1 when
      nothing was measured);
    * ``throughput_over_ttft`` — at ``batch`` the roofline's TTFT of ``batch`` prompts or its
      time per output token misses the target;
    * ``naive_pipeline`` — ``pipeline_stages > 1`` and a bubble (p − 1)/(m + p − 1) ≥ 50 %;
    * ``low_utilization`` — ``utilization < 0.3``.
    """
    if not isinstance(d, DraftPlan):
        raise ValueError(f"find_mistakes wants a DraftPlan, got {type(d).__name__}")
    found = set()
    usable = get_gpu(d.gpu).memory_bytes * d.n_gpus * (1 - DEFAULT_RESERVE_FRACTION)
    w = weight_bytes(d.model, d.dtype)
    kv = d.concurrency * d.context_tokens * kv_bytes_per_token(d.model, "bf16")
    if w <= usable < w + kv:
        found.add("weights_only")
    if d.expected_speedup > (d.measured_speedup if d.measured_speedup is not None else 1.0):
        found.add("headline_factor")
    kw = {"dtype": d.dtype, "tensor_parallel": d.n_gpus}
    if (ttft_s(d.model, d.gpu, d.prompt_tokens, d.batch, **kw) > d.ttft_target_s
            or decode_time_per_token_s(d.model, d.gpu, d.batch, d.context_tokens, **kw)
            > d.tpot_target_s):
        found.add("throughput_over_ttft")
    if d.pipeline_stages > 1 and bubble_fraction(d.pipeline_stages, d.micro_batches) >= 0.5:
        found.add("naive_pipeline")
    if d.utilization < 0.3:
        found.add("low_utilization")
    return found


def describe(codes: set[str]) -> list[str]:
    """The sentences of :data:`MISTAKES` for ``codes``, in a fixed order."""
    return [MISTAKES[c] for c in MISTAKES if c in codes]


__all__ = ["MISTAKES", "DraftPlan", "describe", "find_mistakes"]
