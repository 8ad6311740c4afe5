"""``python -m llminfra bench real [--quick] --json PATH``: the course's engine against Hugging
Face transformers on the real model, SmolLM2-135M-Instruct, fp32, on one CPU thread.

One seeded offline workload (every request arrives at t = 0; prompt and output lengths from the
chapter-04 ShareGPT trace, :func:`llminfra.engine.workload.serving_workload`, scaled down by
:data:`SIZES` so that a 2-core CPU serves it in minutes; prompts are windows of the shipped
validation corpus in the real tokenizer) is served, greedily and with fixed output lengths, by:

* ``engine``: :class:`~llminfra.engine.LLMEngine`, continuous batching on the paged cache
  (:data:`ENGINE`);
* ``hf_sequential``, ``hf_static_8``, ``hf_static_16``: transformers' ``generate`` on batches of
  1, 8, 16 requests in arrival order, left-padded, with an attention mask; a batch runs to its
  longest output and each request keeps its own length (the rest is the padding waste of
  static batching, chapter 05). A request's TTFT is *measured*: a streamer records when
  ``generate`` hands out its batch's first new token;
* ``hf_continuous``: transformers' own continuous batching (``continuous_batching_context_manager``,
  the machinery of ``generate_batch``) with the engine's limits (16 sequences, 512 tokens a
  step); TTFT is its first token's timestamp. Left out, with the reason in ``notes``, where the
  installed transformers lacks it or it fails.

Fixed lengths: the engine gets ``ignore_eos=True``, transformers ``eos_token_id=None`` (with
``min_new_tokens = max_new_tokens``). ``min_new_tokens`` alone would forbid the EOS token, not
ignore it, so the greedy tokens would part where the model's argmax is EOS. The engine's tokens
must then equal transformers': ``greedy_tokens_equal_engine`` is the share of requests whose
tokens are identical (a correctness check, beside the timing).

Throughput = output tokens / (last finish − start), as :func:`llminfra.engine.summarize`
counts it. Sides run interleaved (engine, HF modes, then again) and each keeps its best of
``repeats`` runs (all runs are in ``throughput_tokens_per_s_runs``), so a neighbour's burst on a
shared machine does not decide the ratio.

``decode_ms_per_token``: batch-1 decode of our model, ``eager`` through plain
:func:`llminfra.model.generate` with a :class:`~llminfra.model.DenseKVCache`, ``fast`` through
:class:`llminfra.model.FastDecoder`, ``fast_int4`` through it in int4 ((time of n + 1 tokens − time of 1) / n after a 64-token
prompt). ``decode_floor_ms``: the weights read once per
token at the copy bandwidth measured in this run (:func:`llminfra.bench.roofline.measure_copy_bytes_per_s`,
STREAM copy, McCalpin 1995): fp32, and int4 (what ``fast_int4`` holds: packed codes and a bf16
scale and offset per group of :data:`FAST_INT4_GROUP`, output matrix included). Targets: engine ≥
1.3× the best HF mode's throughput; batch-1 decode ≤ 2.5× its fp32 floor (eager), ≤ 1.6×
(fast), ≤ 2.5× its int4 floor (fast_int4). Chapters 05 and 08.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import logging
import time
from pathlib import Path
from types import MappingProxyType

import torch

from llminfra.bench.roofline import measure_copy_bytes_per_s
from llminfra.bench.timing import cpu_name, environment, torch_threads
from llminfra.calc.measured import parameter_bytes
from llminfra.engine import LLMEngine, SamplingParams, default_num_blocks, percentile
from llminfra.engine.workload import WorkloadRequest, serving_workload
from llminfra.model import DenseKVCache, FastDecoder, generate, load_pretrained, pretrained_path
from llminfra.model.corpus import corpus_path
from llminfra.quant import int4_linear

MODEL = "smollm2-135m"
SEED = 2025
#: the sides compared; transformers generate() batch size of each static mode
SIDES = ("engine", "hf_sequential", "hf_static_8", "hf_static_16", "hf_continuous")
HF_STATIC = MappingProxyType({"hf_sequential": 1, "hf_static_8": 8, "hf_static_16": 16})
#: engine limits (hf_continuous gets the same)
ENGINE = MappingProxyType(dict(block_size=16, max_num_seqs=16, max_num_batched_tokens=512))
#: workload by ``quick``: requests, factor on the trace's lengths, cap on prompt + output, runs
SIZES = MappingProxyType({
    False: dict(n_requests=32, scale=0.125, max_seq_len=256, repeats=3, decode_tokens=32),
    True: dict(n_requests=10, scale=0.0625, max_seq_len=128, repeats=2, decode_tokens=16)})
DECODE_PROMPT_LEN = 64
#: int4 group of the ``fast_int4`` decode path (SmolLM2's 576-wide inputs take 32 or 64, not 128)
FAST_INT4_GROUP = 64


def import_transformers():
    """transformers, or ``ImportError`` saying how to install it (a test extra only)."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError("bench real compares with Hugging Face transformers, which is a test "
                          "extra: pip install transformers accelerate (or: make test)") from e
    return transformers


