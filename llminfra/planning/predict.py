"""The planner's TTFT and TPOT: roofline bounds turned into what vLLM reaches, by efficiencies
fitted to NVIDIA AIConfigurator's estimates (``llminfra/data/planner_efficiency.json``).

A step's roofline time (chapter 08, :func:`llminfra.calc.roofline.step_breakdown`) has two parts
here: the arithmetic or memory traffic on each GPU, ``t_roof = max(FLOPs / peak, bytes /
bandwidth)`` per rank, and the tensor-parallel all-reduces, ``t_comm = 2L · (2(n-1)/n · bytes /
(β · B) + 2(n-1) · α)`` (ring all-reduce, :func:`llminfra.calc.communication.ring_allreduce_time_s`).
An engine reaches a share ``e`` of the first and pays the second with the link's reached share
of bandwidth ``β`` and a latency ``α`` per ring step, which the bound leaves at 1 and 0:

    TTFT = t_roof(prefill of batch prompts) / e_prefill(prefill tokens) + t_comm(prefill)
    TPOT = t_roof(decode step of batch sequences) / e_decode(batch)    + t_comm(decode)

``e_prefill`` depends on how many tokens the prefill multiplies at once (``batch · input
tokens``: a short prompt's matmuls are too small to reach the peak), ``e_decode`` on the batch;
both per GPU and tensor-parallel size, for dense and mixture-of-experts models apart
(:func:`architecture`); ``α``, ``β`` per GPU's link, phase (a prefill's all-reduces are large,
a decode step's small) and tensor-parallel size, ``β`` also by the all-reduce's size
(:func:`allreduce_values`, linear in its log between :data:`ALLREDUCE_KNOTS`): the best size's
share times a factor in (0, 1] (:func:`link_share`), since an all-reduce's time is not linear in
its bytes (small ones reach less of a link, and over PCIe AIConfigurator finds some larger ones
reaching less again). All are fitted (:mod:`.efficiency_fit`) on part of
``compare_planner.json`` and checked on the points held back from the fit; a GPU outside the
fit gets the median over the fitted GPUs, an extrapolation. The decode step is taken at the
mean context of the output, ``input + output / 2`` tokens. Taught in chapter 10.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from llminfra.calc.communication import Interconnect
from llminfra.calc.roofline import (decode_batch, default_interconnect, prefill_batch,
                                    step_breakdown)
from llminfra.specs import get_gpu, get_model
from llminfra.validate import positive_int

EFFICIENCY_PATH = Path(__file__).resolve().parents[1] / "data" / "planner_efficiency.json"
#: the kinds of model with efficiencies of their own: a mixture of experts multiplies each token
#: by its routed experts' small matrices, which reach less of the peak than a dense model's
ARCHITECTURES = ("dense", "moe")
#: all-reduce sizes (values summed: tokens × hidden size) at which the link's share is fitted,
#: one an octave, from a decode step of one sequence to a prefill of many long prompts
ALLREDUCE_KNOTS = tuple(2 ** k for k in range(11, 31))


def architecture(model: str) -> str:
    """``"moe"`` for a mixture-of-experts model (more than one expert), else ``"dense"``."""
    return "moe" if get_model(model).num_experts > 1 else "dense"


@functools.lru_cache(maxsize=4)
def load_efficiencies(path: str | Path = EFFICIENCY_PATH) -> dict:
    """The fitted efficiencies (a JSON file written by ``make compare-planner``)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def interpolate(knots: list[float], values: list[float], x: float) -> float:
    """``values`` at ``x``, linear in ``log x`` between ``knots`` (ascending), held at the
    first / last value outside them."""
    if x <= knots[0]:
        return values[0]
    for (x0, y0), (x1, y1) in zip(zip(knots, values), zip(knots[1:], values[1:])):
        if x <= x1:
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + w * (y1 - y0)
    return values[-1]


def allreduce_values(model: str, tokens: int) -> int:
    """The values one of ``model``'s all-reduces sums for a step over ``tokens`` new tokens:
    one activation of ``hidden_size`` per token."""
    return tokens * get_model(model).hidden_size


def link_share(p: dict, phase: str, tensor_parallel: int, values: int) -> float:
    """The share of its link's bandwidth an all-reduce of ``values`` reaches, from a GPU's
    fitted parameters ``p``: the best size's share times this size's factor."""
    tp, factor = str(tensor_parallel), p["link_size_factor"]
    return (p["link_bandwidth_share"][phase][tp]
            * interpolate(factor["values"], factor[phase][tp], values))


