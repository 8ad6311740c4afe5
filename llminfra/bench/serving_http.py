"""What the HTTP layer costs: the server's throughput at concurrency 16 over real sockets,
divided by the in-process engine's throughput on the same requests (key ``http_vs_engine``).

Both sides run the same ``LLMEngine`` settings on the tiny model with the same torch thread
count, on the same requests (lengths from the chapter-04 trace, capped to the model's 256-token
context, greedy). In process, all requests are added at once to an engine whose running batch
is capped at the concurrency (``max_num_seqs = 16``), which is what 16 closed-loop clients
allow the server. Over HTTP, ``python -m llminfra serve`` runs in a child process and
:func:`llminfra.engine.loadtest.run_loadtest` drives it with 16 streaming clients.
Throughput = output tokens / wall time. The in-process run is done before and after the HTTP
run and the better one counts, so a load change on a shared machine does not flatter HTTP.
The two sides are not identical in CPU use: over HTTP the client, the web layer and the engine
loop live in two processes and can use two cores, the in-process engine one; on a 2-core
machine the ratio can therefore exceed 1. Called by ``python -m llminfra bench serving``.

Taught in chapter 05.
"""

from __future__ import annotations

import time

CONCURRENCY = 16
SEED = 0


def _in_process_tokens_per_s(lengths, prompts, num_threads: int, **engine_kwargs) -> dict:
    import torch

    from llminfra.engine import LLMEngine, SamplingParams
    from llminfra.model import load_tiny

    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        model, tok = load_tiny()
        engine = LLMEngine(model, tok, **engine_kwargs)
        params = [SamplingParams(max_tokens=o, temperature=0.0) for _, o in lengths]
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params)
        wall = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"wall_s": wall, "output_tokens": tokens, "output_tokens_per_s": tokens / wall}


def run_http_vs_engine(num_requests: int = 64, concurrency: int = CONCURRENCY,
                       num_threads: int = 1, max_output_tokens: int | None = 64) -> dict:
    """Measure both sides; ``http_vs_engine`` = HTTP tokens/s ÷ in-process tokens/s (target
    ≥ 0.7). Returns both measurements and the settings."""
    from llminfra.engine.background import ServerProcess
    from llminfra.engine.loadtest import loadtest_requests, prompt_texts, run_loadtest

    max_len = 256  # the tiny model's context (ModelConfig "tiny": max_seq_len = 256)
    reqs = loadtest_requests(num_requests, SEED, max_len, max_output_tokens=max_output_tokens)
    lengths = [(r.prompt_len, r.output_len) for r in reqs]
    prompts = prompt_texts([p for p, _ in lengths])
    before = _in_process_tokens_per_s(lengths, prompts, num_threads, max_num_seqs=concurrency)
    with ServerProcess(["--threads", str(num_threads), "--log-level", "warning",
                        "--max-num-seqs", str(concurrency)]) as srv:
        http = run_loadtest(srv.base_url, concurrency=concurrency, num_requests=num_requests,
                            seed=SEED, max_model_len=max_len,
                            max_output_tokens=max_output_tokens, progress=False)
    after = _in_process_tokens_per_s(lengths, prompts, num_threads, max_num_seqs=concurrency)
    engine = max(before, after, key=lambda r: r["output_tokens_per_s"])
    if http["output_tokens"] != engine["output_tokens"] or http["num_errors"]:
        raise RuntimeError(f"the two runs differ: HTTP {http['output_tokens']} tokens, "
                           f"{http['num_errors']} errors {http['errors']}; in process "
                           f"{engine['output_tokens']} tokens")
    return {"http_vs_engine": http["output_tokens_per_s"] / engine["output_tokens_per_s"],
            "http_output_tokens_per_s": http["output_tokens_per_s"],
            "engine_output_tokens_per_s": engine["output_tokens_per_s"],
            "engine_output_tokens_per_s_runs": [before["output_tokens_per_s"],
                                                after["output_tokens_per_s"]],
            "http_ttft_s_p50": http["ttft_s"]["p50"], "http_tpot_s_p50": http["tpot_s"]["p50"],
            "num_requests": num_requests, "concurrency": concurrency,
            "output_tokens": engine["output_tokens"], "torch_threads": num_threads}
