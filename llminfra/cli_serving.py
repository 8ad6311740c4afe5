"""The serving commands of :mod:`llminfra.cli`: ``serve`` (the OpenAI-compatible server) and
``loadtest`` (a load generator for any OpenAI-compatible endpoint). Building their parsers
imports neither torch nor the engine: both load when the command runs."""

from __future__ import annotations

import argparse

from llminfra.cli_numbers import integer, json_path, json_text, number, number_list

#: bounds for ``serve``: far beyond a CPU course server (vLLM's default is 256 sequences), so a
#: bigger number is almost surely a typo
MAX_NUM_SEQS = 100_000
MAX_NUM_BLOCKS = 10_000_000
MAX_THREADS = 1024
#: names the parser offers, copied so that building it does not import torch (3 s on every
#: command); tests/test_cli_hardening.py ties each to its source
POLICIES = ("static", "dynamic", "continuous")       # llminfra.engine.scheduler.POLICIES
WORKLOADS = ("alpaca", "sharegpt")                    # llminfra.kvcache.trace.WORKLOADS
UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
MAX_REQUESTS = 1_000_000                # llminfra.serving.loadtest.MAX_REQUESTS
MAX_CHARS_PER_TOKEN = 100.0             # llminfra.serving.loadtest.MAX_CHARS_PER_TOKEN
MAX_PREFIXES = 10_000                   # llminfra.serving.loadtest_workload.MAX_PREFIXES
MATMULS = ("auto", "plain", "onednn", "skinny")   # llminfra.serving.serve.MATMULS
RAMP_UP_STRATEGIES = ("linear", "exponential")  # llminfra.serving.loadtest_workload
MAX_PREFILL_CHUNK_TOKENS = 128          # llminfra.serving.serve.MAX_PREFILL_CHUNK_TOKENS


def serve(args) -> int:
    from llminfra.serving.serve import run_server
    run_server(args.host, args.port, log_level=args.log_level, model=args.model,
               num_blocks=args.num_blocks,
               max_num_seqs=args.max_num_seqs, policy=args.policy,
               num_threads=args.threads, engine_process=not args.engine_in_thread,
               speculative=args.speculative,
               num_speculative_tokens=args.num_speculative_tokens, matmul=args.matmul,
               max_prefill_chunk_tokens=args.max_prefill_chunk_tokens,
               runner=args.runner, cuda_graphs=args.cuda_graphs,
               quantization=args.quantization,
               limit_concurrency=args.max_connections,
               timeout_keep_alive_s=args.keep_alive_timeout,
               **{k: v for k, v in (("max_body_bytes", args.max_body_bytes),
                                    ("body_timeout_s", args.body_timeout)) if v is not None})
    return 0


def _ramp_up(args):
    """The ``RampUp`` of ``--ramp-up-strategy`` and its two rates, or None; ``ValueError``
    naming the options when they do not go together (vLLM's checks: both rates needed, the
    start not above the end; ``--rate`` and ``--concurrency`` argparse refuses beside it)."""
    rates = {"--ramp-up-start-rps": args.ramp_up_start_rps,
             "--ramp-up-end-rps": args.ramp_up_end_rps}
    given = [name for name, value in rates.items() if value is not None]
    if args.ramp_up_strategy is None:
        if given:
            raise ValueError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} "
                             "--ramp-up-strategy linear|exponential (in place of --rate)")
        return None
    if len(given) < 2:
        missing = " and ".join(name for name in rates if name not in given)
        raise ValueError(f"--ramp-up-strategy {args.ramp_up_strategy} needs both "
                         f"--ramp-up-start-rps and --ramp-up-end-rps (missing {missing})")
    if args.ramp_up_start_rps > args.ramp_up_end_rps:
        raise ValueError(f"--ramp-up-start-rps {args.ramp_up_start_rps:g} is above "
                         f"--ramp-up-end-rps {args.ramp_up_end_rps:g}: the rate ramps up")
    from llminfra.serving.loadtest import RampUp
    return RampUp(args.ramp_up_strategy, args.ramp_up_start_rps, args.ramp_up_end_rps)


