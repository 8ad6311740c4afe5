"""``python -m llminfra serve [--model NAME]``: a model behind the OpenAI-compatible server.

Builds ``LLMEngine(load_model(NAME))`` with the given scheduler settings — ``tiny`` (the default:
the trained byte-level model, which starts in a second) or the real ``smollm2-135m`` (or a
``.gguf`` file, or a Hugging Face folder) — in a process of its own by default
(:mod:`llminfra.serving.engine_process`: the web layer and the engine then do not share one GIL),
or in a thread of the server's process with ``--engine-in-thread``; wraps it in
:func:`llminfra.serving.server.create_app` and runs uvicorn until SIGINT (Ctrl-C) or SIGTERM,
which uvicorn turns into a graceful shutdown: open responses get ``timeout_graceful_shutdown``
seconds, then the app's shutdown stops the engine loop and the process exits with status 0.

The web process holds only the tokenizer (:func:`llminfra.model.load_tokenizer`); the weights
live in the engine's process. What one client can make the server hold is bounded — request
bodies (``max_body_bytes``, ``body_timeout_s``) and uvicorn's connections
(:data:`~llminfra.serving.http_limits.UVICORN_LIMITS`), see :mod:`llminfra.serving.http_limits` —
and a public deployment puts a reverse proxy in front (README). Taught in chapter 05.
"""

from __future__ import annotations

import logging
import os

from llminfra.serving.http_limits import BODY_TIMEOUT_S, MAX_BODY_BYTES, UVICORN_LIMITS

log = logging.getLogger(__name__)

#: ``--speculative`` choices (None: plain decoding)
SPECULATIVE = (None, "ngram", "draft-int4")
#: seconds uvicorn lets open responses finish after SIGINT / SIGTERM
GRACEFUL_SHUTDOWN_S = 5
#: ``--max-prefill-chunk-tokens``: most prompt tokens one sequence brings to a step, a quarter
#: of the step's budget (``max_num_batched_tokens``, 512), so a long prompt leaves room in every
#: step for the decodes and the new prompts beside it (a short request then has its first token
#: one step after it arrives). Chosen by the run recorded in
#: ``llminfra/data/serve_prefill_chunk_cpu.json`` (a short request's TTFT behind a long prompt,
#: and the long prompt's own, by chunk size, on the real model): the smallest chunk at which
#: the long prompt was read no slower than with bigger ones; a short request's wait is then
#: one step of that chunk, where the whole budget made it wait for the whole long prompt
MAX_PREFILL_CHUNK_TOKENS = 128


def build_engine(model: str = "tiny", *, num_blocks: int | None = None, block_size: int = 16,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 512,
                 policy: str = "continuous", enable_chunked_prefill: bool = True,
                 max_prefill_chunk_tokens: int | None = MAX_PREFILL_CHUNK_TOKENS,
                 enable_prefix_caching: bool = False, num_threads: int | None = None,
                 speculative: str | None = None, num_speculative_tokens: int = 4,
                 matmul: str = "auto", runner: str = "auto",
                 cuda_graphs: bool | None = None, quantization: str | None = None):
    """A fresh ``LLMEngine`` on ``model`` (:func:`llminfra.model.load_model`: ``"tiny"``,
    ``"smollm2-135m"``, a ``.gguf`` file or a Hugging Face folder); ``num_threads`` sets torch's
    threads in the process that calls it (the engine's), and the w4a8 kernel takes as many
    (:func:`llminfra.kernels.w4a8.default_threads`). ``max_prefill_chunk_tokens``: most prompt
    tokens of one sequence in a step (chunked prefill, :mod:`llminfra.engine.scheduler`;
    None: the whole budget). ``speculative``: None, ``"ngram"``
    (prompt lookup) or ``"draft-int4"`` (an int4 copy of the model drafts), with the adaptive
    rule and at most ``num_speculative_tokens`` drafts a step. ``matmul``: ``"plain"``
    (``F.linear``), ``"onednn"`` (the weights prepacked once, :mod:`llminfra.runner.prepacked`),
    ``"skinny"`` (:mod:`llminfra.kernels.f32_skinny` for a decode step's rows, the fast runner) or
    ``"auto"``; ``runner``: ``"readable"``, ``"fast"`` or ``"auto"`` (both resolved by
    :func:`llminfra.runner.kernel_choice.engine_runner`); ``cuda_graphs``: None (on where the model is on CUDA), True or
    False (:mod:`llminfra.engine.model_runner`); ``quantization``: None, or ``"w4a8"`` (int4
    weights on the w4a8 kernel, the fast runner; ``runner="readable"`` is then refused)."""
    import torch

    from llminfra.engine import LLMEngine, SpeculativeConfig
    from llminfra.model import load_model
    from llminfra.quant import int4_linear
    from llminfra.runner import FastDecoder
    from llminfra.runner.kernel_choice import check_choices, engine_runner

    if speculative not in SPECULATIVE:
        raise ValueError(f"speculative {speculative!r}; allowed: {SPECULATIVE}")
    check_choices(matmul, runner, quantization)
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    net, tokenizer = load_model(model)
    net, chosen = engine_runner(net, model, matmul, runner, cuda_graphs, quantization)
    spec = None
    if speculative == "ngram":
        spec = SpeculativeConfig("ngram", num_speculative_tokens, adaptive=True)
    elif speculative == "draft-int4":
        spec = SpeculativeConfig("draft", num_speculative_tokens, adaptive=True,
                                 draft=FastDecoder(net, linear=int4_linear(64)))
    return LLMEngine(net, tokenizer, num_blocks=num_blocks, block_size=block_size,
                     max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     policy=policy, enable_chunked_prefill=enable_chunked_prefill,
                     max_prefill_chunk_tokens=max_prefill_chunk_tokens,
                     enable_prefix_caching=enable_prefix_caching, speculative=spec,
                     runner=chosen)


