"""Command line: ``python -m llminfra memory | models | gpus | bench`` (also ``llminfra …``).

Every command prints a table for people and, with ``--json``, the same numbers for programs.
Bad input exits with status 2 and one line naming the bad value and what is allowed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from llminfra.calc import memory as mem
from llminfra.specs import get_gpu, get_model, gpu_names, model_names


#: sizes the memory command accepts: far beyond anything served today, so a bigger one is
#: almost surely a typo (its figures would be meaningless); a model's own limit comes first
MAX_BATCH = 1_000_000        # sequences
MAX_CONTEXT = 10_000_000     # tokens, for models that list no maximum context


def _check_memory_args(args) -> None:
    """``ValueError`` for sizes no deployment has, and for ``--reserve`` without ``--gpu``."""
    if args.reserve is not None and not args.gpu:
        raise ValueError("--reserve needs --gpu: it is the share of that GPU's memory held "
                         "back for the runtime")
    if args.batch > MAX_BATCH:
        raise ValueError(f"--batch {args.batch} is beyond the {MAX_BATCH:,} sequences this "
                         "calculator accepts (a batch that large is almost surely a typo)")
    if get_model(args.model).max_positions is None and args.context > MAX_CONTEXT:
        raise ValueError(f"--context {args.context}: {args.model} lists no maximum context, and "
                         f"this calculator accepts up to {MAX_CONTEXT:,} tokens")


def _memory(args) -> dict:
    _check_memory_args(args)
    if args.gpu:
        reserve = mem.DEFAULT_RESERVE_FRACTION if args.reserve is None else args.reserve
        result = mem.fits(args.model, args.gpu, args.dtype, args.kv_dtype, args.context,
                          args.batch, reserve)
        result["max_batch"] = mem.max_batch(args.model, args.gpu, args.context, args.dtype,
                                            args.kv_dtype, reserve)
    else:
        result = mem.inference_memory(args.model, args.dtype, args.kv_dtype, args.context,
                                      args.batch).to_dict()
    return result


def _format_memory(r: dict) -> str:
    lines = [f"{r['model']}: {r['params']:,} parameters, weights in {r['dtype']}, "
             f"KV cache in {r['kv_dtype']}, {r['batch']} x {r['context']} tokens"]
    for key in ("weight_bytes", "kv_bytes", "activation_bytes", "total_bytes"):
        lines.append(f"  {key:<18} {mem.gb(r[key]):10.3f} GB  {mem.gib(r[key]):10.3f} GiB")
    lines.append(f"  kv_bytes_per_token {r['kv_bytes_per_token']:,} bytes")
    if "gpu" in r:
        lines.append(f"  on {r['gpu']} ({mem.gb(r['gpu_memory_bytes']):.0f} GB, "
                     f"{r['reserve_fraction']:.0%} reserved, source confidence: "
                     f"{r['gpu_confidence']}): {'fits' if r['fits'] else 'does NOT fit'}; "
                     f"largest batch at this context: {r['max_batch']}")
    return "\n".join(lines)


def _models() -> list[dict]:
    from llminfra.calc.params import active_param_count, param_count
    rows = []
    for name in model_names():
        s = get_model(name)
        d = s.to_dict()
        d.update(params=param_count(s), active_params=active_param_count(s),
                 kv_bytes_per_token_bf16=mem.kv_bytes_per_token(s, "bf16"))
        d["sources"] = list(d["sources"])
        rows.append(d)
    return rows


def _format_models(rows: list[dict]) -> str:
    out = [f"{'name':<15} {'params':>16} {'attn':>4} {'layers':>6} {'hidden':>6} "
           f"{'heads':>5} {'kv':>3} {'KV B/token (bf16)':>18}"]
    for r in rows:
        out.append(f"{r['name']:<15} {r['params']:>16,} {r['attention']:>4} {r['num_layers']:>6} "
                   f"{r['hidden_size']:>6} {r['num_heads']:>5} {r['num_kv_heads']:>3} "
                   f"{r['kv_bytes_per_token_bf16']:>18,}")
    return "\n".join(out)


def _format_gpus(rows: list[dict]) -> str:
    def tf(r, sparse):
        v = (r["peak_tflops"].get("bf16") or {}).get("sparse" if sparse else "dense")
        return "-" if v is None else f"{v:g}"
    out = [f"{'name':<17} {'memory GB':>9} {'GB/s':>6} {'bf16 dense':>10} {'bf16 sparse':>11}  confidence"]
    for r in rows:
        out.append(f"{r['name']:<17} {r['memory_gb']:>9g} {r['bandwidth_gb_per_s']:>6g} "
                   f"{tf(r, False):>10} {tf(r, True):>11}  {r['confidence']}")
    return "\n".join(out)


def _json_path(text: str) -> Path:
    """``--json PATH`` checked before a benchmark runs: not a directory, its folder creatable
    and writable (``ValueError`` naming the path otherwise)."""
    path = Path(text)
    if path.is_dir():
        raise ValueError(f"--json {path} is a directory; give a file path, "
                         f"e.g. {path / 'bench.json'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--json {path}: cannot create its folder ({e.strerror})") from e
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"--json {path} is not writable")
    return path


def _bench(args) -> int:
    from llminfra.bench import load_suite
    suite = load_suite(args.suite)
    path = _json_path(args.json) if args.json else None
    if args.suite == "gpu" and args.quick:
        raise ValueError("bench gpu has no --quick mode: it runs every suite's GPU checks at "
                         "their one size")
    if args.suite == "gpu":
        from llminfra.bench.gpu import NoGPUError
        try:
            result = suite.run()
        except NoGPUError as e:
            print(f"bench gpu: {e}", file=sys.stderr)
            return 1
    else:
        result = suite.run(quick=args.quick)
    print(suite.format_table(result))
    if path is not None:
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llminfra", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("memory", help="weights + KV cache + activations for serving a model")
    m.add_argument("--model", required=True, help="preset name (see `llminfra models`)")
    m.add_argument("--dtype", default="bf16", help="weight dtype: fp32 bf16 fp16 fp8 int8 int4 nf4")
    m.add_argument("--kv-dtype", default=None, help="KV cache dtype (default: the compute dtype)")
    m.add_argument("--context", type=int, default=2048, help="tokens per sequence")
    m.add_argument("--batch", type=int, default=1, help="sequences served at once")
    m.add_argument("--gpu", default=None, help="GPU preset (see `llminfra gpus`)")
    m.add_argument("--reserve", type=float, default=None,
                   help="share of GPU memory held back for the runtime (with --gpu; default "
                        f"{mem.DEFAULT_RESERVE_FRACTION})")
    m.add_argument("--json", action="store_true", help="print JSON")

    for name, text in (("models", "list the model presets"), ("gpus", "list the GPU catalog")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--json", action="store_true", help="print JSON")

    b = sub.add_parser("bench", help="run a benchmark suite")
    b.add_argument("suite", help="attention | kvcache | quant | parallel | gpu")
    b.add_argument("--json", default=None, metavar="PATH", help="also write the numbers here")
    b.add_argument("--quick", action="store_true", help="smaller sizes, same keys")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "memory":
            r = _memory(args)
            print(json.dumps(r, indent=2) if args.json else _format_memory(r))
        elif args.command == "models":
            rows = _models()
            print(json.dumps(rows, indent=2) if args.json else _format_models(rows))
        elif args.command == "gpus":
            rows = [get_gpu(n).to_dict() for n in gpu_names()]
            print(json.dumps(rows, indent=2) if args.json else _format_gpus(rows))
        elif args.command == "bench":
            return _bench(args)
    except (KeyError, ValueError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"llminfra {args.command}: {msg}", file=sys.stderr)
        return 2
    return 0
