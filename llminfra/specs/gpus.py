"""GPU catalog, as data: peak throughput per dtype (dense and sparse apart), memory, bandwidth,
interconnect, power, launch date, source and a confidence flag.

The facts are transcribed with their sources in ``gpu_datasheets.json`` beside this file.
``confidence`` is ``"datasheet"`` where the value was re-read from a vendor datasheet and
something else (``"recalled"``, …) where it was not: show it wherever the value is shown.

Memory, one rule everywhere (:attr:`GPUSpec.memory_bytes`): the total the driver reports
(``nvidia-smi`` / ``rocm-smi``, the same figure as ``torch.cuda.mem_get_info()[1]`` and the one
vLLM's ``gpu_memory_utilization`` multiplies) where a report is on record, else the datasheet's
nominal figure in the unit the vendor means. Vendors write "GB" for memory, but memory chips and
cards are sized in binary units (JEDEC Standard 100B.01: giga = 2**30 for memory capacity), so an
"80 GB" H100 has 80 GiB of HBM3, of which the driver reports 81,559 MiB (79.6 GiB); an
A100-40GB reports 40,960 MiB = 40 GiB exactly. ``memory_source`` says which figure is used.

Peak TFLOPS are tensor-core peaks. ``dense`` is without 2:4 structured sparsity; ``sparse`` is
the vendor's "with sparsity" figure, twice the dense one, reached only by 2:4-pruned weights.
For GeForce cards the 16-bit peak quoted is the one with fp32 accumulation (what training and
inference frameworks use); the fp16-accumulate figure is kept in ``notes``.

Taught in chapters 02 and 08.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

_DATA = Path(__file__).with_name("gpu_datasheets.json")

#: preset name -> "name" field of the datasheet entry
_NAMES = {
    "a100-40gb": "NVIDIA A100 40GB SXM4",
    "a100-80gb": "NVIDIA A100 80GB SXM4",
    "a100-80gb-pcie": "NVIDIA A100 80GB PCIe",
    "h100": "NVIDIA H100 SXM5 80GB",
    "h100-pcie": "NVIDIA H100 PCIe 80GB",
    "h100-nvl": "NVIDIA H100 NVL 94GB",
    "h200": "NVIDIA H200 SXM 141GB",
    "h200-nvl": "NVIDIA H200 NVL 141GB",
    "l40s": "NVIDIA L40S 48GB",
    "l40": "NVIDIA L40 48GB",
    "mi300x": "AMD Instinct MI300X 192GB",
    "mi325x": "AMD Instinct MI325X 256GB",
    "rtx-5090": "NVIDIA GeForce RTX 5090",
    "rtx-4090": "NVIDIA GeForce RTX 4090",
    "rtx-4060-ti-16gb": "NVIDIA GeForce RTX 4060 Ti 16GB",
    "rtx-3090": "NVIDIA GeForce RTX 3090",
    "rtx-3060-12gb": "NVIDIA GeForce RTX 3060 12GB",
    "rx-7900-xtx": "AMD Radeon RX 7900 XTX",
    "m2-ultra": "Apple M2 Ultra (unified memory)",
    "m4-max": "Apple M4 Max (unified memory)",
}

#: bytes per unit of a vendor's memory figure
_UNITS = {"GiB": 2**30, "GB": 10**9}

ALIASES = {"a100": "a100-80gb", "h100-sxm": "h100", "h200-sxm": "h200"}

#: datasheet field -> dtype keys it stands for
_TFLOPS_FIELDS = {
    "fp16_bf16_tensor_TFLOPS": ("fp16", "bf16"),
    "tf32_TFLOPS": ("tf32",),
    "fp8_TFLOPS": ("fp8",),
    "int8_TOPS": ("int8",),
}


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator. ``peak_tflops[dtype]`` is ``{"dense": x, "sparse": y}`` (either may be
    ``None``); ``memory_gb`` is the vendor's figure (the largest for unified-memory parts sold in
    several sizes), in ``memory_unit``; ``driver_memory_bytes`` the driver-reported total where
    on record (``None`` otherwise), from ``driver_memory_source``."""

    name: str
    display_name: str
    vendor: str
    arch: str
    launch: str
    memory_gb: float
    memory_type: str
    hbm_bytes_per_s: float
    peak_tflops: dict = field(default_factory=dict)
    fp32_tflops: float | None = None
    tdp_w: str | None = None
    interconnect: str | None = None
    source: str = ""
    confidence: str = ""
    notes: tuple[str, ...] = ()
    memory_unit: str = "GiB"
    driver_memory_bytes: int | None = None
    driver_memory_source: str | None = None

    @property
    def nominal_memory_bytes(self) -> int:
        """The datasheet's figure in bytes, in the vendor's unit: ``memory_gb · 2**30`` for
        ``GiB`` (A100-40GB: 42,949,672,960), ``· 1e9`` for ``GB``."""
        if self.memory_unit not in _UNITS:
            raise ValueError(f"{self.name}: unknown memory_unit {self.memory_unit!r}; "
                             f"allowed: {', '.join(_UNITS)}")
        return int(round(self.memory_gb * _UNITS[self.memory_unit]))

    @property
    def memory_bytes(self) -> int:
        """The card's memory, one rule everywhere: the driver-reported total where on record,
        else :attr:`nominal_memory_bytes`. H100 SXM: 81,559 MiB = 85,520,809,984 bytes."""
        return self.driver_memory_bytes or self.nominal_memory_bytes

    @property
    def memory_source(self) -> str:
        """Where :attr:`memory_bytes` comes from."""
        if self.driver_memory_bytes:
            return f"driver-reported total: {self.driver_memory_source}"
        return f"datasheet nominal {self.memory_gb:g} {self.memory_unit} ({self.source})"

    @property
    def bandwidth_gb_per_s(self) -> float:
        return self.hbm_bytes_per_s / 1e9

    @property
    def is_datasheet(self) -> bool:
        return self.confidence.startswith("datasheet")

    def tflops(self, dtype: str = "bf16", sparse: bool = False) -> float | None:
        """Peak tensor TFLOPS for ``dtype``; dense unless ``sparse=True``. ``None`` if unknown."""
        row = self.peak_tflops.get(dtype)
        if row is None:
            if dtype not in {k for ks in _TFLOPS_FIELDS.values() for k in ks}:
                raise KeyError(f"unknown dtype {dtype!r}; peaks exist for "
                               f"{sorted({k for ks in _TFLOPS_FIELDS.values() for k in ks})}")
            return None
        return row["sparse" if sparse else "dense"]

    def to_dict(self) -> dict:
        """The fields as plain data; ``peak_tflops`` is a copy (the catalog is cached and shared
        by every caller, so it must not be handed out to be changed)."""
        return {
            "name": self.name, "display_name": self.display_name, "vendor": self.vendor,
            "arch": self.arch, "launch": self.launch, "memory_gb": self.memory_gb,
            "memory_bytes": self.memory_bytes, "memory_unit": self.memory_unit,
            "nominal_memory_bytes": self.nominal_memory_bytes,
            "driver_memory_bytes": self.driver_memory_bytes,
            "memory_source": self.memory_source, "memory_type": self.memory_type,
            "bandwidth_gb_per_s": self.bandwidth_gb_per_s,
            "peak_tflops": {k: dict(v) for k, v in self.peak_tflops.items()},
            "fp32_tflops": self.fp32_tflops, "tdp_w": self.tdp_w,
            "interconnect": self.interconnect, "source": self.source,
            "confidence": self.confidence, "notes": list(self.notes),
        }


