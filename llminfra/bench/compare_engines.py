"""``make compare-engines``: ``llminfra serve`` beside vLLM on the same weights, on this machine.

Recorded once and committed (``llminfra/data/compare_engines_cpu.json``), never run in CI: vLLM
wants a virtual environment of its own and takes minutes to start on a 2-core CPU.

1. The real model (``smollm2-135m``) is exported with
   :func:`llminfra.model.hf_export.export_hf_folder` to a Hugging Face folder in fp32, so both
   engines read the same numbers.
2. Both servers start on 127.0.0.1 (OS-picked ports) and answer the greedy probes
   (``/v1/completions`` and ``/v1/chat/completions``, temperature 0). Then ``llminfra loadtest``
   drives them in closed loops, at each concurrency one server after the other (never both at
   once: they share the cores), with the same seeded prompts and output lengths and
   ``ignore_eos``, so both write every token. The server not being measured is paused
   (SIGSTOP): vLLM's idle workers poll and would take half a core from ours.
3. The probes' texts are compared engine against engine; the JSON has both servers' start-up
   time, throughput, TTFT / TPOT percentiles and errors per concurrency.

Any OpenAI-compatible server can stand in for vLLM (``--peer-cmd``), which is how the test runs
the orchestration on two tiny-model servers. ``--llama-cpp DIR`` (``make compare-llamacpp``,
written to ``llminfra/data/compare_llamacpp_cpu.json``) makes llama.cpp the peer
(:mod:`llminfra.bench.llamacpp`): ``llama-server`` on the model's GGUF file rewritten in F32 by
llama.cpp itself, and, beside the servers, batch-1 decode on one thread — ``llama-bench`` on that
file and on the original Q4_1 one, ours through :func:`llminfra.bench.real_decode.decode_s_per_token`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from llminfra.bench.server_process import (PROBE_TOKENS, PROBES, Server,  # noqa: F401 - API
                                           agreement, free_port, probe)
from llminfra.serving.serve import resolve_matmul

CONCURRENCY = (1, 4, 16)
OUTPUT_TOKENS = 64
MAX_MODEL_LEN = 512


def vllm_command(python: str, folder: Path, name: str, port: int, max_len: int) -> list[str]:
    """vLLM's OpenAI server on ``folder`` (fp32, the same context cap as ours)."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--max-model-len", str(max_len),
            "--max-num-seqs", str(max(CONCURRENCY))]


def llminfra_command(folder: Path, name: str, port: int, threads: int,
                     matmul: str = "auto") -> list[str]:
    return [sys.executable, "-m", "llminfra", "serve", "--model", str(folder), "--port",
            str(port), "--threads", str(threads), "--max-num-seqs", str(max(CONCURRENCY)),
            "--matmul", matmul, "--log-level", "warning"]


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


def run_both(commands: dict[str, tuple], name: str, requests: dict[int, int], max_len: int,
             chars_per_token: float, logdir: Path, start_timeout_s: float) -> dict:
    """Start every server (``label -> (argv for a port, env)``), probe each, then measure them
    interleaved — at each concurrency one after the other — so that whatever else the machine
    does falls on both alike. Only the server being measured runs: the others are paused
    (:meth:`Server.pause`)."""
    results, servers = {}, {}
    try:
        for label, (argv_for_port, env) in commands.items():
            port = free_port()
            argv = argv_for_port(port)
            print(f"== {label}: {shlex.join(argv)}", flush=True)
            servers[label] = Server(argv, port, logdir / f"{label}.log", env)
            start_s = servers[label].wait_ready(start_timeout_s)
            print(f"  ready after {start_s:.0f} s", flush=True)
            results[label] = {"command": argv, "start_s": start_s,
                              "probe_texts": probe(servers[label].url, name), "concurrency": {}}
            servers[label].pause()
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