def gpu_parameters(gpu: str, table: dict) -> dict:
    """The fitted parameters of ``gpu`` (its own, or the fallback for GPUs outside the fit)."""
    return table["gpus"].get(get_gpu(gpu).name, table["fallback"])


def step_parts(model: str, gpu: str, pairs, *, tensor_parallel: int, dtype: str,
               link_share: float = 1.0, link_latency_s: float = 0.0,
               logits: str = "every") -> tuple[float, float]:
    """``(t_roof, t_comm)`` of one step over ``pairs`` (``(new, context)`` per sequence): the
    per-rank arithmetic-or-memory time and the all-reduces over the GPU's own link at
    ``link_share`` of its bandwidth, ``link_latency_s`` per ring step."""
    link = None
    if tensor_parallel > 1:
        base = default_interconnect(gpu, tensor_parallel)
        link = Interconnect(base.name, base.bytes_per_s * link_share, base.source)
    b = step_breakdown(model, gpu, pairs, dtype=dtype, tensor_parallel=tensor_parallel,
                       interconnect=link, latency_s=link_latency_s, logits=logits)
    return max(b["compute_s"], b["memory_s"]), b["comm_s"]


def _check(model: str, gpu: str, tensor_parallel, batch, input_tokens, output_tokens,
           table: dict) -> None:
    get_model(model)                                   # KeyError naming the known models
    get_gpu(gpu)                                       # KeyError naming the known GPUs
    tps = table["tensor_parallel_sizes"]
    if isinstance(tensor_parallel, bool) or tensor_parallel not in tps:
        raise ValueError(f"tensor_parallel must be one of {tps} (the sizes the efficiencies "
                         f"were fitted on), got {tensor_parallel!r}")
    for name, v in (("batch", batch), ("input_tokens", input_tokens),
                    ("output_tokens", output_tokens)):
        positive_int(name, v)


def predict_latency(model: str, gpu: str, *, tensor_parallel: int, batch: int,
                    input_tokens: int, output_tokens: int, dtype: str = "bf16",
                    efficiencies: dict | None = None) -> dict:
    """TTFT and TPOT of ``batch`` requests of ``input_tokens`` → ``output_tokens`` served
    together by vLLM on ``tensor_parallel`` × ``gpu`` (names of :mod:`llminfra.specs`), as the
    module docstring computes them: ``{"ttft_s", "tpot_s"}``, plus the plain roofline bounds
    (``ttft_bound_s``, ``tpot_bound_s``) and the efficiencies used (``prefill_efficiency``,
    ``decode_efficiency``). ``efficiencies``: a fitted table (default
    :func:`load_efficiencies`). ``KeyError`` for an unknown model or GPU, ``ValueError`` for a
    tensor-parallel size outside the fit or a count that is not a positive integer."""
    table = load_efficiencies() if efficiencies is None else efficiencies
    _check(model, gpu, tensor_parallel, batch, input_tokens, output_tokens, table)
    p = gpu_parameters(gpu, table)
    e = p.get(architecture(model), table["fallback"][architecture(model)])
    kw = {"tensor_parallel": tensor_parallel, "dtype": dtype}
    tp = str(tensor_parallel)
    link = {ph: {"link_share": link_share(p, ph, tensor_parallel, allreduce_values(model, n)),
                 "link_latency_s": p["link_latency_s"][ph][tp]} if tensor_parallel > 1 else {}
            for ph, n in (("prefill", batch * input_tokens), ("decode", batch))}
    pre = prefill_batch(input_tokens, batch)
    dec = decode_batch(batch, input_tokens + output_tokens // 2)
    roof_pre, comm_pre = step_parts(model, gpu, pre, logits="last", **kw, **link["prefill"])
    roof_dec, comm_dec = step_parts(model, gpu, dec, **kw, **link["decode"])
    e_pre = interpolate(e["prefill"]["tokens"], e["prefill"]["efficiency"][tp],
                        batch * input_tokens)
    e_dec = interpolate(e["decode"]["batch"], e["decode"]["efficiency"][tp], batch)
    return {"ttft_s": roof_pre / e_pre + comm_pre, "tpot_s": roof_dec / e_dec + comm_dec,
            "ttft_bound_s": sum(step_parts(model, gpu, pre, logits="last", **kw)),
            "tpot_bound_s": sum(step_parts(model, gpu, dec, **kw)),
            "prefill_efficiency": e_pre, "decode_efficiency": e_dec}


__all__ = ["ALLREDUCE_KNOTS", "ARCHITECTURES", "EFFICIENCY_PATH", "allreduce_values",
           "architecture", "interpolate", "link_share", "load_efficiencies", "predict_latency",
           "step_parts"]