def loadtest(args) -> int:
    ramp_up = _ramp_up(args)
    from llminfra.serving.loadtest import format_summary, parse_goodput, run_loadtest
    path = json_path(args.json) if args.json else None      # before the run, not after it
    goodput = parse_goodput(args.goodput) if args.goodput is not None else None
    r = run_loadtest(args.base_url, rate=args.rate if args.sweep_rates is None
                     else args.sweep_rates, concurrency=args.concurrency,
                     num_requests=args.requests, model=args.model, workload_name=args.workload,
                     arrivals=args.arrivals, seed=args.seed, max_model_len=args.max_model_len,
                     max_output_tokens=args.max_output_tokens,
                     chars_per_token=args.chars_per_token, ignore_eos=args.ignore_eos,
                     progress=not args.no_progress, burstiness=args.burstiness,
                     goodput=goodput, prefix_tokens=args.prefix_tokens,
                     num_prefixes=args.num_prefixes, ramp_up=ramp_up)
    print(format_summary(r))
    if path is not None:
        path.write_text(json_text(r))
        print(f"wrote {path}")
    return 0 if r["num_ok"] else 1


def add_serving_parsers(sub) -> None:
    """Add ``serve`` and ``loadtest`` to the command line's subparsers ``sub``."""
    _add_serve_parser(sub)
    _add_loadtest_parser(sub)


def _add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="the OpenAI-compatible server on a model")
    s.add_argument("--model", default="tiny",
                   help="tiny (default: the trained byte-level model, starts in a second), "
                        "smollm2-135m (the real SmolLM2-135M-Instruct), a .gguf file or a "
                        "Hugging Face folder")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    s.add_argument("--policy", default="continuous", choices=POLICIES,
                   help=" | ".join(POLICIES))
    s.add_argument("--num-blocks", type=integer(1, MAX_NUM_BLOCKS, unit="blocks"), default=None,
                   help="KV blocks in the pool")
    s.add_argument("--max-num-seqs", type=integer(1, MAX_NUM_SEQS, unit="sequences"),
                   default=64, help="largest running batch")
    s.add_argument("--max-prefill-chunk-tokens", type=integer(1, 2**20, unit="tokens"),
                   default=MAX_PREFILL_CHUNK_TOKENS,
                   help="most prompt tokens one request brings to a step (chunked prefill): a "
                        "long prompt is read this many tokens a step, beside the decodes and "
                        f"the new prompts (default: {MAX_PREFILL_CHUNK_TOKENS}, a quarter of "
                        "the step's 512-token budget)")
    s.add_argument("--threads", type=integer(1, MAX_THREADS, unit="threads"), default=None,
                   help="threads of torch and of the w4a8 kernel (default: torch's own count, "
                        "every core unless OMP_NUM_THREADS says otherwise)")
    s.add_argument("--speculative", default=None, choices=("ngram", "draft-int4"),
                   help="speculative decoding: prompt lookup, or an int4 copy of the model "
                        "drafting (adaptive γ; default: none)")
    s.add_argument("--num-speculative-tokens", type=integer(1, 16, unit="tokens"), default=4,
                   help="most drafts a step (default: 4)")
    s.add_argument("--matmul", default="auto", choices=MATMULS,
                   help="plain: F.linear, the readable model as it is; onednn: the weights "
                        "prepacked once for oneDNN, as vLLM's CPU backend runs them (about 2x "
                        "the tokens/s on a CPU, float32 rounding apart); skinny: every "
                        "product on the course's C kernels (1-2 rows streamed, more on "
                        "weights packed in panels: a decode step of many sequences, a prompt "
                        "chunk), a step in one C call; "
                        "auto (default): skinny for a real model where the C kernel builds (else "
                        "onednn), plain for the tiny one")
    s.add_argument("--runner", default="auto", choices=("auto", "readable", "fast"),
                   help="readable: the model as chapter 01 writes it, layer by layer; fast: "
                        "the same weights fused (25 torch calls a layer, CUDA graphs for "
                        "decode on a GPU); auto (default): fast wherever it takes the model")
    s.add_argument("--quantization", default=None, choices=("w4a8",),
                   help="w4a8: int4 weights (groups of 32, llama.cpp's Q4_1 layout) times int8 "
                        "activations in the course's C kernel, on the fast runner (default: "
                        "the model's own weights)")
    s.add_argument("--cuda-graphs", default=None, action=argparse.BooleanOptionalAction,
                   help="replay decode steps from CUDA graphs (fast runner; default: on "
                        "where the model is on CUDA)")
    s.add_argument("--log-level", default="info", choices=UVICORN_LOG_LEVELS,
                   help="uvicorn log level")
    s.add_argument("--engine-in-thread", action="store_true",
                   help="run the engine in a thread of the server process instead of a "
                        "process of its own (they then share one GIL)")
    _add_serve_limits(s)


