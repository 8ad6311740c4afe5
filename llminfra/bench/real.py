"""``python -m llminfra bench real [--quick] --json PATH``: the course's engine against Hugging
Face transformers on the real model, SmolLM2-135M-Instruct, fp32, on one CPU thread.

One seeded offline workload (every request arrives at t = 0; prompt and output lengths from the
chapter-04 ShareGPT trace, :func:`llminfra.sim.workload.serving_workload`, scaled down by
:data:`SIZES` so that a 2-core CPU serves it in minutes; prompts are windows of the shipped
validation corpus in the real tokenizer) is served, greedily and with fixed output lengths, by:

* ``engine``: :class:`~llminfra.engine.LLMEngine`, continuous batching on the paged cache
  (:data:`ENGINE`), as ``llminfra serve`` builds it for this model on this machine by default
  (:func:`llminfra.runner.kernel_choice.engine_runner`: the fast runner on the package's C
  kernels where they build, on oneDNN's prepacked weights otherwise);
* ``engine_plain``: the same engine on its default, readable runner, its layers multiplying
  through ``F.linear`` as transformers' do. The two engine rows apart are what the fast path
  (runner and kernels) is worth; ``engine_plain`` and ``hf_continuous`` apart, what the rest
  of the engine is. ``engine_paths`` records which path each engine row ran (runner, the
  class of its products, its attention, whether its decode step was one C call);
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
:func:`llminfra.model.generate` with a :class:`~llminfra.model.DenseKVCache` (the readable
model), ``fast`` through :class:`llminfra.runner.FastDecoder`, both on ``matmul`` (oneDNN's
prepacked weights where this PyTorch has them, else ``F.linear``), and ``eager_plain`` /
``fast_plain`` the same on ``F.linear``, ``fast_skinny`` on the package's C kernel for few
rows (:mod:`llminfra.kernels.f32_skinny`, ``serve``'s kernel at batch 1); ``fast_int4``
through FastDecoder in int4 on ``int4_kernel`` (``"w4a8"``: :mod:`llminfra.kernels.w4a8`, int8
activations and integer dot products as llama.cpp's Q4_1 × Q8_1, where it can be built; else
``"torch"``) and ``fast_int4_2pass`` (w4a8 with the activations' int8 rounding error
multiplied too) and ``fast_int4_torch`` with the same codes through PyTorch's packed-int4
kernel ((time of n + 1 tokens − time of 1) / n after a 64-token prompt).
``int4_greedy_identical``: on how many of eight chat prompts each int4 path's greedy tokens
are those of the same int4 weights with fp32 activations (what the kernel's activations
change) and those of the fp32 model (what int4 changes). ``decode_floor_ms``: the weights read
once per token at the copy bandwidth measured in this run
(:func:`llminfra.bench.roofline.measure_copy_bytes_per_s`, STREAM copy, McCalpin 1995): fp32,
and int4 (what ``fast_int4`` holds: packed codes and a bf16 scale and offset per group of
:data:`FAST_INT4_GROUP`, output matrix included). Targets (the plain rows are measured beside
them, not held to them): the engine row ≥ 1.3× the best HF mode's throughput; on the default
kernel, batch-1 decode ≤ 2.5× its fp32 floor (eager), ≤ 1.6× (fast), ≤ 2.5× its int4 floor
(fast_int4). The recorded run: ``llminfra/data/bench_real_cpu.json``. Chapters 05, 08 and 12.
"""

from __future__ import annotations

import dataclasses
import gzip
import time
from types import MappingProxyType

import torch

from llminfra.bench.roofline import measure_copy_bytes_per_s
from llminfra.bench.timing import cpu_name, environment, torch_threads
from llminfra.calc.measured import parameter_bytes
from llminfra.bench.real_hf import (ENGINE, hf_kv_blocks, import_transformers, load_hf_model,
                                    run_hf_continuous, run_hf_static, run_record)
