"""``make compare-engines``: ``llminfra serve`` beside vLLM and llama.cpp on the same fp32 weights,
and in int4, on this machine, in one run.

Recorded once and committed (``llminfra/data/compare_engines_cpu.json``), never run in CI: vLLM
wants a virtual environment of its own and minutes to start on a 2-core CPU, and llama.cpp is
built from source.

1. The real model (``smollm2-135m``) is exported with
   :func:`llminfra.model.hf_export.export_hf_folder` to a Hugging Face folder in fp32, which
   vLLM and ``llminfra serve`` read; llama.cpp rewrites the model's GGUF file in F32 itself
   and also serves the file as it ships (Q4_1), beside ``llminfra serve --quantization w4a8``,
   which re-quantizes the fp32 folder (the Q4_1 values) to ``int4-g32``: the same layout, other
   values, so the int4 rows compare engines on different weights
   (:mod:`llminfra.bench.compare_servers` lists every server and its command line: chapter 10's
   exported commands, run as they are).
2. Beside the servers, batch-1 decode on one thread (``--llama-cpp``): ``llama-bench`` on both
   GGUF files and ours through ``bench real``'s decode paths, each beside its floor at the copy
   bandwidth measured in the run (:func:`llminfra.bench.llamacpp.decode_side_by_side`).
3. Every server starts on 127.0.0.1 (OS-picked ports) and answers the greedy probes
   (``/v1/completions`` and ``/v1/chat/completions``, temperature 0). Then ``llminfra loadtest``
   drives them in closed loops, at each concurrency one server after the other (never two at
   once: they share the cores), with the same seeded prompts and output lengths and
   ``ignore_eos``, so each writes every token. The servers not being measured are paused
   (SIGSTOP): vLLM's idle workers poll and would take half a core from the one measured.
4. The JSON has each server's start-up time, throughput, TTFT / TPOT percentiles and errors per
   concurrency, the greedy agreement and throughput ratios per weight format, and chapter 10's
   plan — this CPU's roofline, measured in the same run — beside the fp32 engines
   (:mod:`llminfra.bench.compare_report`).

Any OpenAI-compatible server can stand in for a peer (``--peer-cmd``), which is how the test
runs the orchestration on tiny-model servers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import tempfile
from pathlib import Path

from llminfra.bench import compare_report
from llminfra.bench.compare_servers import FORMATS, server_specs
from llminfra.bench.server_process import (PROBE_TOKENS, PROBES, Server,  # noqa: F401 - API
                                           agreement, free_port, probe)
from llminfra.planning.commands import EngineLimits
from llminfra.runner.kernel_choice import MATMULS, resolve_matmul
from llminfra.specs import get_model

OUTPUT_TOKENS = 64
MAX_MODEL_LEN = 512


def measure(url: str, name: str, concurrency: int, num_requests: int, max_len: int,
            chars_per_token: float) -> dict:
    """One ``loadtest`` in a closed loop of ``concurrency`` clients."""
    from llminfra.serving.loadtest import run_loadtest
    r = run_loadtest(url, concurrency=concurrency, num_requests=num_requests, model=name,
                     seed=0, max_model_len=max_len, max_output_tokens=OUTPUT_TOKENS,
                     chars_per_token=chars_per_token, ignore_eos=True, progress=False,
                     timeout_s=1800)
    print(f"  concurrency {concurrency}: {r['output_tokens_per_s']:.4g} tokens/s, TTFT p50 "
          f"{r['ttft_s']['p50']:.3g} s, {r['num_errors']} errors {r['errors']}", flush=True)
    return {k: r[k] for k in ("num_requests", "num_ok", "num_errors", "errors", "wall_s",
                              "output_tokens", "prompt_tokens", "output_tokens_per_s",
                              "ttft_s", "tpot_s", "e2e_s")}


def run_all(specs, name: str, requests: dict[int, int], max_len: int, chars_per_token: float,
            logdir: Path, start_timeout_s: float) -> dict:
    """Start every server of ``specs`` (:class:`~llminfra.bench.compare_servers.ServerSpec`),
    probe each, then measure them interleaved — at each concurrency one after the other — so
    that whatever else the machine does falls on all alike. Only the server being measured
    runs: the others are paused (:meth:`Server.pause`)."""
    results, servers = {}, {}
    try:
        for spec in specs:
            port = free_port()
            argv = spec.argv(port)
            print(f"== {spec.label}: {shlex.join(argv)}", flush=True)
            servers[spec.label] = server = Server(argv, port,
                                                  logdir / f"{spec.label.replace(' ', '-')}.log",
                                                  spec.env)
            start_s = server.wait_ready(start_timeout_s)
            print(f"  ready after {start_s:.0f} s", flush=True)
            results[spec.label] = {"engine": spec.engine, "format": spec.fmt,
                                   "version": spec.version, "command": argv, "env": spec.env,
                                   "start_s": start_s, "probe_texts": probe(server.url, name),
                                   "concurrency": {}}
            server.pause()
        for c, n in requests.items():
            for label, server in servers.items():
                print(f"== {label}", flush=True)
                server.resume()
                results[label]["concurrency"][str(c)] = measure(server.url, name, c, n,
                                                                max_len, chars_per_token)
                server.pause()
    finally:
        for server in servers.values():
            server.resume()
            server.__exit__(None, None, None)
    return results


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llminfra.bench.compare_engines",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-python", help="the python of vLLM's own virtual environment")
    p.add_argument("--llama-cpp", metavar="DIR", help="the folder of llama.cpp's "
                   "llama-server, llama-bench and llama-quantize")
    p.add_argument("--peer-cmd", help="a stand-in peer: a command with {folder} {name} {port} "
                   "{threads} fields, serving the OpenAI API on the fp32 weights")
    p.add_argument("--formats", default=",".join(FORMATS),
                   help="weight formats to serve, of fp32,int4 (default both)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--matmul", default="auto", choices=MATMULS,
                   help="llminfra serve's matmul kernel (default auto: its own default, "
                        "the C kernel for one or two rows and oneDNN prepacked for more)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--requests", default="1:8,4:16,16:32",
                   help="concurrency:requests pairs (default 1:8,4:16,16:32)")
    p.add_argument("--chars-per-token", type=float, default=4.0,
                   help="prompt characters per token (about 4 for SmolLM2's BPE on English)")
    p.add_argument("--start-timeout", type=float, default=1800.0, help="seconds per server")
    p.add_argument("--log-dir", help="keep every server's log here (default: a temporary "
                   "folder, removed at the end)")
    p.add_argument("--json", required=True, help="write the results here")
    return p


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, dict[int, int]]:
    """The arguments, checked (argparse's exit and message where they are wrong), and the
    ``--requests`` pairs as ``{concurrency: requests}``."""
    p = _parser()
    args = p.parse_args(argv)
    if not (args.vllm_python or args.peer_cmd or args.llama_cpp):
        p.error("give at least one peer: --vllm-python, --llama-cpp or --peer-cmd")
    args.formats = tuple(f for f in args.formats.split(",") if f)
    if not args.formats or set(args.formats) - set(FORMATS):
        p.error(f"--formats {','.join(args.formats)!r}: allowed fp32, int4 or both")
    if args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    try:
        requests = {int(c): int(n) for c, n in (pair.split(":") for pair in
                                                args.requests.split(","))}
    except ValueError:
        p.error(f"--requests wants pairs like 1:8,4:16, got {args.requests!r}")
    out = Path(args.json)
    if out.is_dir() or not out.parent.is_dir():
        p.error(f"--json {out}: not a file in an existing folder")
    return args, requests


def _llama_cpp_side(args, model, tok, tmp: Path) -> tuple[dict | None, dict | None]:
    """llama.cpp's two GGUF files (``{"fp32": F32 rewrite, "int4": the original}``) and the
    batch-1 decode side by side; ``(None, None)`` without ``--llama-cpp``."""
    if not args.llama_cpp:
        return None, None
    from llminfra.bench import llamacpp
    from llminfra.bench.real import corpus_prompts
    from llminfra.bench.real_decode import DECODE_PROMPT_LEN
    from llminfra.bench.roofline import measure_copy_bytes_per_s
    from llminfra.bench.timing import torch_threads
    from llminfra.model import pretrained_path
    from llminfra.sim.workload import WorkloadRequest

    src = (Path(args.model) if args.model.endswith(".gguf") else pretrained_path(args.model))
    ggufs = {"fp32": llamacpp.f32_gguf(args.llama_cpp, src, tmp / f"{src.stem}-F32.gguf"),
             "int4": src}
    prompt = corpus_prompts(tok, [WorkloadRequest(0.0, DECODE_PROMPT_LEN, 1)])[0]
    with torch_threads(1):
        bw = measure_copy_bytes_per_s(repeats=3)
    return ggufs, llamacpp.decode_side_by_side(args.llama_cpp, ggufs, model, prompt, bw)


def _report(args, requests, limits: EngineLimits, spec, results, specs, roof,
            decode) -> dict:
    """The JSON: environment, settings, the plan's limits and bound beside the fp32 engines,
    greedy agreement, every server's runs and the throughput ratios per weight format."""
    from llminfra.bench.timing import cpu_name, environment
    report = {
        "environment": {**environment(), "cpu_name": cpu_name(), "load_avg": os.getloadavg()},
        "model": args.model,
        "weights": {"fp32": "exported from the GGUF to a safetensors folder, fp32 (vLLM, "
                            "llminfra); llama.cpp: the GGUF rewritten in F32 by llama-quantize",
                    "int4": "llama.cpp: the GGUF as it ships (Q4_1, embedding Q8_0); llminfra: "
                            "the fp32 folder (the Q4_1 values, dequantized) re-quantized to "
                            "int4-g32, a whole-number zero point: Q4_1's layout, not its "
                            "values (--quantization w4a8)"},
        "settings": {"threads": args.threads, "requests": requests, "formats": args.formats,
                     "matmul": resolve_matmul(args.matmul, args.model),
                     "output_tokens": OUTPUT_TOKENS, "max_model_len": limits.max_model_len,
                     "probe_tokens": PROBE_TOKENS, "ignore_eos": True, "temperature": 0,
                     "chars_per_token": args.chars_per_token},
        "plan": {"limits": dataclasses.asdict(limits),
                 "roofline": compare_report.roofline_json(roof, args.threads),
                 "beside_measured": compare_report.plan_beside_measured(
                     spec, roof, results, OUTPUT_TOKENS)},
        "greedy_agreement": compare_report.greedy_agreement(results, specs),
        "servers": results,
        "throughput_llminfra_over_peer": compare_report.throughput_ratios(results, specs),
    }
    if decode is not None:
        report["batch1_decode"] = decode
    return report


def main(argv: list[str] | None = None) -> dict:
    """Export the model, serve it on every engine, measure, and write the JSON (the module
    docstring); returns what it wrote."""
    args, requests = _parse(argv)
    import torch

    from llminfra.bench.roofline import measure_cpu_roofline
    from llminfra.model import load_model
    from llminfra.model.hf_export import export_hf_folder

    name = "smollm2-135m" if args.model == "smollm2-135m" else Path(args.model).stem
    with tempfile.TemporaryDirectory(prefix="compare-engines-") as tmp:
        tmp = Path(tmp)
        model, tok = load_model(args.model, torch.float32)
        folder = export_hf_folder(model, tok, tmp / name)
        limits = EngineLimits(_hf_id(args.model), max(requests),
                              min(MAX_MODEL_LEN, model.config.max_seq_len), "fp32")
        spec = model.config.to_spec(name)     # the plan's model, as the calculators take it
        ggufs, decode = _llama_cpp_side(args, model, tok, tmp)
        del model
        roof = measure_cpu_roofline(threads=args.threads)
        specs = server_specs(args, limits, folder, name, ggufs)
        logdir = Path(args.log_dir) if args.log_dir else tmp
        logdir.mkdir(parents=True, exist_ok=True)
        results = run_all(specs, name, requests, limits.max_model_len, args.chars_per_token,
                          logdir, args.start_timeout)
    report = _report(args, requests, limits, spec, results, specs, roof, decode)
    out = Path(args.json)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return report


def _hf_id(model: str) -> str:
    """The model's Hugging Face id where the catalog has it (the plan's ``model``), else its
    file name."""
    try:
        return get_model(model).hf_id or model
    except KeyError:
        return Path(model).name


if __name__ == "__main__":
    main()