def _add_serve_limits(s) -> None:
    """``serve``'s bounds on what one client can make the server hold."""
    # defaults: llminfra.serving.http_limits (not imported here: a command loads what it runs)
    s.add_argument("--max-body-bytes", type=integer(1, 2**31, unit="bytes"), default=None,
                   help="largest request body; larger gets 413 (default 1 MiB)")
    s.add_argument("--body-timeout", type=number(0, 3600, low_open=True, unit="seconds"),
                   default=None, help="seconds a request body may take to arrive; then 408 "
                                      "(default 30)")
    s.add_argument("--max-connections", type=integer(1, 100_000, unit="connections"),
                   default=None, help="connections and requests at once; 503 beyond "
                                      "(default 256)")
    s.add_argument("--keep-alive-timeout", type=number(0, 3600, low_open=True, unit="seconds"),
                   default=None, help="seconds an idle connection is kept (default 5)")


def _add_loadtest_parser(sub) -> None:
    t = sub.add_parser("loadtest", help="load-test an OpenAI-compatible endpoint")
    t.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    mode = t.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rate", type=number_list(0, low_open=True, unit="requests per second"),
                      help="requests per second (open loop); R1,R2,... runs a sweep")
    mode.add_argument("--sweep-rates", type=number_list(0, low_open=True, single=False,
                                                        unit="requests per second"),
                      default=None, metavar="R1,R2,...",
                      help="open-loop runs one after another, one summary a rate")
    mode.add_argument("--concurrency", type=integer(1, MAX_REQUESTS, unit="clients"),
                      help="clients in a closed loop")
    mode.add_argument("--ramp-up-strategy", default=None, choices=RAMP_UP_STRATEGIES,
                      help="open loop whose rate goes from --ramp-up-start-rps to "
                           "--ramp-up-end-rps by request index, linearly or exponentially "
                           "(vLLM's; in place of --rate)")
    t.add_argument("--requests", type=integer(1, MAX_REQUESTS, unit="requests"), default=100,
                   help="number of requests")
    t.add_argument("--arrivals", default="poisson", choices=("poisson", "fixed"),
                   help="poisson | fixed (with --rate)")
    t.add_argument("--model", default=None, help="model id (default: the first served)")
    t.add_argument("--workload", default="sharegpt", choices=WORKLOADS,
                   help=" | ".join(WORKLOADS) + " length trace")
    t.add_argument("--seed", type=integer(0, 2**64 - 1), default=0)
    t.add_argument("--max-model-len", type=integer(2, unit="tokens"), default=None,
                   help="cap prompt + output (default: the server's max_model_len or 2048)")
    t.add_argument("--max-output-tokens", type=integer(1, unit="tokens"), default=None)
    t.add_argument("--chars-per-token",
                   type=number(0, MAX_CHARS_PER_TOKEN, low_open=True, unit="characters"),
                   default=1.0,
                   help="prompt characters per token (1 for the byte model, ~4 for BPE)")
    t.add_argument("--burstiness", type=number(0, low_open=True), default=1.0,
                   help="gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more "
                        "even (vLLM's --burstiness)")
    t.add_argument("--ramp-up-start-rps", default=None,
                   type=number(0, low_open=True, unit="requests per second"),
                   help="rate of the first request (with --ramp-up-strategy)")
    t.add_argument("--ramp-up-end-rps", default=None,
                   type=number(0, low_open=True, unit="requests per second"),
                   help="rate of the last request (with --ramp-up-strategy; >= the start)")
    t.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS",
                   help="SLOs in ms, e.g. ttft:500 tpot:50 e2el:3000 (vLLM's syntax): "
                        "report the requests/s meeting all")
    t.add_argument("--prefix-tokens", type=integer(0, unit="tokens"), default=0,
                   help="shared-prefix workload: each prompt starts with one of "
                        "--num-prefixes prefixes of this many tokens (default 0: none)")
    t.add_argument("--num-prefixes", type=integer(1, MAX_PREFIXES, unit="prefixes"),
                   default=1, help="distinct shared prefixes (with --prefix-tokens)")
    t.add_argument("--ignore-eos", action="store_true", help="send vLLM's ignore_eos")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--json", default=None, metavar="PATH", help="also write the numbers here")