def _peer_version(python: str) -> str | None:
    try:
        return subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"],
                              capture_output=True, text=True, timeout=300).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _decode_side_by_side(bin_dir: str, model_name: str, model, tok, tmp: Path) -> dict:
    """Batch-1 decode on one thread: llama-bench on the GGUF (its F32 rewrite, kept for the
    server, and the original) and ours on the same 64-token prompt length and 64 new tokens;
    each beside its floor, the bytes it reads a token at the copy bandwidth measured here."""
    from llminfra.bench import llamacpp
    from llminfra.bench.real import corpus_prompts
    from llminfra.bench.real_decode import DECODE_PROMPT_LEN, decode_s_per_token, int4_kernel
    from llminfra.bench.roofline import measure_copy_bytes_per_s
    from llminfra.calc.measured import parameter_bytes
    from llminfra.bench.timing import torch_threads
    from llminfra.sim.workload import WorkloadRequest
    from llminfra.model import pretrained_path

    src = pretrained_path(model_name) if not model_name.endswith(".gguf") else Path(model_name)
    f32 = llamacpp.f32_gguf(bin_dir, src, tmp / f"{src.stem}-F32.gguf")
    bench = {label: llamacpp.llama_bench(bin_dir, path, 1, DECODE_PROMPT_LEN, 64)
             for label, path in (("llama.cpp F32", f32), (f"llama.cpp {src.stem}", src))}
    prompt = corpus_prompts(tok, [WorkloadRequest(0.0, DECODE_PROMPT_LEN, 1)])[0]
    with torch_threads(1):
        ours, int4_bytes = decode_s_per_token(model, prompt, 64, 3)
        bw = measure_copy_bytes_per_s(repeats=3)
    ms = {**{f"llminfra {k}": v * 1e3 for k, v in ours.items()},
          **{k: b["tg_ms_per_token"] for k, b in bench.items()}}
    # the bytes a token reads: every tensor of the GGUF (its tied embedding is the output
    # matrix), ours as bench real counts them
    fp32_bytes = parameter_bytes(model)
    read = {"llama.cpp F32": gguf_tensor_bytes(f32), f"llama.cpp {src.stem}": gguf_tensor_bytes(src),
            **{f"llminfra {k}": int4_bytes if "int4" in k else fp32_bytes for k in ours}}
    floor = {k: b / bw * 1e3 for k, b in read.items()}
    print("batch-1 decode ms/token:", {k: round(v, 3) for k, v in ms.items()}, flush=True)
    return {"f32_gguf": f32, "threads": 1, "prompt_tokens": DECODE_PROMPT_LEN,
            "new_tokens": 64, "ms_per_token": ms, "llama_bench": bench,
            "int4_kernel": int4_kernel(), "copy_bandwidth_bytes_per_s": bw,
            "weight_bytes": read, "floor_ms": floor,
            "x_floor": {k: ms[k] / floor[k] for k in ms}}


def gguf_tensor_bytes(path) -> int:
    """The bytes of every tensor in a GGUF file (its metadata left out)."""
    from gguf import GGUFReader
    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llminfra.bench.compare_engines",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-python", help="the python of vLLM's own virtual environment")
    p.add_argument("--peer-cmd", help="instead of vLLM: a command with {folder} {name} {port} "
                   "{threads} fields, serving the OpenAI API")
    p.add_argument("--llama-cpp", metavar="DIR", help="instead of vLLM: llama.cpp, the folder "
                   "of its llama-server, llama-bench and llama-quantize")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--matmul", default="auto", choices=("auto", "plain", "onednn"),
                   help="llminfra serve's matmul kernel (default auto: its own default, "
                        "oneDNN prepacked on the real model where PyTorch has it)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--requests", default="1:8,4:16,16:32",
                   help="concurrency:requests pairs (default 1:8,4:16,16:32)")
    p.add_argument("--chars-per-token", type=float, default=4.0,
                   help="prompt characters per token (about 4 for SmolLM2's BPE on English)")
    p.add_argument("--start-timeout", type=float, default=1800.0, help="seconds per server")
    p.add_argument("--json", required=True, help="write the results here")
    return p


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, dict[int, int]]:
    """The arguments, checked (argparse's exit and message where they are wrong), and the
    ``--requests`` pairs as ``{concurrency: requests}``."""
    p = _parser()
    args = p.parse_args(argv)
    if sum(x is not None for x in (args.vllm_python, args.peer_cmd, args.llama_cpp)) != 1:
        p.error("give exactly one of --vllm-python, --peer-cmd or --llama-cpp")
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