def load_hf_model(transformers, path: Path):
    """transformers' own GGUF loader on ``path`` (fp32, eval), its logging and progress bars
    quiet meanwhile."""
    log, bar = transformers.logging, transformers.utils.logging
    verbosity, bar_on = log.get_verbosity(), bar.is_progress_bar_enabled()
    log.set_verbosity_error()
    bar.disable_progress_bar()
    try:   # its GGUF reader draws a tqdm bar on stderr whatever the settings
        with contextlib.redirect_stderr(io.StringIO()):
            return transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    finally:
        log.set_verbosity(verbosity)
        if bar_on:
            bar.enable_progress_bar()


def real_workload(n_requests: int, generator: torch.Generator, *, scale: float,
                  max_seq_len: int, max_output: int | None = None) -> list[WorkloadRequest]:
    """All-at-once requests with ShareGPT trace lengths × ``scale`` (prompt + output <=
    ``max_seq_len``), outputs cut to ``max_output`` when given."""
    work = serving_workload(n_requests, generator, max_seq_len=max_seq_len, scale=scale)
    if max_output is not None:
        work = [dataclasses.replace(r, output_len=min(r.output_len, max_output)) for r in work]
    return work


def corpus_prompts(tokenizer, work: list[WorkloadRequest]) -> list[list[int]]:
    """Prompt ids: windows of the validation corpus (real tokenizer), one per request."""
    with gzip.open(corpus_path("validation"), "rt", encoding="utf-8") as f:
        ids = tokenizer.encode(f.read())
    return [ids[(97 * i) % (len(ids) - r.prompt_len):][:r.prompt_len]
            for i, r in enumerate(work)]


def _side(tokens: list[list[int]], ttft_s: list[float], finish_s: list[float]) -> dict:
    """One run's tokens, TTFTs and throughput (output tokens / last finish, all from t = 0)."""
    return {"tokens": tokens, "ttft_s": ttft_s,
            "throughput_tokens_per_s": sum(map(len, tokens)) / max(finish_s)}


def run_engine(model, tokenizer, work, prompts) -> dict:
    """Serve the workload on :class:`LLMEngine` (every request arrives at t = 0)."""
    engine = LLMEngine(model, tokenizer, **ENGINE)
    t0 = time.perf_counter()
    ids = [engine.add_request(p, SamplingParams(max_tokens=r.output_len, ignore_eos=True),
                              arrival_time=t0) for p, r in zip(prompts, work)]
    done = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    outs = [done[i] for i in ids]
    return _side([o.outputs[0].token_ids for o in outs], [o.metrics.ttft_s for o in outs],
                 [o.metrics.finished_time - t0 for o in outs])


class FirstTokenClock:
    """A transformers streamer keeping the time of ``generate``'s first new token
    (``generate`` calls ``put`` once with the prompt, then once per step)."""

    def __init__(self):
        self.calls, self.first_token_time = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_token_time = time.perf_counter()

    def end(self) -> None:
        pass


@torch.no_grad()
def run_hf_static(hf, work, prompts, batch: int, pad_id: int) -> dict:
    """transformers ``generate`` on left-padded batches of ``batch`` requests in turn."""
    t0 = time.perf_counter()
    tokens, ttft, finish = [], [], []
    for s in range(0, len(work), batch):
        chunk, lens = prompts[s:s + batch], [r.output_len for r in work[s:s + batch]]
        L, n = max(map(len, chunk)), max(lens)
        x = torch.tensor([[pad_id] * (L - len(p)) + p for p in chunk])          # (B, L)
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in chunk])
        clock = FirstTokenClock()
        out = hf.generate(x, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                          eos_token_id=None, pad_token_id=pad_id, do_sample=False,
                          streamer=clock)                                     # (B, L + n)
        end = time.perf_counter()
        tokens += [out[j, L:L + o].tolist() for j, o in enumerate(lens)]
        ttft += [clock.first_token_time - t0] * len(chunk)
        finish += [end - t0] * len(chunk)
    return _side(tokens, ttft, finish)


