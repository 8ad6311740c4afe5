"""The planner's roofline bounds beside NVIDIA AIConfigurator's estimates for vLLM: the record
behind :mod:`llminfra.planning.predict`'s fitted efficiencies.

AIConfigurator (``pip install aiconfigurator``, Apache-2.0) predicts an engine's latency from a
database of kernels measured per GPU and engine version (GEMMs, attention, all-reduces, MoE),
offline. Its ``static`` estimate is the case the roofline bounds describe: ``batch`` prompts
of ``isl`` tokens prefilled together (the TTFT), then ``osl`` decode steps of the ``batch``
sequences (the TPOT, averaged over the steps), no other requests beside them. For each point
the record keeps our bounds (:func:`llminfra.calc.roofline.ttft_s` with ``logits="last"``,
:func:`~llminfra.calc.roofline.decode_time_per_token_s` at the mean context ``isl + osl / 2``),
AIConfigurator's estimate, and their ratio ``bound / estimate``: the share of the bound vLLM
reaches, the efficiency a planner divides by.

AIConfigurator runs in its own venv (``make compare-planner`` builds ``.venv-aic``): this module
starts that interpreter on :data:`_WORKER`, which alone imports ``aiconfigurator``; the course's
venv never needs it. Points: chapter 10's scenarios (the capstone's requirements and its three
services, on their GPUs, every tensor-parallel size and batch that fits) and a grid of models,
GPUs, tensor-parallel sizes, batches and prompt / output lengths. The fit
(:func:`llminfra.planning.efficiency_fit.fit`) then writes ``planner_efficiency.json``.

    python -m llminfra.planning.compare_planner --aic-python .venv-aic/bin/python \\
        --json llminfra/data/compare_planner.json --fit llminfra/data/planner_efficiency.json

Maintainers, once (never in CI). ``--refit-only`` fits again from the record already in
``--json``, without AIConfigurator (after a change to the fit):

    python -m llminfra.planning.compare_planner --refit-only \\
        --json llminfra/data/compare_planner.json --fit llminfra/data/planner_efficiency.json

Taught in chapter 10.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from llminfra.calc.memory import kv_budget
from llminfra.calc.roofline import decode_time_per_token_s, ttft_s
from llminfra.planning.efficiency_fit import fit
from llminfra.specs import get_model

#: our model presets and the Hugging Face ids AIConfigurator's bundled configs know them by
#: (Llama-3.1 has Llama-3's architecture: same layers, widths, heads and vocabulary; only its
#: RoPE scaling and context length differ, which a 4,608-token point does not reach)
AIC_MODELS = {"llama-3-8b": "meta-llama/Meta-Llama-3.1-8B",
              "llama-3-70b": "meta-llama/Meta-Llama-3.1-70B",
              "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B"}
#: our GPU names and AIConfigurator's systems (the SXM boards; the A100's is the 80 GB one)
AIC_SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "a100-80gb": "a100_sxm", "l40s": "l40s"}
#: our weight dtypes and AIConfigurator's GEMM quantization mode (int8: weight-only)
AIC_GEMM_QUANT = {"bf16": None, "int8": "int8_wo"}

TP_SIZES = (1, 2, 4, 8)
GRID_BATCHES = (1, 4, 16, 64, 128)
GRID_LENGTHS = ((256, 256), (1024, 256), (4096, 512))
SCENARIO_BATCHES = (1, 8, 32, 128)

#: chapter 10's services (its REQ on the GPUs it compares, the same traffic on Llama-3-70B,
#: and its three scenarios): (name, model, dtype, GPUs, input tokens, output tokens)
CAPSTONE = (
    ("capstone", "llama-3-8b", "bf16", ("h100", "h200", "a100-80gb", "l40s"), 1500, 300),
    ("capstone on Llama-3-70B", "llama-3-70b", "bf16", ("h100",), 1500, 300),
    ("internal assistant", "llama-3-8b", "int8", ("l40s",), 1000, 300),
    ("public chatbot", "llama-3-8b", "bf16", ("h100",), 400, 250),
    ("batch summarisation", "llama-3-70b", "bf16", ("h100",), 4000, 300),
)

#: run in AIConfigurator's venv: a JSON list of points in (argv[1]), one estimate or error per
#: point out (argv[2]); the only code that imports aiconfigurator
_WORKER = r"""
import json, logging, sys
from importlib.metadata import version
logging.disable(logging.WARNING)
from aiconfigurator.cli.api import cli_estimate
out = []
for p in json.load(open(sys.argv[1])):
    quant = {"gemm_quant_mode": p["gemm_quant"]} if p["gemm_quant"] else {}
    if p["moe"]:                      # experts split as tensor parallel splits them (no EP)
        quant.update(moe_tp_size=p["tp"], moe_ep_size=1)
    try:
        r = cli_estimate(p["hf_id"], p["system"], mode="static", backend_name="vllm",
                         isl=p["isl"], osl=p["osl"], batch_size=p["batch"], tp_size=p["tp"],
                         **quant)
        out.append({"ttft_ms": r.ttft, "tpot_ms": r.tpot, "backend_version": r.backend_version,
                    "memory_gb": (r.raw.get("memory") or [None])[0]
                    if isinstance(r.raw.get("memory"), list) else r.raw.get("memory")})
    except Exception as e:
        out.append({"error": (type(e).__name__ + ": " + str(e))[:300]})
