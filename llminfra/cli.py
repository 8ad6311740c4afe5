"""Command line: ``python -m llminfra memory | models | gpus | bench | cost | serve | loadtest |
kernels`` (also ``llminfra …``).

Every command prints a table for people and, with ``--json``, the same numbers for programs.
Bad input exits with status 2 and one line naming the bad value and what is allowed: every
number is checked against its range when the options are parsed (:mod:`llminfra.cli_numbers`),
before anything runs, and a result too large for a float says so instead of printing ``inf``.
Output into a pipe that closes early (``llminfra models --json | head -c 100``) ends quietly.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys

from llminfra.calc import memory as mem
from llminfra.cli_numbers import integer, json_path, json_text, number
from llminfra.cli_serving import add_serving_parsers, loadtest, serve
from llminfra.specs import get_gpu, get_model, gpu_names, model_names


#: sizes the memory command accepts: far beyond anything served today, so a bigger one is
#: almost surely a typo (its figures would be meaningless); a model's own limit comes first
MAX_BATCH = 1_000_000        # sequences
MAX_CONTEXT = 10_000_000     # tokens, for models that list no maximum context
#: the same kind of bound for the GPU count of ``cost selfhost``
MAX_GPUS = 1_000_000


def _check_memory_args(args) -> None:
    """``ValueError`` for sizes no deployment has, and for ``--reserve`` without ``--gpu``."""
    if args.reserve is not None and not args.gpu:
        raise ValueError("--reserve needs --gpu: it is the share of that GPU's memory held "
                         "back for the runtime")
    if get_model(args.model).max_positions is None and args.context > MAX_CONTEXT:
        raise ValueError(f"--context {args.context}: {args.model} lists no maximum context, and "
                         f"this calculator accepts up to {MAX_CONTEXT:,} tokens")


def _memory(args) -> dict:
    _check_memory_args(args)
    window = args.sliding_window
    if args.gpu:
        reserve = mem.DEFAULT_RESERVE_FRACTION if args.reserve is None else args.reserve
        result = mem.fits(args.model, args.gpu, args.dtype, args.kv_dtype, args.context,
                          args.batch, reserve, sliding_window=window)
        result["max_batch"] = mem.max_batch(args.model, args.gpu, args.context, args.dtype,
                                            args.kv_dtype, reserve, sliding_window=window)
    else:
        result = mem.inference_memory(args.model, args.dtype, args.kv_dtype, args.context,
                                      args.batch, sliding_window=window).to_dict()
    from llminfra.calc.step import weight_bytes_read
    result["decode_weight_bytes_read"] = weight_bytes_read(args.model, args.dtype, args.batch)
    result["kv_bytes_windowed"] = mem.kv_bytes(args.model, args.context, args.batch,
                                               result["kv_dtype"], sliding_window=True)
    return result


def _format_memory(r: dict) -> str:
    lines = [f"{r['model']}: {r['params']:,} parameters, weights in {r['dtype']}, "
             f"KV cache in {r['kv_dtype']}, {r['batch']} x {r['context']} tokens"]
    for key in ("weight_bytes", "kv_bytes", "activation_bytes", "total_bytes"):
        lines.append(f"  {key:<18} {mem.gb(r[key]):10.3f} GB  {mem.gib(r[key]):10.3f} GiB")
    lines.append(f"  kv_bytes_per_token {r['kv_bytes_per_token']:,} bytes ({r['attention']})")
    if r["active_params"] != r["params"]:
        lines.append(f"  mixture of experts: all {r['params']:,} parameters stored, "
                     f"{r['active_params']:,} used per token; a decode step of the batch reads "
                     f"{mem.gb(r['decode_weight_bytes_read']):.3f} GB of weights")
    if r["sliding_window"]:
        lines.append(f"  sliding window {r['sliding_window']:,}: KV "
                     f"{mem.gb(r['kv_bytes_windowed']):.3f} GB with a rolling buffer of the window "
                     f"(--sliding-window), {mem.gb(r['kv_bytes_full_attention']):.3f} GB with "
                     f"every token kept; counted above: {r['kv_tokens_per_sequence']:,} tokens")
    if "gpu" in r:
        lines.append(f"  on {r['gpu']} ({mem.gib(r['gpu_memory_bytes']):.4g} GiB, "
                     f"{r['reserve_fraction']:.0%} reserved, source confidence: "
                     f"{r['gpu_confidence']}): {'fits' if r['fits'] else 'does NOT fit'}; "
                     f"largest batch at this context: {r['max_batch']}")
    return "\n".join(lines)


def _models() -> list[dict]:
    from llminfra.calc.params import active_param_count, param_count
    from llminfra.specs.models import published_params
    rows = []
    for name in model_names():
        s = get_model(name)
        d = s.to_dict()
        d.update(params=param_count(s), total_params=param_count(s),
                 active_params=active_param_count(s),
                 active_params_with_input_embedding=active_param_count(s),
                 active_params_without_input_embedding=active_param_count(
                     s, include_input_embedding=False),
                 kv_bytes_per_token_bf16=mem.kv_bytes_per_token(s, "bf16"))
        pub = published_params(s)
        if pub is not None:
            d["published_params"] = {
                **pub, "active_convention": ("with the input embedding"
                                             if pub.get("active_counts_input_embedding", True)
                                             else "without the input embedding")}
        d["sources"] = list(d["sources"])
        rows.append(d)
    return rows


def _format_models(rows: list[dict]) -> str:
    out = [f"{'name':<16} {'params':>17} {'active':>17} {'attn':>4} {'layers':>6} {'hidden':>6} "
           f"{'heads':>5} {'kv':>3} {'KV B/token (bf16)':>18}"]
    for r in rows:
        out.append(f"{r['name']:<16} {r['params']:>17,} {r['active_params']:>17,} "
                   f"{r['attention']:>4} {r['num_layers']:>6} "
                   f"{r['hidden_size']:>6} {r['num_heads']:>5} {r['num_kv_heads']:>3} "
                   f"{r['kv_bytes_per_token_bf16']:>18,}")
    return "\n".join(out)


def _format_gpus(rows: list[dict]) -> str:
    def tf(r, sparse):
        v = (r["peak_tflops"].get("bf16") or {}).get("sparse" if sparse else "dense")
        return "-" if v is None else f"{v:g}"
    out = [f"{'name':<17} {'memory (vendor unit)':>20} {'GB/s':>6} {'bf16 dense':>10} "
           f"{'bf16 sparse':>11}  confidence"]
    for r in rows:
        memory = f"{r['memory_gb']:g} {r['memory_unit']}"
        out.append(f"{r['name']:<17} {memory:>20} {r['bandwidth_gb_per_s']:>6g} "
                   f"{tf(r, False):>10} {tf(r, True):>11}  {r['confidence']}")
    return "\n".join(out)


def _bench(args) -> int:
    from llminfra.bench import load_suite
    suite = load_suite(args.suite)
    path = json_path(args.json) if args.json else None
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
        path.write_text(json_text(result))
        print(f"wrote {path}")
    return 0


def _add_cost_parser(sub) -> None:
    """``cost api …`` and ``cost selfhost …``: prices are inputs (see chapter 09)."""
    c = sub.add_parser("cost", help="monthly API cost, or self-hosted cost per token")
    csub = c.add_subparsers(dest="cost_kind", required=True)
    a = csub.add_parser("api", help="monthly bill of a hosted API (prices per million tokens)")
    at_least_0 = number(0)
    a.add_argument("--requests-per-day", type=at_least_0, required=True)
    a.add_argument("--input-tokens", type=at_least_0, required=True, help="per request")
    a.add_argument("--output-tokens", type=at_least_0, required=True, help="per request")
    a.add_argument("--input-price", type=number(0, unit="USD"), required=True,
                   help="USD per million tokens")
    a.add_argument("--output-price", type=number(0, unit="USD"), required=True,
                   help="USD per million tokens")
    a.add_argument("--days", type=number(0, low_open=True, unit="days"), default=30,
                   help="days in the month")
    a.add_argument("--json", action="store_true", help="print JSON")
    h = csub.add_parser("selfhost", help="USD per million tokens on GPUs paid by the hour")
    h.add_argument("--gpu-hour-price", type=number(0, unit="USD"), required=True,
                   help="USD per GPU hour")
    h.add_argument("--tokens-per-s", type=number(0, low_open=True, unit="tokens per second"),
                   required=True, help="throughput while busy")
    h.add_argument("--utilization", type=number(0, 1, low_open=True), default=1.0,
                   help="share of hours busy, (0, 1]")
    h.add_argument("--n-gpus", type=integer(1, MAX_GPUS, unit="GPUs"), default=1,
                   help="GPUs serving that throughput")
    h.add_argument("--json", action="store_true", help="print JSON")


def _check_finite(result: dict, advice: str) -> None:
    """``ValueError`` when a figure of ``result`` overflowed a float (it would print ``inf``)."""
    for key, value in result.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key} overflows: it passes the largest float (about 1.8e308); "
                             f"{advice}")


def _cost(args) -> str:
    from llminfra.calc import cost
    if args.cost_kind == "api":
        r = cost.api_monthly_cost(args.requests_per_day, args.input_tokens, args.output_tokens,
                                  args.input_price, args.output_price, args.days).to_dict()
        _check_finite(r, "give smaller --requests-per-day, --input-tokens, --output-tokens, "
                         "prices or --days")
        text = (f"{r['monthly_input_tokens']:,.0f} input + {r['monthly_output_tokens']:,.0f} "
                f"output tokens in {r['days']:g} days: {r['monthly_input_cost']:,.2f} + "
                f"{r['monthly_output_cost']:,.2f} = {r['monthly_cost']:,.2f} USD")
    else:
        r = {"gpu_hour_price": args.gpu_hour_price, "tokens_per_s": args.tokens_per_s,
             "utilization": args.utilization, "n_gpus": args.n_gpus,
             "cost_per_million_tokens": cost.selfhost_cost_per_million_tokens(
                 args.gpu_hour_price, args.tokens_per_s, args.utilization, args.n_gpus)}
        _check_finite(r, "give a larger --tokens-per-s or --utilization, or a smaller "
                         "--gpu-hour-price or --n-gpus")
        text = (f"{r['n_gpus']:g} GPU(s) at {r['gpu_hour_price']:g} USD/h, "
                f"{r['tokens_per_s']:g} tokens/s, busy {r['utilization']:.0%}: "
                f"{r['cost_per_million_tokens']:.4g} USD per million tokens")
    return json.dumps(r, indent=2) if args.json else text


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like the others (no usage block above them)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="llminfra", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("memory", help="weights + KV cache + activations for serving a model")
    m.add_argument("--model", required=True, help="preset name (see `llminfra models`)")
    m.add_argument("--dtype", default="bf16", help="weight dtype: fp32 bf16 fp16 fp8 int8 int4 nf4")
    m.add_argument("--kv-dtype", default=None,
                   help="KV cache dtype: bf16 fp16 fp32 fp8 int8 int4 (default: the compute "
                        "dtype; quantized caches are counted with per-tensor scales)")
    m.add_argument("--sliding-window", action="store_true",
                   help="keep only the model's sliding window of tokens per layer (a rolling "
                        "buffer, Mistral-7B: 4096); default: every token kept")
    m.add_argument("--context", type=integer(1, unit="tokens"), default=2048,
                   help="tokens per sequence")
    m.add_argument("--batch", type=integer(1, MAX_BATCH, unit="sequences"), default=1,
                   help="sequences served at once")
    m.add_argument("--gpu", default=None, help="GPU preset (see `llminfra gpus`)")
    m.add_argument("--reserve", type=number(0, 1, high_open=True), default=None,
                   help="share of GPU memory held back for the runtime (with --gpu; default "
                        f"{mem.DEFAULT_RESERVE_FRACTION})")
    m.add_argument("--json", action="store_true", help="print JSON")

    for name, text in (("models", "list the model presets"), ("gpus", "list the GPU catalog")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--json", action="store_true", help="print JSON")

    b = sub.add_parser("bench", help="run a benchmark suite")
    from llminfra.bench import SUITES
    b.add_argument("suite", help=" | ".join(SUITES))
    b.add_argument("--json", default=None, metavar="PATH", help="also write the numbers here")
    b.add_argument("--quick", action="store_true", help="smaller sizes, same keys")
    _add_cost_parser(sub)
    add_serving_parsers(sub)
    k = sub.add_parser("kernels", help="build the C kernels now, or say what is built and "
                                       "what runs without them")
    k.add_argument("action", choices=("build", "info"))
    k.add_argument("--arch", default="native",
                   help="build: native (default), portable, or a -march value (x86-64-v3)")
    k.add_argument("--json", action="store_true", help="info: print JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit status (2 for bad input, argparse's own errors too).

    A reader that closes the pipe early (``llminfra gpus | head -1``) ends the command quietly,
    as the Python documentation's recipe for ``SIGPIPE`` does: stdout is pointed at
    ``os.devnull`` so that the interpreter's last flush cannot fail again, and the status is 1.
    """
    try:
        code = _main(argv)
        sys.stdout.flush()                 # a closed pipe shows here rather than at exit
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return code


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:                # --help, or a usage error already printed
        return int(e.code or 0)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # else one line per HTTP request
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
        elif args.command == "cost":
            print(_cost(args))
        elif args.command == "serve":
            return serve(args)
        elif args.command == "loadtest":
            return loadtest(args)
        elif args.command == "kernels":
            from llminfra.kernels.cli import run
            return run(args.action, as_json=args.json, arch=args.arch)
    except (KeyError, ValueError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"llminfra {args.command}: {msg}", file=sys.stderr)
        return 2
    return 0
