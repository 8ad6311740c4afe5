"""The roofline model of LLM inference: one step's time from its FLOPs and bytes.

A step (one forward pass over a batch) cannot run faster than its arithmetic at the device's
peak or its memory traffic at the device's bandwidth (Williams, Waterman & Patterson, 2009,
"Roofline: an insightful visual performance model", CACM 52(4)):

    t_step = max(FLOPs / peak_flops_per_s, bytes / bytes_per_s) + overhead_s (+ t_allreduce)

FLOPs and bytes come from :func:`llminfra.calc.step.step_flops` / ``step_bytes`` (weights read
once per step, each sequence's KV cache read, the new tokens' KV written; 2·params FLOPs per new
token plus causal attention). Arithmetic intensity ``I = FLOPs / bytes``; attainable FLOP/s
``min(peak, I · bandwidth)``; the ridge point ``peak / bandwidth`` separates memory-bound
(decode) from compute-bound (prefill) steps.

With ``tensor_parallel = n`` (Megatron, Shoeybi et al., 2019, arXiv:1909.08053, §3) each rank
does ``1/n`` of the FLOPs and reads ``1/n`` of the weights and of the KV heads, and the step adds
``2 · L`` ring all-reduces of ``tokens · h`` activations
(:func:`llminfra.calc.communication.ring_allreduce_time_s`).

Every bound of this module (decode and prefill bounds, TTFT, time per output token, tokens/s)
and the serving simulator's step time are :func:`step_time_s`. Taught in chapter 08.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from llminfra.calc.communication import (Interconnect, get_interconnect,
                                         ring_allreduce_time_s)
from llminfra.calc.kv_layout import kv_share_per_rank
from llminfra.calc.memory import _compute_dtype
from llminfra.calc.step import step_bytes, step_flops, weight_bytes_read
from llminfra.specs.formats import dtype_bytes
from llminfra.specs.gpus import GPUSpec, get_gpu, gpu_names
from llminfra.specs.models import ModelSpec, get_model
from llminfra.validate import non_negative_finite, positive_finite, positive_int


@dataclass(frozen=True)
class Roofline:
    """A device as the roofline sees it: ``peak_flops_per_s`` and memory ``bytes_per_s``
    (a catalog GPU via :func:`device_roofline`, or a CPU measured by
    :func:`llminfra.bench.roofline.measure_cpu_roofline`)."""

    name: str
    peak_flops_per_s: float
    bytes_per_s: float
    source: str = ""

    def __post_init__(self):
        for field in ("peak_flops_per_s", "bytes_per_s"):   # finite: an infinite peak makes
            positive_finite(field, getattr(self, field),     # every step free
                            where=f"Roofline {self.name!r}: ")

    @property
    def ridge_flops_per_byte(self) -> float:
        """``peak / bandwidth``: below this intensity a step waits on memory."""
        return self.peak_flops_per_s / self.bytes_per_s

    def attainable_flops_per_s(self, flops_per_byte: float) -> float:
        """``min(peak, I · bandwidth)`` (Williams et al., 2009, eq. 1)."""
        if not flops_per_byte >= 0:
            raise ValueError(f"flops_per_byte must be >= 0, got {flops_per_byte!r}")
        return min(self.peak_flops_per_s, flops_per_byte * self.bytes_per_s)


def device_roofline(device: str | GPUSpec | Roofline, dtype: str = "bf16") -> Roofline:
    """The roofline of ``device`` for matmuls in ``dtype``'s compute dtype: the catalog's dense
    tensor peak (``fp32``: the non-tensor fp32 peak; quantized weights: the bf16 peak, as
    weight-only kernels multiply in 16 bits) and its memory bandwidth. A :class:`Roofline` is
    returned as is. ``ValueError`` if the catalog has no such peak."""
    if isinstance(device, Roofline):
        return device
    g = get_gpu(device)
    compute = _compute_dtype(dtype)
    tflops = g.fp32_tflops if compute == "fp32" else g.tflops(compute)
    if not tflops:
        known = sorted(d for d, row in g.peak_tflops.items() if row["dense"])
        raise ValueError(f"the catalog has no dense {compute!r} peak for {g.name}; dtypes with a "
                         f"peak there: {', '.join(known) or 'none'}")
    return Roofline(g.name, tflops * 1e12, g.hbm_bytes_per_s,
                    f"llminfra.specs GPU catalog [{g.confidence}]: {g.source}")


#: PCIe x16 bandwidth per direction by generation, GB/s: transfer rate (GT/s) · 16 lanes ·
#: 128/130 encoding / 8 bits (PCI-SIG, PCI Express Base Specification 3.0-5.0)
PCIE_X16_GB_PER_S = {3: 8 * 16 * 128 / 130 / 8, 4: 16 * 16 * 128 / 130 / 8,
                     5: 32 * 16 * 128 / 130 / 8}


def default_interconnect(device: str | GPUSpec, n_gpus: int = 2) -> Interconnect:
    """The link ``n_gpus``-way tensor parallelism uses on ``device``, per direction: NVLink when
    the catalog lists a bandwidth for it (an NVLink *bridge* of PCIe cards joins 2 GPUs, or
    the 2 or 4 its text names, so more ranks fall back to PCIe), else one Infinity Fabric link
    (MI300X), else PCIe (the catalog's figure, or :data:`PCIE_X16_GB_PER_S` for its
    generation). Catalog figures are totals of both directions and are halved. ``ValueError`` when the catalog names no link."""
    g = get_gpu(device)
    text = g.interconnect or ""
    source = f"llminfra.specs GPU catalog, {g.name}: {text!r}"
    for label, pattern in (("NVLink", r"NVLink[^:;]*?:? (\d+(?:\.\d+)?) GB/s"),
                           ("Infinity Fabric link", r"Infinity Fabric: \d+ links x (\d+) GB/s"),
                           ("PCIe", r"PCIe Gen\d(?: x16)? (\d+(?:\.\d+)?) GB/s")):
        m = re.search(pattern, text)
        if m and label == "NVLink" and "bridge" in m.group(0):
            ways = 4 if "4-way" in text else 2
            if n_gpus > ways:
                continue
        if m:
            return Interconnect(f"{label} ({g.name})", float(m.group(1)) * 1e9 / 2,
                                source + " (total of both directions, halved)")
    m = re.search(r"PCIe Gen(\d)", text)
    if m and int(m.group(1)) in PCIE_X16_GB_PER_S:
        gen = int(m.group(1))
        return Interconnect(f"PCIe Gen{gen} x16 ({g.name})", PCIE_X16_GB_PER_S[gen] * 1e9,
                            source + "; rate per direction from the PCIe generation (PCI-SIG)")
    raise ValueError(f"the catalog lists no NVLink / PCIe bandwidth for {g.name} ({text!r}); "
                     "pass interconnect=")


def step_breakdown(model: str | ModelSpec, device: str | GPUSpec | Roofline, batch, *,
                   dtype: str = "bf16", kv_dtype: str | None = None, tensor_parallel: int = 1,
                   overhead_s: float = 0.0, interconnect: str | Interconnect | None = None,
                   latency_s: float = 0.0,
                   whole_input_embedding: bool = True, logits: str = "every") -> dict:
    """The roofline time of one step over ``batch`` (``(new_tokens, context_tokens)`` pairs),
    with its parts: ``flops``, ``bytes`` (whole model), ``compute_s`` = FLOPs / (n · peak),
    ``memory_s`` = bytes per rank / bandwidth, ``comm_s`` (0 for one rank), ``overhead_s``,
    ``bound`` (``"compute"`` or ``"memory"``), ``time_s``.

    Per rank of ``n = tensor_parallel``: weights read / n (a mixture-of-experts reads only the
    routed experts, :func:`llminfra.calc.step.weight_bytes_read`), KV bytes · ceil(H_kv / n) /
    H_kv (KV heads are split, and replicated when there are fewer heads than ranks, as vLLM
    does; a latent-attention cache is whole on every rank). The
    all-reduces run over ``interconnect`` (default :func:`default_interconnect`) with
    ``latency_s`` per ring step. ``whole_input_embedding``: count the input-embedding table
    whole (True, the default of every bound here: chapter 08's model, every weight read once
    per step, which its exercise follows) or only the rows the step's tokens look up (False,
    what a step does read, as :func:`llminfra.calc.step.step_bytes` counts by default: 1.9 %
    fewer bytes for Llama-2-7B, 9 % for Qwen3-30B-A3B per decode token). ``logits``: which new
    tokens go through the output layer (:func:`llminfra.calc.step.step_flops`): ``"every"``
    (the default) or ``"last"``, a serving engine's prefill, which needs one row of logits.
    """
    spec = get_model(model)
    roof = device_roofline(device, dtype)
    n = positive_int("tensor_parallel", tensor_parallel)
    non_negative_finite("overhead_s", overhead_s)
    non_negative_finite("latency_s", latency_s)
    if kv_dtype is None:
        kv_dtype = _compute_dtype(dtype)
    flops = step_flops(spec, batch, logits)
    total = step_bytes(spec, batch, dtype, kv_dtype, whole_input_embedding)
    weights = weight_bytes_read(spec, dtype, sum(new for new, _ in batch),
                                whole_input_embedding=whole_input_embedding)
    kv = total - weights  # read and written KV of every sequence
    per_rank = weights / n + kv * float(kv_share_per_rank(spec, n))
    compute_s = flops / (n * roof.peak_flops_per_s)
    memory_s = per_rank / roof.bytes_per_s
    comm_s = 0.0
    if n > 1:
        if interconnect is None:
            if isinstance(device, Roofline):
                raise ValueError("tensor_parallel > 1 on a Roofline device needs interconnect=")
            link = default_interconnect(device, n)
        else:
            link = get_interconnect(interconnect)
        tokens = sum(new for new, _ in batch)
        per_allreduce = tokens * spec.hidden_size * dtype_bytes(_compute_dtype(dtype))
        comm_s = 2 * spec.num_layers * ring_allreduce_time_s(per_allreduce, n, link.bytes_per_s,
                                                             latency_s)
    time_s = max(compute_s, memory_s) + comm_s + overhead_s
    if not math.isfinite(time_s):
        raise ValueError(f"the step time overflows: it passes the largest float (about "
                         f"1.8e308) for {spec.name} on {roof.name}; the batch or the device is "
                         f"out of range")
    return {"flops": flops, "bytes": total, "bytes_per_rank": per_rank,
            "compute_s": compute_s, "memory_s": memory_s, "comm_s": comm_s,
            "overhead_s": overhead_s, "bound": "compute" if compute_s > memory_s else "memory",
            "time_s": time_s,
            "device": roof.name, "tensor_parallel": n}


def step_time_s(model: str | ModelSpec, device: str | GPUSpec | Roofline, batch, *,
                dtype: str = "bf16", kv_dtype: str | None = None, tensor_parallel: int = 1,
                overhead_s: float = 0.0, interconnect: str | Interconnect | None = None,
                latency_s: float = 0.0,
                whole_input_embedding: bool = True, logits: str = "every") -> float:
    """Seconds of one step: ``max(FLOPs / peak, bytes / bandwidth) + overhead_s`` (+ the
    tensor-parallel all-reduces); see :func:`step_breakdown`.

    Llama-2-7B on an A100-80GB (2,039 GB/s), bf16, one decode step at context 1: bytes
    13,477,355,520 / 2.039e12 = 6.610 ms; FLOPs 13,477,355,520 / 312e12 = 0.0432 ms -> 6.610 ms.
    """
    return step_breakdown(model, device, batch, dtype=dtype, kv_dtype=kv_dtype,
                          tensor_parallel=tensor_parallel, overhead_s=overhead_s,
                          interconnect=interconnect, latency_s=latency_s,
                          whole_input_embedding=whole_input_embedding, logits=logits)["time_s"]


def decode_batch(batch: int = 1, context: int = 2048) -> list[tuple[int, int]]:
    """``batch`` sequences each adding one token at ``context`` tokens: ``[(1, context)] · B``."""
    return [(1, context)] * positive_int("batch", batch)


def prefill_batch(prompt_len: int, batch: int = 1) -> list[tuple[int, int]]:
    """``batch`` whole prompts of ``prompt_len`` tokens: ``[(prompt_len, prompt_len)] · B``."""
    return [(prompt_len, prompt_len)] * positive_int("batch", batch)


def arithmetic_intensity(model: str | ModelSpec, batch, dtype: str = "bf16",
                         kv_dtype: str | None = None, whole_input_embedding: bool = True) -> float:
    """FLOPs per byte of one step of the whole model over ``batch`` pairs:
    ``step_flops / step_bytes`` (``whole_input_embedding`` as in :func:`step_breakdown`).
    Llama-2-7B bf16 decode at batch 1, context 1: exactly 1.0 (1.0198 with only the one
    embedding row read)."""
    return step_flops(model, batch) / step_bytes(model, batch, dtype, kv_dtype,
                                                 whole_input_embedding)


def layer_point(model: str | ModelSpec, batch, dtype: str = "bf16",
                kv_dtype: str | None = None) -> dict:
    """One transformer block's share of a step: ``flops``, ``bytes`` and ``intensity``.

    Computed with the same accounting as the whole model: the step of the model with two
    blocks minus the step of the same model with one (what one more block adds). A block
    of Llama-2-7B in bf16 at batch 1, context 1: 4·4096² + 3·4096·11008 + 2·4096 = 202,383,360
    weights -> 404,766,720 FLOPs + 4·32·128 attention = 404,783,104; bytes 404,766,720 +
    2·32·128·2 = 404,783,104: intensity 1.0.
    """
    spec = get_model(model)
    # a DeepSeek block is the typical MoE one (its first_dense_layers are dense)
    one, two = (replace(spec, num_layers=n, first_dense_layers=0) for n in (1, 2))
    flops = step_flops(two, batch) - step_flops(one, batch)
    nbytes = step_bytes(two, batch, dtype, kv_dtype) - step_bytes(one, batch, dtype, kv_dtype)
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes}


def decode_time_per_token_s(model: str | ModelSpec, device, batch: int = 1,
                            context: int = 2048, **kwargs) -> float:
    """Time-per-output-token bound: one decode step of ``batch`` sequences at ``context``
    (:func:`step_time_s`; every sequence gets one token per step). At batch 1 this is about
    ``weight_bytes / bandwidth`` — Llama-2-7B bf16 on an H100 (3.35 TB/s): ~4 ms."""
    return step_time_s(model, device, decode_batch(batch, context), **kwargs)


def prefill_time_s(model: str | ModelSpec, device, prompt_len: int, batch: int = 1,
                   **kwargs) -> float:
    """Prefill bound: one step over ``batch`` whole prompts (:func:`step_time_s`), mostly
    ``FLOPs / peak`` for prompts longer than the ridge point in tokens."""
    return step_time_s(model, device, prefill_batch(prompt_len, batch), **kwargs)


def ttft_s(model: str | ModelSpec, device, prompt_len: int, batch: int = 1, **kwargs) -> float:
    """Time-to-first-token estimate on an idle server: the prefill step, whose last position's
    logits give the first token (no queueing, no network). Equal to :func:`prefill_time_s`."""
    return prefill_time_s(model, device, prompt_len, batch, **kwargs)


def decode_tokens_per_s(model: str | ModelSpec, device, batch: int = 1, context: int = 2048,
                        **kwargs) -> float:
    """Upper bound of generated tokens per second: ``batch / decode_time_per_token_s``."""
    return batch / decode_time_per_token_s(model, device, batch, context, **kwargs)


def catalog_table(model: str | ModelSpec, batch: int = 1, context: int = 2048,
                  dtype: str = "bf16", prompt_len: int = 2048) -> list[dict]:
    """For every catalog GPU with a peak for ``dtype``: ``gpu``, ``peak_tflops``,
    ``bandwidth_gb_per_s``, ``ridge_flops_per_byte``, the decode step's ``intensity`` and
    ``attainable_tflops`` (``min(peak, I · bandwidth)``), ``tpot_ms``, ``tokens_per_s`` (decode
    of ``batch`` at ``context``), ``ttft_ms`` (prefill of one ``prompt_len`` prompt),
    ``confidence``. GPUs without a ``dtype`` peak in the catalog are skipped."""
    rows = []
    pairs = decode_batch(batch, context)
    intensity = arithmetic_intensity(model, pairs, dtype)
    for name in gpu_names():
        try:
            roof = device_roofline(name, dtype)
        except ValueError:
            continue
        tpot = step_time_s(model, roof, pairs, dtype=dtype)
        rows.append({"gpu": name, "peak_tflops": roof.peak_flops_per_s / 1e12,
                     "bandwidth_gb_per_s": roof.bytes_per_s / 1e9,
                     "ridge_flops_per_byte": roof.ridge_flops_per_byte,
                     "intensity": intensity,
                     "attainable_tflops": roof.attainable_flops_per_s(intensity) / 1e12,
                     "tpot_ms": tpot * 1e3, "tokens_per_s": batch / tpot,
                     "ttft_ms": prefill_time_s(model, roof, prompt_len, dtype=dtype) * 1e3,
                     "confidence": get_gpu(name).confidence})
    return rows
