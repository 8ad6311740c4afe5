"""llama.cpp as a peer (llminfra.bench.llamacpp): its tools found or refused by name, llama-bench's
JSON read (a stand-in script prints what llama-bench prints), llama-server's command line; and,
where llama.cpp is built (LLAMA_CPP_DIR, as `make compare-engines` builds it), the real tools
on an exported GGUF."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llminfra.bench import llamacpp
from llminfra.bench.server_process import free_port


def _fake_tool(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(f"#!{sys.executable}\nimport sys, json\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_missing_and_unknown_tools_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="llama-bench not found: build llama.cpp"):
        llamacpp.tool(tmp_path, "llama-bench")
    with pytest.raises(KeyError, match="llama-cli"):
        llamacpp.tool(tmp_path, "llama-cli")


def test_llama_bench_json_is_read(tmp_path):
    rows = [{"n_prompt": 64, "n_gen": 0, "avg_ts": 250.0, "stddev_ts": 3.0,
             "model_type": "llama ?B all F32", "build_commit": "4227c9b", "cpu_info": "x"},
            {"n_prompt": 0, "n_gen": 64, "avg_ts": 40.0, "stddev_ts": 0.5,
             "model_type": "llama ?B all F32", "build_commit": "4227c9b", "cpu_info": "x"}]
    _fake_tool(tmp_path, "llama-bench", f"print(json.dumps({rows!r}))")
    r = llamacpp.llama_bench(tmp_path, tmp_path / "m.gguf", threads=1, prompt=64, tokens=64)
    assert (r["pp_tokens_per_s"], r["tg_tokens_per_s"], r["tg_ms_per_token"]) == (250.0, 40.0,
                                                                                    25.0)
    assert r["build_commit"] == "4227c9b" and r["command"][-2:] == ["-o", "json"]
    _fake_tool(tmp_path, "llama-bench", "sys.stderr.write('no model'); sys.exit(3)")
    with pytest.raises(RuntimeError, match="llama-bench failed \\(3\\):\nno model"):
        llamacpp.llama_bench(tmp_path, tmp_path / "m.gguf")


def test_quantize_failure_and_server_command(tmp_path):
    _fake_tool(tmp_path, "llama-quantize", "sys.stderr.write('bad file'); sys.exit(1)")
    with pytest.raises(RuntimeError, match="llama-quantize failed"):
        llamacpp.f32_gguf(tmp_path, tmp_path / "a.gguf", tmp_path / "b.gguf")
    _fake_tool(tmp_path, "llama-server", "print('version: 1 (4227c9b)')")
    assert llamacpp.version(tmp_path) == "version: 1 (4227c9b)"
    port = free_port()                    # only written into the command line, never bound
    argv = llamacpp.server_command(tmp_path, Path("m.gguf"), "smollm2-135m", port, 2, 16, 512)
    assert argv[argv.index("-np") + 1] == "16" and argv[argv.index("-c") + 1] == str(16 * 512)
    assert argv[argv.index("--port") + 1] == str(port) and "--alias" in argv


def test_compare_engines_runs_every_peer_given(tmp_path):
    """vLLM and llama.cpp in one run: llama.cpp's F32 and Q4_1 servers beside ours of each format,
    vLLM's line chapter 10's with only the local folder, name and address added."""
    from argparse import Namespace

    from llminfra.bench.compare_servers import server_specs
    from llminfra.planning.commands import EngineLimits
    _fake_tool(tmp_path, "llama-server", "print('version: 1 (4227c9b)')")
    (tmp_path / "python").touch()
    args = Namespace(vllm_python=str(tmp_path / "python"), llama_cpp=str(tmp_path),
                     peer_cmd=None, formats=("fp32", "int4"), threads=2, matmul="auto")
    limits = EngineLimits("HuggingFaceTB/SmolLM2-135M-Instruct", 16, 512, "fp32")
    specs = server_specs(args, limits, Path("/m"), "smollm2-135m",
                         {"fp32": Path("f32.gguf"), "int4": Path("q4.gguf")})
    assert [(s.label, s.fmt) for s in specs] == [
        ("vllm", "fp32"), ("llama.cpp", "fp32"), ("llama.cpp Q4_1", "int4"),
        ("llminfra", "fp32"), ("llminfra w4a8", "int4")]
    port = free_port()                    # only written into the command lines, never bound
    vllm = specs[0].argv(port)
    assert vllm[:5] == [str(tmp_path / "python"), "-m", "vllm.entrypoints.openai.api_server",
                        "--model", "/m"]
    assert vllm[vllm.index("--max-num-seqs") + 1] == "16" and "--max-model-len" in vllm
    assert vllm[vllm.index("--dtype") + 1] == "float32" and vllm[-2:] == ["--port", str(port)]
    q4 = specs[2].argv(port)
    assert q4[q4.index("-m") + 1] == "q4.gguf"
    assert specs[1].version == "version: 1 (4227c9b)" and specs[0].env[
        "VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    w4a8 = specs[4].argv(port)
    assert w4a8[w4a8.index("--quantization") + 1] == "w4a8"
    assert w4a8[w4a8.index("--num-blocks") + 1] == str(16 * 512 // 16)


LLAMA_CPP_DIR = os.environ.get("LLAMA_CPP_DIR")


@pytest.mark.skipif(not LLAMA_CPP_DIR, reason="llama.cpp not built here: set LLAMA_CPP_DIR to "
                    "its bin folder (make compare-engines builds it); not counted as a pass")
@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_0", "F16"])
def test_exported_gguf_runs_in_llama_cpp_with_our_greedy_tokens(tmp_path, qtype):
    """The tiny model exported with its byte vocabulary loads in llama.cpp and generates; in F32
    its greedy tokens equal ours. The prompt goes as token ids: llama.cpp's SentencePiece-style
    tokenizer writes a space as "▁" (U+2581), which a byte vocabulary spells as three bytes, so
    a text prompt with spaces is not the prompt our tokenizer makes (checked too)."""
    import httpx

    from llminfra.bench.compare_engines import Server, free_port
    from llminfra.model import generate, load_tiny
    from llminfra.quant.gguf_export import export_gguf
    tiny, tok = load_tiny()
    path = export_gguf(tiny, tmp_path / f"tiny-{qtype}.gguf", qtype)
    port = free_port()
    ids = tok.encode("def json.dumps(obj)\n\nReturn ")
    with Server(llamacpp.server_command(LLAMA_CPP_DIR, path, "tiny", port, 1, 1, 256), port,
                tmp_path / "server.log") as server:
        server.wait_ready(120)
        theirs = httpx.post(f"{server.url}/tokenize", json={"content": tok.decode(ids)},
                            timeout=60).json()["tokens"]
        r = httpx.post(f"{server.url}/completion", json={
            "prompt": ids, "n_predict": 16, "temperature": 0, "top_k": 1,
            "cache_prompt": False, "return_tokens": True}, timeout=120)
        r.raise_for_status()
        got = r.json()["tokens"]
    assert theirs[:3] == ids[:3] and theirs[3:6] == [0xE2, 0x96, 0x81] != ids[3:6]
    assert len(got) == 16
    if qtype == "F32":
        assert got == generate(tiny, ids, 16)