def served_name(model: str) -> str:
    """The id ``/v1/models`` gives ``model``: ``llminfra-tiny`` for the tiny model, the preset
    name or the file / folder name otherwise."""
    from pathlib import Path

    from llminfra.serving.server import DEFAULT_MODEL_NAME

    key = str(model).strip().lower()
    if key == "tiny":
        return DEFAULT_MODEL_NAME
    return key if "/" not in key and not key.endswith(".gguf") else Path(model).stem


def build_app(model: str = "tiny", *, model_name: str | None = None,
              engine_process: bool = True, max_body_bytes: int = MAX_BODY_BYTES,
              body_timeout_s: float = BODY_TIMEOUT_S, factory=None, start_timeout_s=120.0,
              **engine_kwargs):
    """The app serving ``model``. ``engine_process``: the engine runs in a process of its own
    (:class:`~llminfra.serving.engine_process.EngineProcess`, built there from
    :func:`build_engine`), else in a thread of this one. ``max_body_bytes`` and
    ``body_timeout_s`` bound request bodies (:func:`~llminfra.serving.server.create_app`).
    ``engine_kwargs`` go to :func:`build_engine` (in process mode a bad setting is reported
    when the engine process starts: :func:`run_server` starts it before listening).
    ``factory``: what builds the engine from ``(model, **engine_kwargs)`` (default
    :func:`build_engine`; a bench passes one that instruments it); ``start_timeout_s``: how long
    the engine process may take to build it."""
    from functools import partial

    from llminfra.model import load_tokenizer
    from llminfra.runner.kernel_choice import resolve_matmul
    from llminfra.serving.engine_process import EngineProcess
    from llminfra.serving.server import create_app

    name = model_name or served_name(model)
    limits = dict(max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s)
    factory = build_engine if factory is None else factory
    if not engine_process:
        engine = factory(model, **engine_kwargs)
        return create_app(engine, engine.tokenizer, model_name=name, **limits)
    tokenizer, config = load_tokenizer(model)
    env = engine_env(engine_kwargs.get("quantization"),
                     resolve_matmul(engine_kwargs.get("matmul", "auto"), model))
    return create_app(EngineProcess(partial(factory, model, **engine_kwargs), env=env,
                                    start_timeout_s=start_timeout_s),
                      tokenizer, model_name=name, max_model_len=config.max_seq_len, **limits)


#: GNU OpenMP's spin before a waiting thread sleeps, in an engine process on the C kernels
C_KERNELS_GOMP_SPINCOUNT = "30000"


def engine_env(quantization: str | None, matmul: str = "auto") -> dict[str, str]:
    """Environment for the engine process. On the package's C kernels (``"w4a8"``, or fp32 with
    ``matmul`` ``"skinny"``) two thread pools share the cores: torch's OpenMP workers (norms,
    rotary, the rest) and the C kernels' (matmuls, decode attention). Each spins after its
    work for the next job, and by default libgomp's spin (``GOMP_SPINCOUNT``, 300,000 polls)
    outlasts a C call, so its idle workers hold the core the kernel's worker needs: on the
    course's 2-core machines two threads then served no faster than one. A shorter spin gives
    the core back; too short a one (10,000 polls) let the fp32 engine's workers sleep between
    the C attention calls of a many-sequence step on a Xeon, while 30,000 served both kernels
    on both machines measured (the commit that set it, ``git log -S
    C_KERNELS_GOMP_SPINCOUNT``, has the timings; ``make compare-engines`` records the servers
    as they run, ``llminfra/data/compare_engines_cpu.json``). Hence 30,000. The fp32 engine
    on oneDNN alone (one pool) is left as it is: passive waiting made it slower
    at one client. A value the caller set (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``) is kept."""
    c_kernels = quantization == "w4a8" or (quantization is None and matmul == "skinny")
    if not c_kernels or {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(os.environ):
        return {}
    return {"GOMP_SPINCOUNT": C_KERNELS_GOMP_SPINCOUNT}


def run_server(host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
               model: str = "tiny", *, limit_concurrency: int | None = None,
               timeout_keep_alive_s: float | None = None, **app_kwargs) -> None:
    """Serve until interrupted (blocks). ``limit_concurrency`` (connections and requests at
    once; 503 beyond) and ``timeout_keep_alive_s`` override
    :data:`~llminfra.serving.http_limits.UVICORN_LIMITS`; ``app_kwargs`` go to
    :func:`build_app`."""
    import uvicorn

    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    limits = dict(UVICORN_LIMITS)
    if limit_concurrency is not None:
        if isinstance(limit_concurrency, bool) or not isinstance(limit_concurrency, int) \
                or limit_concurrency < 1:
            raise ValueError(f"limit_concurrency must be an int >= 1, got {limit_concurrency!r}")
        limits["limit_concurrency"] = limit_concurrency
    if timeout_keep_alive_s is not None:
        if not timeout_keep_alive_s > 0:
            raise ValueError(f"timeout_keep_alive_s must be > 0, got {timeout_keep_alive_s!r}")
        limits["timeout_keep_alive"] = timeout_keep_alive_s
    app = build_app(model, **app_kwargs)
    app.state.service.loop.start()  # before listening: a bad setting fails here, plainly
    log.info("serving %s at http://%s:%d/v1 (Ctrl-C to stop)", model, host, port)
    uvicorn.run(app, host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, **limits)