json.dump({"aiconfigurator": version("aiconfigurator"),
           "aiconfigurator_core": version("aiconfigurator-core"), "estimates": out},
          open(sys.argv[2], "w"))
"""


def _fits(model: str, gpu: str, dtype: str, tp: int, batch: int, context: int) -> bool:
    """The weights and ``batch`` sequences of ``context`` tokens fit ``tp`` GPUs (chapter 02)."""
    return kv_budget(model, gpu, dtype, context=context, num_gpus=tp).max_sequences >= batch


def points() -> list[dict]:
    """Every point to estimate: chapter 10's scenarios, then the grid; only those whose
    weights and KV cache fit (:func:`_fits`)."""
    out = []
    for name, model, dtype, gpus, isl, osl in CAPSTONE:
        out += [dict(scenario=name, model=model, dtype=dtype, gpu=gpu, tp=tp, batch=b, isl=isl,
                     osl=osl) for gpu in gpus for tp in TP_SIZES for b in SCENARIO_BATCHES]
    out += [dict(scenario="grid", model=model, dtype="bf16", gpu=gpu, tp=tp, batch=b, isl=isl,
                 osl=osl) for model in AIC_MODELS for gpu in AIC_SYSTEMS for tp in TP_SIZES
            for b in GRID_BATCHES for isl, osl in GRID_LENGTHS]
    return [p for p in out if _fits(p["model"], p["gpu"], p["dtype"], p["tp"], p["batch"],
                                    p["isl"] + p["osl"])]


def bounds(p: dict) -> dict:
    """Our roofline bounds for point ``p``, in ms: the prefill of ``batch`` prompts (the
    output layer once per prompt) and one decode step of ``batch`` sequences at the mean
    context of the decode."""
    kw = {"dtype": p["dtype"], "tensor_parallel": p["tp"]}
    return {"bound_ttft_ms": 1e3 * ttft_s(p["model"], p["gpu"], p["isl"], p["batch"],
                                          logits="last", **kw),
            "bound_tpot_ms": 1e3 * decode_time_per_token_s(
                p["model"], p["gpu"], p["batch"], p["isl"] + p["osl"] // 2, **kw)}


def run_aiconfigurator(aic_python: str, pts: list[dict]) -> dict:
    """AIConfigurator's static estimate of every point, in its own interpreter."""
    jobs = [{"hf_id": AIC_MODELS[p["model"]], "system": AIC_SYSTEMS[p["gpu"]],
             "gemm_quant": AIC_GEMM_QUANT[p["dtype"]],
             "moe": get_model(p["model"]).num_experts > 1, **{k: p[k] for k in
                                                          ("tp", "batch", "isl", "osl")}}
            for p in pts]
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "points.json", Path(tmp) / "estimates.json"
        src.write_text(json.dumps(jobs))
        subprocess.run([aic_python, "-c", _WORKER, str(src), str(dst)], check=True,
                       stdout=subprocess.DEVNULL)
        return json.loads(dst.read_text())