from llminfra.engine import LLMEngine, SamplingParams, percentile
from llminfra.sim.workload import WorkloadRequest, serving_workload
from llminfra.model import load_pretrained, pretrained_path
from llminfra.runner.fast_runner import FastRunner
from llminfra.runner.fused import matmul_kind
from llminfra.runner.kernel_choice import engine_runner
from llminfra.model.corpus import corpus_path
from llminfra.kernels import w4a8
from llminfra.bench.real_decode import (AGREEMENT_PROMPTS, DECODE_PROMPT_LEN, decode_s_per_token,
                                        int4_decoders, int4_greedy_identical, int4_kernel,
                                        matmul_kernel)

MODEL = "smollm2-135m"
SEED = 2025
#: the sides compared; transformers generate() batch size of each static mode
SIDES = ("engine", "engine_plain", "hf_sequential", "hf_static_8", "hf_static_16",
         "hf_continuous")
ENGINE_SIDES = ("engine", "engine_plain")
HF_STATIC = MappingProxyType({"hf_sequential": 1, "hf_static_8": 8, "hf_static_16": 16})
#: workload by ``quick``: requests, factor on the trace's lengths, cap on prompt + output, runs
SIZES = MappingProxyType({
    False: dict(n_requests=32, scale=0.125, max_seq_len=256, repeats=3, decode_tokens=32),
    True: dict(n_requests=10, scale=0.0625, max_seq_len=128, repeats=2, decode_tokens=16)})



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


def run_engine(model, tokenizer, work, prompts, runner="readable") -> dict:
    """Serve the workload on :class:`LLMEngine` with ``runner`` (every request arrives at
    t = 0); the run's record, with ``path``: what the engine ran (:func:`engine_path`)."""
    engine = LLMEngine(model, tokenizer, runner=runner, **ENGINE)
    t0 = time.perf_counter()
    ids = [engine.add_request(p, SamplingParams(max_tokens=r.output_len, ignore_eos=True),
                              arrival_time=t0) for p, r in zip(prompts, work)]
    done = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    outs = [done[i] for i in ids]
    record = run_record([o.outputs[0].token_ids for o in outs], [o.metrics.ttft_s for o in outs],
                        [o.metrics.finished_time - t0 for o in outs])
    return {**record, "path": engine_path(engine)}


def engine_path(engine) -> dict:
    """Which path an engine ran: its runner's name and, on the fast runner, the class of its
    products (:mod:`llminfra.runner.matmul`), its decode attention (``"C paged"`` or
    ``"torch"``) and whether its decode step was one C call; on the readable runner, the kind
    of its model's layers (``"plain"``: ``F.linear``, ``"onednn"``: prepacked)."""
    r = engine.runner
    if not isinstance(r, FastRunner):
        return {"runner": r.name, "matmul": matmul_kind(r.model)}
    w = r.weights
    return {"runner": r.name, "matmul": type(w.layers[0].wqkv).__name__,
            "attention": "torch" if w.paged_decode is None else "C paged",
            "one_call_step": r.stack is not None}


def engine_sides(model, tok, work, prompts) -> dict:
    """``side -> run()`` of the two engine rows: ``engine`` on what ``serve`` builds for
    :data:`MODEL` here by default (:func:`~llminfra.runner.kernel_choice.engine_runner`, its
    kernels built once), ``engine_plain`` on the readable runner and ``F.linear``."""
    net, runner = engine_runner(model, MODEL)
    return {"engine": lambda: run_engine(net, tok, work, prompts, runner),
            "engine_plain": lambda: run_engine(model, tok, work, prompts)}


