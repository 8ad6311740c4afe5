"""Communication model of tensor parallelism: bytes per all-reduce, ring time, share of a step.

Rules (worked by hand in ``tests/test_communication.py``):

* Megatron tensor parallelism (Shoeybi et al., 2019, arXiv:1909.08053, §3) does TWO all-reduces
  per transformer layer in the forward pass (after the attention output projection and after the
  MLP down projection), each of the ``tokens × hidden`` activations:
  ``bytes = tokens · h · bytes(dtype)``; prefill: ``tokens = batch · prompt_len``;
  decode: ``tokens = batch`` (one new token per sequence).
  Llama-2-70B (h = 8192), bf16, decode at batch 1: 8192 · 2 = 16,384 B per all-reduce.
* Ring all-reduce (Patarasuk & Yuan, 2009, "Bandwidth optimal all-reduce algorithms for
  clusters of workstations", JPDC 69(2)): each of ``n`` GPUs sends and receives
  ``2(n-1)/n · bytes``, in ``2(n-1)`` steps; with per-direction link bandwidth ``B`` and a
  latency ``α`` per step: ``t = 2(n-1)/n · bytes / B + 2(n-1) · α``. NCCL reports the same
  factor as "bus bandwidth" (NVIDIA nccl-tests, doc/PERFORMANCE.md).
* The compute of one step on each of ``n`` GPUs is the roofline bound
  ``max(FLOPs / (n · peak), bytes_read / (n · HBM bandwidth))`` with ``FLOPs = 2 · params ·
  tokens`` (Kaplan et al., 2020, arXiv:2001.08361, §2.1) and ``bytes_read`` = weights (+ the KV
  cache read in decode); optional efficiencies scale both peaks down.
* Share of a step spent communicating (no overlap of compute and communication, as in plain
  Megatron inference): ``comm / (comm + compute)``.

Bandwidths are per direction. The GPU catalog (:mod:`llminfra.specs`) quotes NVLink and PCIe
as totals of both directions; they are halved here. Taught in chapter 07.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llminfra.calc.memory import kv_bytes_per_token, weight_bytes
from llminfra.calc.params import param_count
from llminfra.specs.formats import dtype_bytes
from llminfra.specs.gpus import get_gpu
from llminfra.specs.models import ModelSpec, get_model
from llminfra.validate import positive_int


@dataclass(frozen=True)
class Interconnect:
    """A link between GPUs: ``bytes_per_s`` in ONE direction, and where the figure comes from."""

    name: str
    bytes_per_s: float
    source: str


def _from_catalog(gpu: str, pattern: str, name: str) -> Interconnect:
    text = get_gpu(gpu).interconnect or ""
    match = re.search(pattern, text)
    if match is None:
        raise KeyError(f"no {pattern!r} in the catalog's interconnect of {gpu}: {text!r}")
    total = float(match.group(1)) * 1e9
    return Interconnect(name, total / 2, f"llminfra.specs GPU catalog, {gpu}: {text!r} "
                                         "(total of both directions, halved)")


def interconnects() -> dict[str, Interconnect]:
    """The links the course compares, per direction (built on each call, no global state).

    NVLink and PCIe come from the GPU catalog; InfiniBand from the link rates of the IBTA
    specification as sold by NVIDIA: HDR 200 Gb/s (ConnectX-6) and NDR 400 Gb/s (ConnectX-7;
    a DGX H100 has one 400 Gb/s port per GPU, NVIDIA DGX H100 user guide), i.e. 25 and 50 GB/s.
    """
    return {
        "nvlink-a100": _from_catalog("a100-80gb", r"NVLink \d: (\d+) GB/s", "NVLink 3 (A100)"),
        "nvlink-h100": _from_catalog("h100", r"NVLink \d: (\d+) GB/s", "NVLink 4 (H100)"),
        "pcie-gen4": _from_catalog("a100-40gb", r"PCIe Gen4 x16 (\d+) GB/s", "PCIe Gen4 x16"),
        "pcie-gen5": _from_catalog("h100", r"PCIe Gen5 x16 (\d+) GB/s", "PCIe Gen5 x16"),
        "infiniband-hdr": Interconnect("InfiniBand HDR 200 Gb/s", 200e9 / 8,
                                       "IBTA HDR link rate, NVIDIA ConnectX-6 datasheet"),
        "infiniband-ndr": Interconnect("InfiniBand NDR 400 Gb/s", 400e9 / 8,
                                       "IBTA NDR link rate, NVIDIA ConnectX-7 datasheet"),
    }


def get_interconnect(name: str | Interconnect) -> Interconnect:
    """The link called ``name``; ``KeyError`` lists the known ones."""
    if isinstance(name, Interconnect):
        return name
    links = interconnects()
    if name not in links:
        raise KeyError(f"unknown interconnect {name!r}; known: {', '.join(links)}")
    return links[name]


def step_tokens(phase: str, batch: int = 1, prompt_len: int = 2048) -> int:
    """Tokens processed in one forward pass: ``batch · prompt_len`` in prefill, ``batch`` in
    decode."""
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    positive_int("batch", batch)
    return batch * (positive_int("prompt_len", prompt_len) if phase == "prefill" else 1)


def allreduce_bytes(model: str | ModelSpec, tokens: int, dtype: str = "bf16") -> int:
    """Bytes of ONE tensor-parallel all-reduce: ``tokens · h · bytes(dtype)``."""
    spec = get_model(model)
    return int(positive_int("tokens", tokens) * spec.hidden_size * dtype_bytes(dtype))


def allreduce_bytes_per_layer(model: str | ModelSpec, tokens: int, dtype: str = "bf16") -> int:
    """Bytes all-reduced per layer per forward pass: two all-reduces (attention, MLP)."""
    return 2 * allreduce_bytes(model, tokens, dtype)


def ring_allreduce_time_s(n_bytes: float, n_gpus: int, bytes_per_s: float,
                          latency_s: float = 0.0) -> float:
    """``2(n-1)/n · bytes / B + 2(n-1) · α`` seconds; 0 for one GPU.

    1 GB over 4 GPUs at 32 GB/s, α = 0: 1.5 · 1e9 / 32e9 = 46.9 ms.
    """
    n = positive_int("n_gpus", n_gpus)
    if bytes_per_s <= 0 or latency_s < 0 or n_bytes < 0:
        raise ValueError(f"need bytes_per_s > 0, latency_s >= 0, n_bytes >= 0; got "
                         f"{bytes_per_s!r}, {latency_s!r}, {n_bytes!r}")
    return 2 * (n - 1) / n * n_bytes / bytes_per_s + 2 * (n - 1) * latency_s


def compute_time_s(model: str | ModelSpec, gpu: str, n_gpus: int, phase: str, batch: int = 1,
                   prompt_len: int = 2048, context: int = 2048, dtype: str = "bf16",
                   flops_efficiency: float = 1.0, hbm_efficiency: float = 1.0) -> float:
    """Roofline time of one forward pass split over ``n_gpus`` (see module docstring); decode
    also reads ``batch · context`` tokens of KV cache."""
    spec, g = get_model(model), get_gpu(gpu)
    tokens = step_tokens(phase, batch, prompt_len)
    flops = 2 * param_count(spec) * tokens
    read = weight_bytes(spec, dtype)
    if phase == "decode":
        read += kv_bytes_per_token(spec, dtype) * batch * positive_int("context", context)
    tflops = g.tflops(dtype)
    if tflops is None:
        known = sorted(d for d, row in g.peak_tflops.items() if row["dense"])
        raise ValueError(f"the catalog has no {dtype!r} peak for {g.name}; dtypes with a peak "
                         f"there: {', '.join(known)}")
    peak = tflops * 1e12 * flops_efficiency
    return max(flops / peak, read / (g.hbm_bytes_per_s * hbm_efficiency)) / positive_int(
        "n_gpus", n_gpus)


def communication_share(model: str | ModelSpec, gpu: str, n_gpus: int, interconnect: str,
                        phase: str, batch: int = 1, prompt_len: int = 2048, context: int = 2048,
                        dtype: str = "bf16", latency_s: float = 0.0,
                        flops_efficiency: float = 1.0, hbm_efficiency: float = 1.0) -> dict:
    """One forward step with ``n_gpus``-way tensor parallelism: ``comm_s``, ``compute_s``,
    ``share`` = comm / (comm + compute), and the inputs. ``context`` is the KV length read in
    decode; ``latency_s`` is α per ring step."""
    spec, link = get_model(model), get_interconnect(interconnect)
    tokens = step_tokens(phase, batch, prompt_len)
    per_ar = allreduce_bytes(spec, tokens, dtype)
    n_ar = 2 * spec.num_layers
    comm = n_ar * ring_allreduce_time_s(per_ar, n_gpus, link.bytes_per_s, latency_s)
    compute = compute_time_s(spec, gpu, n_gpus, phase, batch, prompt_len, context, dtype,
                             flops_efficiency, hbm_efficiency)
    return {"model": spec.name, "gpu": gpu, "n_gpus": n_gpus, "interconnect": interconnect,
            "phase": phase, "batch": batch, "tokens": tokens, "allreduces": n_ar,
            "allreduce_bytes": per_ar, "latency_s": latency_s, "comm_s": comm,
            "compute_s": compute, "share": comm / (comm + compute) if comm + compute else 0.0}


def pcie_claim_table(model: str = "llama-2-70b", gpu: str = "a100-80gb",
                     latency_s: float = 0.0) -> list[dict]:
    """The source text's "communication can take 40–50 % of inference time over PCIe", tested:
    :func:`communication_share` of ``model`` on 4 and 8 GPUs, prefill (batch 1, 2048-token
    prompt) and decode (batch 1 and 32, 2048-token context), over PCIe Gen4 / Gen5 and NVLink.
    Each row adds ``in_40_50`` (share within [0.40, 0.50]) and ``at_least_40``."""
    rows = []
    for phase, batch in (("prefill", 1), ("decode", 1), ("decode", 32)):
        for n in (4, 8):
            for link in ("pcie-gen4", "pcie-gen5", "nvlink-a100"):
                row = communication_share(model, gpu, n, link, phase, batch,
                                          latency_s=latency_s)
                row["in_40_50"] = 0.40 <= row["share"] <= 0.50
                row["at_least_40"] = row["share"] >= 0.40
                rows.append(row)
    return rows