def _cpu_name() -> str:
    """The CPU's model name as ``lscpu`` reads it (``platform.processor()`` if it cannot)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor()


def compare(aic_python: str) -> dict:
    """The record: each point with our bounds, AIConfigurator's estimate and the ratios."""
    pts = points()
    aic = run_aiconfigurator(aic_python, pts)
    rows = []
    for p, est in zip(pts, aic["estimates"]):
        row = {**p, "aic_model": AIC_MODELS[p["model"]], "aic_system": AIC_SYSTEMS[p["gpu"]],
               **bounds(p)}
        if "error" in est:
            row["aic_error"] = est["error"]
        else:
            row.update(aic_ttft_ms=est["ttft_ms"], aic_tpot_ms=est["tpot_ms"],
                       aic_backend_version=est["backend_version"], aic_memory_gb=est["memory_gb"],
                       ttft_ratio=row["bound_ttft_ms"] / est["ttft_ms"],
                       tpot_ratio=row["bound_tpot_ms"] / est["tpot_ms"])
        rows.append(row)
    versions = sorted({r["aic_backend_version"] for r in rows if "aic_backend_version" in r})
    return {
        "what": ("llminfra.calc.roofline bounds beside AIConfigurator's static estimates for "
                 "vLLM (batch prompts prefilled together = TTFT; batch sequences decoded "
                 "together = TPOT, mean over the decode); ratio = bound / estimate"),
        "command": ("make compare-planner (python -m llminfra.planning.compare_planner "
                    "--aic-python .venv-aic/bin/python --json llminfra/data/compare_planner.json "
                    "--fit llminfra/data/planner_efficiency.json)"),
        "environment": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                            timespec="seconds"),
                        "aiconfigurator": aic["aiconfigurator"],
                        "aiconfigurator_core": aic["aiconfigurator_core"],
                        "backend": "vllm", "database_versions": versions,
                        "database_versions_by_system": {
                            r["aic_system"]: r["aic_backend_version"] for r in rows
                            if "aic_backend_version" in r},
                        "estimate_mode": "static", "database_mode": "SILICON (the default)",
                        "python": platform.python_version(), "machine": platform.machine(),
                        "cpu": _cpu_name(),
                        "note": "offline database lookups: the CPU that ran them does not "
                                "enter the numbers"},
        "models": AIC_MODELS, "systems": AIC_SYSTEMS, "points": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aic-python",
                    help="the interpreter of the venv that has aiconfigurator")
    ap.add_argument("--json", required=True, help="where to write the comparison record "
                    "(with --refit-only: where to read it)")
    ap.add_argument("--fit", help="also fit the efficiencies and write them here")
    ap.add_argument("--refit-only", action="store_true",
                    help="no AIConfigurator: fit again from the record in --json")
    args = ap.parse_args(argv)
    if args.refit_only:
        if not args.fit:
            ap.error("--refit-only needs --fit (where to write the efficiencies)")
        record = json.loads(Path(args.json).read_text(encoding="utf-8"))
    elif not args.aic_python:
        ap.error("--aic-python is required (or --refit-only to fit the record in --json)")
    else:
        record = compare(args.aic_python)
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        ok = [r for r in record["points"] if "aic_error" not in r]
        print(f"{len(ok)} of {len(record['points'])} points estimated -> {args.json}")
    if args.fit:
        fitted = fit(record, source=args.json)
        Path(args.fit).write_text(json.dumps(fitted, indent=1) + "\n")
        print(f"efficiencies fitted on {fitted['fitted_on']['points']} points -> {args.fit}; "
              f"held back: {json.dumps(fitted['held_back_errors'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