def _peer(args, folder: Path, name: str, max_len: int, decode: dict | None) -> tuple:
    """``(label, version, argv for a port, env)`` of the engine beside ours: llama.cpp, vLLM
    or the ``--peer-cmd`` stand-in."""
    if args.llama_cpp:
        from llminfra.bench import llamacpp
        return ("llama.cpp", llamacpp.version(args.llama_cpp),
                lambda port: llamacpp.server_command(
                    args.llama_cpp, decode["f32_gguf"], name, port, args.threads,
                    max(CONCURRENCY), max_len), None)
    if args.vllm_python:
        # vLLM's CPU backend: KV cache space in GiB; its OpenMP threads bound to cores
        # 0 .. threads-1, as many as ours get ("auto" would keep one core for its front end)
        env = {"VLLM_CPU_KVCACHE_SPACE": "2",
               "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}"}
        return ("vllm", _peer_version(args.vllm_python),
                lambda port: vllm_command(args.vllm_python, folder, name, port, max_len), env)
    return ("peer", None, lambda port: shlex.split(args.peer_cmd.format(
        folder=folder, name=name, port=port, threads=args.threads)), None)


def _report(args, requests: dict, results: dict, peer_label: str, peer_version, max_len: int,
            decode: dict | None) -> dict:
    """The JSON: environment, settings, greedy agreement, every server's runs and the ratio of
    our output tokens/s to the peer's per concurrency."""
    from llminfra.bench.timing import cpu_name, environment
    ours, theirs = results["llminfra"], results[peer_label]
    ratio = {c: ours["concurrency"][c]["output_tokens_per_s"]
             / (theirs["concurrency"][c]["output_tokens_per_s"] or math.nan)
             for c in ours["concurrency"]}
    report = {
        "environment": {**environment(), "cpu_name": cpu_name(), "peer": peer_label,
                        "peer_version": peer_version},
        "model": args.model, "weights": "exported from the GGUF to a safetensors folder, fp32"
        + ("; llama.cpp: the GGUF rewritten in F32 by llama-quantize" if decode else ""),
        "settings": {"threads": args.threads, "requests": requests,
                     "matmul": resolve_matmul(args.matmul, args.model),
                     "output_tokens": OUTPUT_TOKENS, "max_model_len": max_len,
                     "probe_tokens": PROBE_TOKENS, "ignore_eos": True, "temperature": 0,
                     "chars_per_token": args.chars_per_token},
        "greedy_agreement": agreement(ours["probe_texts"], theirs["probe_texts"]),
        "servers": results,
        "throughput_llminfra_over_peer": ratio,
    }
    if decode is not None:
        report["batch1_decode"] = {k: v for k, v in decode.items() if k != "f32_gguf"}
    return report


def main(argv: list[str] | None = None) -> dict:
    """Export the model, serve it on both engines, measure, and write the JSON (the module
    docstring); returns what it wrote."""
    args, requests = _parse(argv)
    import torch

    from llminfra.model import load_model
    from llminfra.model.hf_export import export_hf_folder

    name = "smollm2-135m" if args.model == "smollm2-135m" else Path(args.model).stem
    with tempfile.TemporaryDirectory(prefix="compare-engines-") as tmp:
        tmp = Path(tmp)
        model, tok = load_model(args.model, torch.float32)
        folder = export_hf_folder(model, tok, tmp / name)
        max_len = min(MAX_MODEL_LEN, model.config.max_seq_len)
        decode = None if args.llama_cpp is None else _decode_side_by_side(
            args.llama_cpp, args.model, model, tok, tmp)
        del model
        peer_label, peer_version, peer, env = _peer(args, folder, name, max_len, decode)
        ours = (lambda port: llminfra_command(folder, name, port, args.threads, args.matmul),
                None)
        results = run_both({peer_label: (peer, env), "llminfra": ours}, name, requests, max_len,
                           args.chars_per_token, tmp, args.start_timeout)
    report = _report(args, requests, results, peer_label, peer_version, max_len, decode)
    out = Path(args.json)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
