"""What the HTTP layer costs: the server's throughput at concurrency 16 over real sockets,
divided by the in-process engine's throughput on the same requests (key ``http_vs_engine``).

Both sides run the same ``LLMEngine`` settings on the tiny model with the same torch thread
count, on the same requests (lengths from the chapter-04 trace, capped to the model's 256-token
context, greedy). In process, all requests are added at once to an engine whose running batch
is capped at the concurrency (``max_num_seqs = 16``), which is what 16 closed-loop clients
allow the server. Over HTTP, ``python -m llminfra serve`` runs in a child process, its engine
in a process of its own (:mod:`llminfra.serving.engine_process`), and
:func:`llminfra.serving.loadtest.run_loadtest` drives it with 16 streaming clients after one
warm-up request. Throughput = output tokens / wall time. The in-process run is done before and
after the HTTP runs and the better one counts, so a load change on a shared machine does not
flatter HTTP.

The same server with ``--engine-in-thread`` is measured too (``http_vs_engine_thread``): its
engine and its web layer share one GIL, so every streamed token's Python work is time the
engine waits — the reason vLLM's V1 moved its engine core into a process of its own.

The two sides are not identical in CPU use: over HTTP the client, the web layer and the engine
live in separate processes and can use both cores of a 2-core machine, the in-process engine
one; the ratio can therefore come close to 1, not above it by much (the engine itself is the
same). Called by ``python -m llminfra bench serving``.

Taught in chapter 05.
"""

from __future__ import annotations

import time
from llminfra.bench.timing import torch_threads
from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import load_tiny

CONCURRENCY = 16
SEED = 0


def _in_process_tokens_per_s(lengths, prompts, num_threads: int, **engine_kwargs) -> dict:

    with torch_threads(num_threads):
        model, tok = load_tiny()
        engine = LLMEngine(model, tok, **engine_kwargs)
        params = [SamplingParams(max_tokens=o, temperature=0.0) for _, o in lengths]
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params)
        wall = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"wall_s": wall, "output_tokens": tokens, "output_tokens_per_s": tokens / wall}


def _warm_up(base_url: str) -> None:
    """One short request before the measured run (as vLLM's ``benchmark_serving`` sends a
    test prompt first): the engine process's first steps pay one-time costs."""
    import httpx

    from llminfra.serving.server import DEFAULT_MODEL_NAME
    r = httpx.post(f"{base_url}/v1/completions", timeout=60,
                   json={"model": DEFAULT_MODEL_NAME, "prompt": "warm", "max_tokens": 16})
    r.raise_for_status()


def _over_http(where: str, num_threads: int, concurrency: int, num_requests: int,
               max_len: int, max_output_tokens: int | None) -> dict:
    """The load test against ``python -m llminfra serve`` with its engine in a ``process`` of
    its own or in a ``thread`` of the server."""
    from llminfra.serving.background import ServerProcess
    from llminfra.serving.loadtest import run_loadtest

    args = ["--threads", str(num_threads), "--log-level", "warning",
            "--max-num-seqs", str(concurrency)] + (["--engine-in-thread"]
                                                     if where == "thread" else [])
    with ServerProcess(args) as srv:
        _warm_up(srv.base_url)
        return run_loadtest(srv.base_url, concurrency=concurrency, num_requests=num_requests,
                            seed=SEED, max_model_len=max_len,
                            max_output_tokens=max_output_tokens, progress=False)


def run_http_vs_engine(num_requests: int = 64, concurrency: int = CONCURRENCY,
                       num_threads: int = 1, max_output_tokens: int | None = 64) -> dict:
    """Measure both sides; ``http_vs_engine`` = HTTP tokens/s ÷ in-process tokens/s (target
    ≥ 0.7), ``http_vs_engine_thread`` the same with the server's engine in a thread. Returns
    the measurements and the settings."""
    from llminfra.serving.loadtest import loadtest_requests, prompt_texts

    max_len = 256  # the tiny model's context (ModelConfig "tiny": max_seq_len = 256)
    reqs = loadtest_requests(num_requests, SEED, max_len, max_output_tokens=max_output_tokens)
    lengths = [(r.prompt_len, r.output_len) for r in reqs]
    prompts = prompt_texts([p for p, _ in lengths])
    before = _in_process_tokens_per_s(lengths, prompts, num_threads, max_num_seqs=concurrency)
    http = {where: _over_http(where, num_threads, concurrency, num_requests, max_len,
                              max_output_tokens) for where in ("process", "thread")}
    after = _in_process_tokens_per_s(lengths, prompts, num_threads, max_num_seqs=concurrency)
    engine = max(before, after, key=lambda r: r["output_tokens_per_s"])
    for where, r in http.items():
        if r["output_tokens"] != engine["output_tokens"] or r["num_errors"]:
            raise RuntimeError(f"the runs differ: HTTP (engine in a {where}) "
                               f"{r['output_tokens']} tokens, {r['num_errors']} errors "
                               f"{r['errors']}; in process {engine['output_tokens']} tokens")
    rate = engine["output_tokens_per_s"]
    proc, thread = http["process"], http["thread"]
    return {"http_vs_engine": proc["output_tokens_per_s"] / rate,
            "http_vs_engine_thread": thread["output_tokens_per_s"] / rate,
            "http_output_tokens_per_s": proc["output_tokens_per_s"],
            "http_thread_output_tokens_per_s": thread["output_tokens_per_s"],
            "engine_output_tokens_per_s": rate,
            "engine_output_tokens_per_s_runs": [before["output_tokens_per_s"],
                                                after["output_tokens_per_s"]],
            "http_ttft_s_p50": proc["ttft_s"]["p50"], "http_tpot_s_p50": proc["tpot_s"]["p50"],
            "http_thread_tpot_s_p50": thread["tpot_s"]["p50"],
            "num_requests": num_requests, "concurrency": concurrency,
            "output_tokens": engine["output_tokens"], "torch_threads": num_threads}