def run(quick: bool = False, n_requests: int | None = None, max_output: int | None = None,
        repeats: int | None = None, models: tuple | None = None,
        agreement_prompts: int | None = None) -> dict:
    """Everything in the module docstring on one thread (restored afterwards). ``quick``: the
    smaller sizes of :data:`SIZES`; ``n_requests``, ``max_output`` (a cap on each request's
    output tokens and on the decode measurement's), ``repeats`` and ``agreement_prompts`` (the
    first that many of :data:`~llminfra.bench.real_decode.AGREEMENT_PROMPTS`) override them
    (the tests run a tiny workload). ``models``: ``(model, tokenizer, hf_model)`` already
    loaded from the same file (the tests load transformers' once for all their checks), else
    both are loaded here. ``ImportError`` without transformers."""
    transformers = import_transformers()
    with torch_threads(1):
        size = dict(SIZES[bool(quick)], agreement_prompts=agreement_prompts)
        return _run(transformers, size, quick, n_requests, max_output, repeats, models)


def _compare(transformers, model, tok, hf, work, prompts, repeats: int, notes: list) -> dict:
    """Every side's best run (of ``repeats``, interleaved) and the runs' throughputs."""
    pad = hf.generation_config.pad_token_id or 0
    engines = engine_sides(model, tok, work, prompts)
    runners = {**engines,
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


def _workload_record(work: list, size: dict, max_output: int | None) -> dict:
    """What the result says of its workload: the trace, its scale and mean lengths."""
    n = len(work)
    return {
        "num_requests": n, "arrivals": "all at t = 0 (offline)",
        "trace": f"sharegpt x {size['scale']}, prompt + output <= {size['max_seq_len']}"
                 + (f", outputs <= {max_output}" if max_output else ""),
        "scaled_down": "at the trace's lengths (mean 161 in, 338 out) the sequential "
                       "baseline alone would take over an hour on a 2-core CPU",
        "prompt_tokens_mean": sum(r.prompt_len for r in work) / n,
        "output_tokens_mean": sum(r.output_len for r in work) / n,
        "output_tokens_total": sum(r.output_len for r in work),
        "repeats": size["repeats"], "engine": dict(ENGINE)}


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
    int4 = int4_decoders(model, DECODE_PROMPT_LEN + size["decode_tokens"] + 1)
    decode_s, int4_bytes = decode_s_per_token(model, corpus_prompts(
        tok, [WorkloadRequest(0.0, DECODE_PROMPT_LEN, 1)])[0], size["decode_tokens"],
        size["repeats"], int4)
    w_bytes = {"fp32": parameter_bytes(model), "int4": int4_bytes}
    n = len(work)
    result = {
        "environment": {**environment(), "cpu_name": cpu_name(),
                        "transformers": transformers.__version__},
        "quick": quick, "seed": SEED, "threads": 1, "model": MODEL, "dtype": "fp32",
        "matmul": matmul_kernel(), "workload": _workload_record(work, size, max_output),
        "engine_paths": {k: best[k]["path"] for k in ENGINE_SIDES},
        "copy_bandwidth_bytes_per_s": bw,
        "throughput_tokens_per_s": {k: v["throughput_tokens_per_s"] for k, v in best.items()},
        "throughput_tokens_per_s_runs": cmp["runs"],
        "ttft_p50_s": {k: percentile(v["ttft_s"], 50) for k, v in best.items()},
        "ttft_p99_s": {k: percentile(v["ttft_s"], 99) for k, v in best.items()},
        "greedy_tokens_equal_engine": {
            k: sum(a == b for a, b in zip(v["tokens"], best["engine"]["tokens"])) / n
            for k, v in best.items() if k != "engine"},
        "decode_ms_per_token": {k: v * 1e3 for k, v in decode_s.items()},
        "int4_kernel": int4_kernel(),
        "int4_kernel_build": w4a8.build_info()["path"] if int4_kernel() == "w4a8" else None,
        "int4_greedy_identical": int4_greedy_identical(
            model, tok, int4, size["decode_tokens"],
            AGREEMENT_PROMPTS[:size["agreement_prompts"]]),
        "weight_bytes": w_bytes,
        "decode_floor_ms": {k: b / bw * 1e3 for k, b in w_bytes.items()},
        "notes": notes,
    }
    result.update(targets(result))
    result["seconds"] = time.perf_counter() - t_start
    return result


def targets(r: dict) -> dict:
    """The issue's ratios and whether each is met: the engine as ``serve`` runs it / best HF
    mode >= 1.3; on the default kernel (``r["matmul"]``), batch-1 decode / its floor (eager
    <= 2.5, fast <= 1.6, fast_int4 <= 2.5 of the int4 floor). The other rows' ratios are given
    beside them (``engine_plain_vs_best_hf``, ``eager_plain_vs_floor``,
    ``fast_plain_vs_floor``, ``fast_skinny_vs_floor``, ``fast_int4_2pass_vs_floor``,
    ``fast_int4_torch_vs_floor``), not held to a target."""
    thr, d, f = r["throughput_tokens_per_s"], r["decode_ms_per_token"], r["decode_floor_ms"]
    best_hf = max((k for k in thr if k not in ENGINE_SIDES), key=thr.get)
    out = {"best_hf_mode": best_hf, "engine_vs_best_hf": thr["engine"] / thr[best_hf],
           "eager_vs_floor": d["eager"] / f["fp32"], "fast_vs_floor": d["fast"] / f["fp32"],
           "fast_int4_vs_floor": d["fast_int4"] / f["int4"]}
    if "engine_plain" in thr:
        out["engine_plain_vs_best_hf"] = thr["engine_plain"] / thr[best_hf]
    for path in ("eager_plain", "fast_plain", "fast_skinny"):
        if path in d:
            out[f"{path}_vs_floor"] = d[path] / f["fp32"]
    for path in ("fast_int4_2pass", "fast_int4_torch"):
        if path in d:
            out[f"{path}_vs_floor"] = d[path] / f["int4"]
    limits = {"engine_vs_best_hf": (">=", 1.3), "eager_vs_floor": ("<=", 2.5),
              "fast_vs_floor": ("<=", 1.6), "fast_int4_vs_floor": ("<=", 2.5)}
    out["targets_met"] = {f"{k} {op} {x}": (out[k] >= x if op == ">=" else out[k] <= x)
                          for k, (op, x) in limits.items()}
    return out


def format_table(result: dict) -> str:
    """The numbers as a plain-text table."""
    r, w = result, result["workload"]
    path = r["engine_paths"]["engine"]
    lines = [f"{w['num_requests']} requests ({w['trace']}), fp32, 1 thread, "
             f"{r['environment']['cpu_name']}; eager / fast matmul: {r['matmul']}",
             "engine (serve's default): " + ", ".join(f"{k} {v}" for k, v in path.items()),
             f"int4 kernel: {r['int4_kernel']}"
             + (f" ({r['int4_kernel_build']})" if r.get("int4_kernel_build") else ""),
             f"{'mode':<15}{'tokens/s':>10}{'TTFT p50 s':>12}{'TTFT p99 s':>12}"
             f"{'same tokens':>13}"]
    for k, thr in r["throughput_tokens_per_s"].items():
        same = r["greedy_tokens_equal_engine"].get(k)
        lines.append(f"{k:<15}{thr:>10.4g}{r['ttft_p50_s'][k]:>12.4g}{r['ttft_p99_s'][k]:>12.4g}"
                     f"{'-' if same is None else f'{same:.0%}':>13}")
    f = r["decode_floor_ms"]
    d = r["decode_ms_per_token"]
    lines.append("batch-1 decode: " + ", ".join(f"{k} {v:.4g}" for k, v in d.items())
                 + " ms/token; floor "
                 f"fp32 {f['fp32']:.4g} ms, int4 {f['int4']:.4g} ms (copy "
                 f"{r['copy_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s)")
    lines.append(f"targets (best HF mode: {r['best_hf_mode']}): " + "; ".join(
        f"{rule.split()[0]} {r[rule.split()[0]]:.3g} ({rule.split(' ', 1)[1]}: {ok})"
        for rule, ok in r["targets_met"].items()))
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