def hf_kv_blocks(config, page_size: int = 256) -> int:
    """transformers' cache blocks (``page_size`` tokens, its default page) for the K/V tokens of
    the engine's default pool on ``config`` (:func:`~llminfra.engine.default_num_blocks`).
    Left to itself, transformers sizes the pool on a CPU at 90 % of the machine's RAM."""
    B = ENGINE["block_size"]
    tokens = B * default_num_blocks(config, B, ENGINE["max_num_seqs"], torch.float32)
    return -(-tokens // page_size)


def run_hf_continuous(transformers, hf, work, prompts, pad_id: int, kv_blocks: int) -> dict:
    """transformers' continuous batching manager with the engine's limits and ``kv_blocks``
    cache blocks; ``RuntimeError`` if a request fails."""
    gen_config = transformers.GenerationConfig(do_sample=False, eos_token_id=None,
                                               pad_token_id=pad_id)
    cb_config = transformers.ContinuousBatchingConfig(
        max_requests_per_batch=ENGINE["max_num_seqs"],
        max_batch_tokens=ENGINE["max_num_batched_tokens"], num_blocks=kv_blocks)
    cb_log = logging.getLogger("ContinuousBatchingLogger")   # warns that EOS is disabled
    level = cb_log.level
    cb_log.setLevel(logging.ERROR)
    try:
        with hf.continuous_batching_context_manager(
                generation_config=gen_config, continuous_batching_config=cb_config,
                block=True, timeout=30, warmup=False) as manager:
            t0 = time.perf_counter()
            for i, (p, r) in enumerate(zip(prompts, work)):
                manager.add_request(p, request_id=f"r{i}", max_new_tokens=r.output_len,
                                    record_timestamps=True)
            results = {}
            while len(results) < len(work):
                out = manager.get_result(timeout=60)
                if out is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped")
                if out is not None and out.is_finished():
                    results[out.request_id] = out
    finally:
        cb_log.setLevel(level)
    outs = [results[f"r{i}"] for i in range(len(work))]
    failed = [o.error for o in outs if o.error is not None]
    if failed:
        raise RuntimeError(f"transformers' continuous batching failed: {failed[0]}")
    return _side([list(o.generated_tokens) for o in outs], [o.timestamps[0] - t0 for o in outs],
                 [o.timestamps[-1] - t0 for o in outs])


def decode_s_per_token(model, prompt: list[int], n: int,
                       repeats: int) -> tuple[dict[str, float], int]:
    """Batch-1 decode seconds per token, keyed ``eager`` (:func:`generate` with a DenseKVCache),
    ``fast`` (:class:`llminfra.model.FastDecoder`) and ``fast_int4`` (the same with every matrix
    in int4, groups of :data:`FAST_INT4_GROUP`, through PyTorch's packed-int4 CPU kernel with bf16
    activations): (best time of n + 1 tokens − best time of 1 token) / n, all timed in turn;
    and the bytes of weights ``fast_int4`` reads a token (its floor's numerator)."""
    fast = FastDecoder(model, max_len=len(prompt) + n + 1)
    fast_int4 = FastDecoder(model, max_len=len(prompt) + n + 1,
                            linear=int4_linear(FAST_INT4_GROUP))
    paths = {"eager": lambda k: generate(model, prompt, k,
                                         cache=DenseKVCache(model.config.n_layers)),
             "fast": lambda k: fast.generate(prompt, k),
             "fast_int4": lambda k: fast_int4.generate(prompt, k)}
    best = {(p, k): float("inf") for p in paths for k in (1, n + 1)}
    for r in range(repeats + 1):                                   # round 0 warms up
        for p, k in best:
            t0 = time.perf_counter()
            paths[p](k)
            if r:
                best[p, k] = min(best[p, k], time.perf_counter() - t0)
    return {p: (best[p, n + 1] - best[p, 1]) / n for p in paths}, fast_int4.weight_bytes_read()


def run(quick: bool = False, n_requests: int | None = None, max_output: int | None = None,
        repeats: int | None = None, models: tuple | None = None) -> dict:
    """Everything in the module docstring on one thread (restored afterwards). ``quick``: the
    smaller sizes of :data:`SIZES`; ``n_requests``, ``max_output`` (a cap on each request's
    output tokens and on the decode measurement's) and ``repeats`` override them (the tests
    run a tiny workload). ``models``: ``(model, tokenizer, hf_model)`` already loaded from the
    same file (the tests load transformers' once for all their checks), else both are loaded
    here. ``ImportError`` without transformers."""
    transformers = import_transformers()
    with torch_threads(1):
        return _run(transformers, dict(SIZES[bool(quick)]), quick, n_requests, max_output,
                    repeats, models)


def _compare(transformers, model, tok, hf, work, prompts, repeats: int, notes: list) -> dict:
    """Every side's best run (of ``repeats``, interleaved) and the runs' throughputs."""
    pad = hf.generation_config.pad_token_id or 0
    runners = {"engine": lambda: run_engine(model, tok, work, prompts),
               **{k: (lambda b=b: run_hf_static(hf, work, prompts, b, pad))
                  for k, b in HF_STATIC.items()},
               "hf_continuous": lambda: run_hf_continuous(transformers, hf, work, prompts, pad,
                                                          hf_kv_blocks(model.config))}
    if not hasattr(hf, "continuous_batching_context_manager"):
        notes.append(f"hf_continuous left out: transformers {transformers.__version__} has no "
                     "continuous batching")
        del runners["hf_continuous"]
    best, runs = {}, {k: [] for k in runners}
    for _ in range(repeats):
        for side, fn in list(runners.items()):
            try:
                res = fn()
            except Exception as e:            # transformers' CB on CPU: record, don't crash
                if side != "hf_continuous":
                    raise
                notes.append(f"hf_continuous left out: it failed on this machine: {e!r}")
                del runners[side], runs[side]
                best.pop(side, None)
                continue
            runs[side].append(res["throughput_tokens_per_s"])
            if side not in best or res["throughput_tokens_per_s"] > best[side][
                    "throughput_tokens_per_s"]:
                best[side] = res
    return {"best": best, "runs": runs}


def _run(transformers, size: dict, quick: bool, n_requests, max_output, repeats,
         models) -> dict:
    t_start = time.perf_counter()
    size.update({k: v for k, v in dict(n_requests=n_requests, repeats=repeats).items()
                 if v is not None})
    if max_output is not None:
        size["decode_tokens"] = min(size["decode_tokens"], max_output)
    if models is None:
        model, tok = load_pretrained(MODEL)
        hf = load_hf_model(transformers, pretrained_path(MODEL))
    else:
        model, tok, hf = models
    work = real_workload(size["n_requests"], torch.Generator().manual_seed(SEED),
                         scale=size["scale"], max_seq_len=size["max_seq_len"],
                         max_output=max_output)
    prompts = corpus_prompts(tok, work)
    notes = []
    cmp = _compare(transformers, model, tok, hf, work, prompts, size["repeats"], notes)
    best = cmp["best"]
    bw = measure_copy_bytes_per_s(repeats=3)
    decode_s, int4_bytes = decode_s_per_token(model, corpus_prompts(
        tok, [WorkloadRequest(0.0, DECODE_PROMPT_LEN, 1)])[0], size["decode_tokens"],
        size["repeats"])
    w_bytes = {"fp32": parameter_bytes(model), "int4": int4_bytes}
    n = len(work)
    result = {
        "environment": {**environment(), "cpu_name": cpu_name(),
                        "transformers": transformers.__version__},
        "quick": quick, "seed": SEED, "threads": 1, "model": MODEL, "dtype": "fp32",
        "workload": {
            "num_requests": n, "arrivals": "all at t = 0 (offline)",
            "trace": f"sharegpt x {size['scale']}, prompt + output <= {size['max_seq_len']}"
                     + (f", outputs <= {max_output}" if max_output else ""),
            "scaled_down": "at the trace's lengths (mean 161 in, 338 out) the sequential "
                           "baseline alone would take over an hour on a 2-core CPU",
            "prompt_tokens_mean": sum(r.prompt_len for r in work) / n,
            "output_tokens_mean": sum(r.output_len for r in work) / n,
            "output_tokens_total": sum(r.output_len for r in work),
            "repeats": size["repeats"], "engine": dict(ENGINE)},
        "copy_bandwidth_bytes_per_s": bw,
        "throughput_tokens_per_s": {k: v["throughput_tokens_per_s"] for k, v in best.items()},
        "throughput_tokens_per_s_runs": cmp["runs"],
        "ttft_p50_s": {k: percentile(v["ttft_s"], 50) for k, v in best.items()},
        "ttft_p99_s": {k: percentile(v["ttft_s"], 99) for k, v in best.items()},
        "greedy_tokens_equal_engine": {
            k: sum(a == b for a, b in zip(v["tokens"], best["engine"]["tokens"])) / n
            for k, v in best.items() if k != "engine"},
        "decode_ms_per_token": {k: v * 1e3 for k, v in decode_s.items()},
        "weight_bytes": w_bytes,
        "decode_floor_ms": {k: b / bw * 1e3 for k, b in w_bytes.items()},
        "notes": notes,
    }
    result.update(targets(result))
    result["seconds"] = time.perf_counter() - t_start
    return result


def targets(r: dict) -> dict:
    """The issue's two ratios and whether each is met: engine / best HF mode >= 1.3, batch-1
    eager decode / fp32 floor <= 2.5."""
    thr = r["throughput_tokens_per_s"]
    best_hf = max((k for k in thr if k != "engine"), key=thr.get)
    vs_hf = thr["engine"] / thr[best_hf]
    vs_floor = r["decode_ms_per_token"]["eager"] / r["decode_floor_ms"]["fp32"]
    fast_vs_floor = r["decode_ms_per_token"]["fast"] / r["decode_floor_ms"]["fp32"]
    int4_vs_floor = r["decode_ms_per_token"]["fast_int4"] / r["decode_floor_ms"]["int4"]
    return {"best_hf_mode": best_hf, "engine_vs_best_hf": vs_hf, "eager_vs_floor": vs_floor,
            "fast_vs_floor": fast_vs_floor, "fast_int4_vs_floor": int4_vs_floor,
            "targets_met": {"engine_vs_best_hf >= 1.3": vs_hf >= 1.3,
                            "eager_vs_floor <= 2.5": vs_floor <= 2.5,
                            "fast_vs_floor <= 1.6": fast_vs_floor <= 1.6,
                            "fast_int4_vs_floor <= 2.5": int4_vs_floor <= 2.5}}


def format_table(result: dict) -> str:
    """The numbers as a plain-text table."""
    r, w = result, result["workload"]
    lines = [f"{w['num_requests']} requests ({w['trace']}), fp32, 1 thread, "
             f"{r['environment']['cpu_name']}",
             f"{'mode':<15}{'tokens/s':>10}{'TTFT p50 s':>12}{'TTFT p99 s':>12}"
             f"{'same tokens':>13}"]
    for k, thr in r["throughput_tokens_per_s"].items():
        same = r["greedy_tokens_equal_engine"].get(k)
        lines.append(f"{k:<15}{thr:>10.4g}{r['ttft_p50_s'][k]:>12.4g}{r['ttft_p99_s'][k]:>12.4g}"
                     f"{'-' if same is None else f'{same:.0%}':>13}")
    f = r["decode_floor_ms"]
    d = r["decode_ms_per_token"]
    lines.append(f"batch-1 decode: eager {d['eager']:.4g}, fast {d['fast']:.4g}, fast int4 "
                 f"{d['fast_int4']:.4g} ms/token; floor "
                 f"fp32 {f['fp32']:.4g} ms, int4 {f['int4']:.4g} ms (copy "
                 f"{r['copy_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s)")
    met = r["targets_met"]
    lines.append(f"targets: engine / best HF ({r['best_hf_mode']}) {r['engine_vs_best_hf']:.3g} "
                 f"(>= 1.3: {met['engine_vs_best_hf >= 1.3']}); eager / fp32 floor "
                 f"{r['eager_vs_floor']:.3g} (<= 2.5: {met['eager_vs_floor <= 2.5']}); fast / "
                 f"fp32 floor {r['fast_vs_floor']:.3g} (<= 1.6: {met['fast_vs_floor <= 1.6']}); "
                 f"fast int4 / int4 floor {r['fast_int4_vs_floor']:.3g} "
                 f"(<= 2.5: {met['fast_int4_vs_floor <= 2.5']})")
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
