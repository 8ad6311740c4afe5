"""``python -m llminfra kernels build | info``: the C library's build as a step a learner runs
and reads.

``build`` compiles the library for this CPU now (again, even where a failure was remembered)
and says where it went and which code path it has. ``info`` changes nothing: the compiler and
its version, the cache folder and file, whether a build is there and loads, the ISA path it
holds, and for each kernel what runs there and what the course runs without the library.
Chapter 12.
"""

from __future__ import annotations

import json
import sys

import torch

from llminfra.kernels.abi import load
from llminfra.kernels.build import build, cached, find_compiler
from llminfra.kernels.cache import cache_dir
from llminfra.quant.cpu_kernels import kernels_available

#: (kernel, its C functions and file, what runs in its place without the library)
KERNELS = (
    ("int4 matmul", "w4a8_gemm (csrc/w4a8.c): int4 weights x int8 activations",
     "PyTorch's int4 kernel (llminfra.quant.int4_linear)"),
    ("fp32 few-row matmul", "f32_skinny_gemm (csrc/f32_skinny.c): 1-2 rows, W streamed once",
     "oneDNN's prepacked weights (llminfra.runner.prepacked)"),
    ("fp32 panel matmul", "f32_panel_gemm (csrc/f32_panels.c): more rows, W in panels",
     "oneDNN's prepacked weights (llminfra.runner.prepacked)"),
    ("paged attention", "paged_decode_f32, rope_write_f32 (csrc/paged_decode.c): blocks read "
     "in place", "torch's gather of the K/V blocks and SDPA"),
    ("one-call step", "w4a8_decode_stack (csrc/decode_stack.c): a decode step in one call",
     "the Python step (llminfra.runner.fast_step.decode_step)"),
)


def _fallbacks() -> dict[str, str]:
    """What each kernel's torch path is on this PyTorch (oneDNN or int4 missing: said so)."""
    onednn = bool(torch.backends.mkldnn.is_available())
    out = {name: without for name, _, without in KERNELS}
    if not onednn:
        for name in ("fp32 few-row matmul", "fp32 panel matmul"):
            out[name] = "F.linear (this PyTorch has no oneDNN)"
    if not kernels_available():
        out["int4 matmul"] = "dequantize then matmul (this PyTorch has no int4 CPU kernel)"
    return out


def info() -> dict:
    """The build's state here, changing nothing (see the module): ``compiler`` (path, command,
    version, or the error), ``cache_dir``, ``file``, ``loaded``, ``isa``, ``reason`` (why not
    loaded) and ``kernels`` (one dict a kernel: ``runs`` now, ``c_function``,
    ``without_library``)."""
    try:
        c = find_compiler()
        compiler = {"path": c.path, "command": list(c.command), "version": c.version}
    except RuntimeError as e:
        compiler = {"path": None, "error": str(e)}
    path, reason = cached()
    lib = None
    if path is not None:
        try:
            lib = load(path)
        except (RuntimeError, OSError) as e:
            reason = str(e)
    fallbacks = _fallbacks()
    rows = [{"kernel": name, "c_function": fn, "without_library": fallbacks[name],
             "runs": fn.split(" (")[0] if lib is not None else fallbacks[name]}
            for name, fn, _ in KERNELS]
    return {"compiler": compiler, "cache_dir": str(cache_dir()),
            "file": None if path is None else str(path), "loaded": lib is not None,
            "isa": None if lib is None else lib.isa, "reason": reason or None, "kernels": rows}


def format_info(r: dict) -> str:
    """:func:`info` as lines for people."""
    c = r["compiler"]
    version = (c.get("version") or "version unknown").splitlines()[0] if c["path"] else ""
    lines = [f"compiler    {c['path']} ({version})" if c["path"] else
             f"compiler    none: {c['error']}",
             f"cache       {r['cache_dir']}",
             f"library     {r['file'] or '-'}",
             f"loaded      {'yes, ISA path ' + r['isa'] if r['loaded'] else 'no'}"]
    if not r["loaded"]:
        lines.append(f"why not     {r['reason'].splitlines()[0]}")
        lines.append("            every kernel runs its torch path (below)")
    width = max(len(k["kernel"]) for k in r["kernels"])
    lines.append("")
    for k in r["kernels"]:
        lines.append(f"{k['kernel']:<{width}}  {k['c_function']}")
        lines.append(f"{'':<{width}}  without the library: {k['without_library']}")
    return "\n".join(lines)


def run(action: str, as_json: bool = False, arch: str = "native") -> int:
    """``kernels build`` (``arch``: ``native``, ``portable`` or a ``-march`` value) or
    ``kernels info`` (``as_json``: :func:`info` as JSON); prints, returns the exit status (1
    where the build fails, with the compiler's message on stderr)."""
    if action == "info":
        r = info()
        print(json.dumps(r, indent=2) if as_json else format_info(r))
        return 0
    if action != "build":
        raise ValueError(f"kernels {action!r}; allowed: 'build', 'info'")
    try:
        path = build(arch, retry=True)
        lib = load(path)
    except RuntimeError as e:
        print(f"llminfra kernels build: {e}\nthe course runs its torch paths without the "
              f"library (python -m llminfra kernels info)", file=sys.stderr)
        return 1
    print(f"library  {path}\nISA path {lib.isa}")
    return 0
