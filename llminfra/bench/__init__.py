"""Benchmark suites behind ``python -m llminfra bench SUITE``.

Each suite is a module in this package with two functions:

* ``run(quick: bool = False) -> dict`` — measures, and returns JSON-serialisable numbers;
* ``format_table(result: dict) -> str`` — the same numbers as a plain-text table.

A suite whose code has a CUDA part also defines ``run_gpu() -> dict``; ``bench gpu`` calls
every such function in one process (see :mod:`llminfra.bench.gpu`).

Timing helpers live in :mod:`llminfra.bench.timing`; nothing else in the package synchronises
devices or reads clocks for reporting.
"""

from __future__ import annotations

import importlib

#: suite name -> module that implements it
SUITES: dict[str, str] = {
    "attention": "llminfra.bench.attention",
    "kvcache": "llminfra.bench.kvcache",
    "quant": "llminfra.bench.quant",
    "parallel": "llminfra.bench.parallel",
    "gpu": "llminfra.bench.gpu",
    "serving": "llminfra.bench.serving",
    "roofline": "llminfra.bench.roofline",
    "real": "llminfra.bench.real",
    "spec": "llminfra.bench.spec",
    "structured": "llminfra.bench.structured",
    "disagg": "llminfra.bench.disagg",
    "router": "llminfra.bench.router",
    "distributed": "llminfra.bench.distributed",
    "engine": "llminfra.bench.engine",
    "memory": "llminfra.bench.memory",
    "serving-profile": "llminfra.bench.serving_profile",
}


def load_suite(name: str):
    """Import the module behind suite ``name``; ``KeyError`` lists the suites if unknown."""
    if name not in SUITES:
        raise KeyError(f"unknown bench suite {name!r}; choose one of {sorted(SUITES)}")
    try:
        return importlib.import_module(SUITES[name])
    except ModuleNotFoundError as e:
        if e.name == SUITES[name]:
            raise KeyError(f"bench suite {name!r} is not built yet (no module {SUITES[name]})") from e
        raise