def _memory_gb(value) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    return float(str(value).split("(")[0].replace("up to", "").strip())


def _peaks(entry: dict) -> tuple[dict, list[str]]:
    peaks, notes = {}, []
    for fld, dtypes in _TFLOPS_FIELDS.items():
        row = entry.get(fld)
        if not row:
            continue
        if "dense_fp32_accumulate" in row:  # GeForce: quote fp32-accumulate, note the other
            value = {"dense": row["dense_fp32_accumulate"], "sparse": row["sparse_fp32_accumulate"]}
            notes.append(f"{'/'.join(dtypes)}: {row['dense_fp16_accumulate']} dense with fp16 "
                         "accumulation (the figure shown is with fp32 accumulation)")
        else:
            value = {"dense": row.get("dense"), "sparse": row.get("sparse")}
        for d in dtypes:
            peaks[d] = dict(value)
    return peaks, notes


def _from_entry(name: str, entry: dict) -> GPUSpec:
    peaks, notes = _peaks(entry)
    if entry.get("note"):
        notes.append(entry["note"])
    tdp = entry.get("tdp_W")
    return GPUSpec(
        name=name, display_name=entry["name"], vendor=entry["vendor"], arch=entry["arch"],
        launch=entry["launch"], memory_gb=_memory_gb(entry["memory_GB"]),
        memory_type=entry["memory_type"], hbm_bytes_per_s=entry["bandwidth_GBps"] * 1e9,
        peak_tflops=peaks, fp32_tflops=entry.get("fp32_TFLOPS"),
        tdp_w=None if tdp is None else str(tdp), interconnect=entry.get("interconnect"),
        source=entry["source"], confidence=entry["confidence"], notes=tuple(notes),
        memory_unit=entry.get("memory_unit", "GiB"),
        driver_memory_bytes=entry.get("memory_driver_total_bytes"),
        driver_memory_source=entry.get("memory_driver_source"))


@lru_cache(maxsize=1)
def _catalog() -> dict[str, GPUSpec]:
    entries = {e["name"]: e for e in json.loads(_DATA.read_text())["gpus"]}
    missing = set(entries) - set(_NAMES.values())
    if missing:  # every datasheet row must have a preset name
        raise RuntimeError(f"gpu_datasheets.json rows without a preset name: {sorted(missing)}")
    return {name: _from_entry(name, entries[full]) for name, full in _NAMES.items()}


def gpu_names() -> list[str]:
    """All GPU preset names (aliases not included)."""
    return list(_NAMES)


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """The GPU called ``name`` (case-insensitive); ``KeyError`` lists the catalog if unknown."""
    if isinstance(name, GPUSpec):
        return name
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    cat = _catalog()
    if key not in cat:
        raise KeyError(f"unknown GPU {name!r}; known GPUs: {', '.join(cat)} "
                       f"(aliases: {', '.join(ALIASES)})")
    return cat[key]
