"""``python -m llminfra bench serving``: the engine's batching policies side by side, on one run.

One seeded workload (:func:`llminfra.sim.workload.serving_workload`: chapter-04 trace lengths,
ShareGPT-like, scaled to the tiny model's 256-token context, Poisson arrivals) is served by the
real :class:`~llminfra.engine.LLMEngine` on the trained tiny model under each policy (static,
dynamic, continuous): throughput in output tokens/s and TTFT percentiles. Then:

* ``decode_tokens_per_s[preset][batch]``: tokens/s of pure decode steps at batch 1, 4, 16, 64,
  for the tiny model and the ~100M preset (random weights);
* ``decode_floor_s[preset]``: the time to read the weights once at the copy bandwidth measured
  in this run (bytes read + written per second of a large copy, as STREAM's "Copy" counts
  them, McCalpin 1995 — the memory system's sustained rate); ``decode_floor_read_s`` the same
  at the read-only bandwidth of a large sum, which a copy understates;
* ``runners``: per preset, decode tokens/s at batch 1 and 16 and torch calls per decode step
  of the readable and the fast model runner (:mod:`llminfra.engine.model_runner`);
* ``chunked_prefill``: TTFT p50 of the short requests of a long/short mix, chunking on and off;
* ``simulator_calibration``: the simulator's overhead term fitted to the continuous run's steps
  (roofline of this CPU from the measured copy bandwidth and matmul rate) and its residual;
* ``http``: the OpenAI-compatible server over HTTP at concurrency 16 against the in-process
  engine on the same requests (:mod:`llminfra.bench.serving_http`).

Targets (ratios of one run): continuous ≥ 2× static throughput; on the ~100M preset batch 16 ≥
5× batch 1's tokens/s and batch-1 decode ≤ 2.5× its floor; ``http_vs_engine`` ≥ 0.7. Chapter 05.

Everything runs on **one thread** (``torch.set_num_threads(1)``, restored afterwards), as
chapter 05 and the HTTP part do: the tiny model's matrices are too small for a second thread,
and a batch-1 decode is a matrix-vector product that this torch build's BLAS runs on one core
whatever the setting (a large fp32 matrix-vector product read no more bytes per second at two
threads than at one on the project's 2-core machine, where a large sum nearly doubled), so a
floor taken at two threads' bandwidth would measure the BLAS's threading, not the engine. The three
policies are run interleaved (static, dynamic, continuous, then again) and each keeps its best
throughput of the ``POLICY_REPEATS`` runs (all of them are in ``throughput_tokens_per_s_runs``),
so a neighbour's burst on a shared machine does not decide the ratio.
"""

from __future__ import annotations

import time
from types import MappingProxyType

import torch

from llminfra.bench.roofline import count_torch_calls
from llminfra.bench.serving_http import run_http_vs_engine
from llminfra.bench.timing import (best_time_s, copy_bandwidth_bytes_per_s, environment,
                                   torch_threads)
from llminfra.calc.measured import parameter_bytes
from llminfra.engine import (LLMEngine, SamplingParams, default_num_blocks, percentile,
                             summarize)
from llminfra.model import ByteTokenizer, ModelConfig, Transformer, heldout_tokens, load_tiny
from llminfra.sim.simulator import Simulator, fit_overhead_s, roofline_step_time
from llminfra.sim.workload import WorkloadRequest, serving_workload
from llminfra.calc.roofline import Roofline
from llminfra.runner import runner_for

SEED = 2024
POLICIES = ("static", "dynamic", "continuous")
BATCHES = (1, 4, 16, 64)
#: runs of each policy (interleaved); each policy keeps its best (``--quick``: one)
POLICY_REPEATS = 3
#: the model runners compared (:mod:`llminfra.engine.model_runner`), at these batches
RUNNERS = ("readable", "fast")
RUNNER_BATCHES = (1, 16)
#: Poisson arrival rate of the policy comparison: fast enough that every request has arrived
#: long before the server drains the queue (a saturated server, where throughput measures the
#: policy, not the arrival rate), spread enough that dynamic batching's window matters
RATE_PER_S = 400.0
#: engine settings of the policy comparison (tiny model, 256-token context)
ENGINE = MappingProxyType(dict(block_size=16, max_num_seqs=16, max_num_batched_tokens=256,
                               dynamic_window_s=0.05))


def read_bandwidth_bytes_per_s(nbytes: int = 2**28, repeats: int = 3) -> float:
    """Bytes read / s of ``src.sum()`` on ``nbytes`` float32s: a read-only stream, as a decode
    step's weight reads are (a copy also pays for its writes and, with write-allocate caches,
    for reading the destination first, so it understates what reads alone reach)."""
    src = torch.ones(nbytes // 4)
    return nbytes / best_time_s(lambda: src.sum(), repeats)


def matmul_flops_per_s(n: int = 1024, repeats: int = 3) -> float:
    """2·n³ / s of an n × n float32 matmul (this CPU's practical peak)."""
    g = torch.Generator().manual_seed(SEED)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    return 2 * n ** 3 / best_time_s(lambda: a @ b, repeats)


def _prompts(work: list[WorkloadRequest]) -> list[list[int]]:
    """Prompt token ids cut from the held-out corpus, one window per request."""
    text = heldout_tokens().tolist()
    return [text[(97 * i) % (len(text) - r.prompt_len):][:r.prompt_len]
            for i, r in enumerate(work)]


def serve(model, tokenizer, work: list[WorkloadRequest], prompts, *, record: bool = False,
          **engine_kwargs) -> tuple[list, LLMEngine]:
    """Serve ``work`` in real time (requests enter when their arrival time has passed); returns
    the finished requests' final :class:`~llminfra.engine.RequestOutput` and the engine."""
    engine = LLMEngine(model, tokenizer, **engine_kwargs)
    engine.step_log = [] if record else None
    t0, i, done = time.perf_counter(), 0, []
    while i < len(work) or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while i < len(work) and work[i].arrival_time_s <= now:
            engine.add_request(prompts[i], SamplingParams(max_tokens=work[i].output_len),
                               arrival_time=t0 + work[i].arrival_time_s)
            i += 1
        done += [o for o in engine.step() if o.finished]
        if not engine.has_unfinished_requests() and i < len(work):
            time.sleep(max(0.0, work[i].arrival_time_s - (time.perf_counter() - t0)))
    return done, engine


def compare_policies(model, tok, work, prompts, repeats: int = 1) -> dict:
    """Throughput and TTFT of each policy, plus the continuous run's step log.

    The policies run in turn ``repeats`` times; each keeps the summary of its fastest run
    (and the step log of continuous's), and ``runs`` lists every run's throughput."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out, logs, runs = {}, {}, {p: [] for p in POLICIES}
    for _ in range(repeats):
        for policy in POLICIES:
            done, engine = serve(model, tok, work, prompts, record=policy == "continuous",
                                 policy=policy, **ENGINE)
            s = summarize([o.metrics for o in done])
            runs[policy].append(s["throughput_tokens_per_s"])
            if policy not in out or s["throughput_tokens_per_s"] > out[policy][
                    "throughput_tokens_per_s"]:
                out[policy], logs[policy] = s, engine.step_log
    return {"summary": out, "step_log": logs["continuous"], "runs": runs}


def decode_rate(model, batch: int, steps: int, prompt_len: int = 16,
                runner: str = "readable") -> float:
    """Tokens/s of decode-only steps with ``batch`` sequences (median step time) on the
    engine's ``runner``."""
    engine = LLMEngine(model, ByteTokenizer(), max_num_seqs=batch,
                       max_num_batched_tokens=max(512, batch * prompt_len), runner=runner_for(runner))
    engine.step_log = []
    for j in range(batch):
        engine.add_request([(7 * j + t) % 256 for t in range(prompt_len)],
                           SamplingParams(max_tokens=steps + 1))
    while engine.has_unfinished_requests():
        engine.step()
    times = sorted(s for b, s in engine.step_log
                   if len(b) == batch and all(n == 1 for n, _ in b))
    return batch / times[len(times) // 2]


def decode_calls(model, batch: int, runner: str, prompt_len: int = 16) -> int:
    """Torch calls of one decode step of ``batch`` sequences on the engine's ``runner``
    (:func:`llminfra.bench.calls.count_torch_calls`: calls, each with its host time; views and
    attribute reads among them launch nothing, so on a GPU the launches are fewer, chapter 08)."""
    engine = LLMEngine(model, ByteTokenizer(), max_num_seqs=batch,
                       max_num_batched_tokens=max(512, batch * prompt_len), runner=runner_for(runner))
    for j in range(batch):
        engine.add_request([(7 * j + t) % 256 for t in range(prompt_len)],
                           SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()                                               # the prompts
    return count_torch_calls(engine.step)


def compare_runners(models: dict, steps: int) -> dict:
    """Decode tokens/s at batch 1 and 16 and torch calls per decode step, readable vs fast
    runner (:mod:`llminfra.engine.model_runner`), per preset; the runs interleaved."""
    out = {}
    for name, m in models.items():
        row = {r: {"tokens_per_s": {}, "calls_per_step": {}} for r in RUNNERS}
        for b in RUNNER_BATCHES:
            for r in RUNNERS:
                row[r]["tokens_per_s"][str(b)] = decode_rate(m, b, steps, runner=r)
                row[r]["calls_per_step"][str(b)] = decode_calls(m, b, r)
        row["fast_over_readable"] = {str(b): row["fast"]["tokens_per_s"][str(b)]
                                     / row["readable"]["tokens_per_s"][str(b)]
                                     for b in RUNNER_BATCHES}
        out[name] = row
    return out


def chunked_prefill_ttft(model, tok, longs: int, shorts: int) -> dict:
    """TTFT p50 (s) of short (8-token) requests queued behind ``longs`` long (224-token) ones,
    all at t = 0, with chunked prefill on (at most 32 tokens per prompt per step, vLLM's
    ``long_prefill_token_threshold`` idea) and off (each prompt whole: one long per step).

    Off, the budget of 256 fits one long prompt per step and the queue is served in order, so
    the short ones wait for every long prefill; on, the long prompts advance 32 tokens a step
    side by side and the rest of the budget admits the short ones at once.
    """
    work = [WorkloadRequest(0.0, 224, 8)] * longs + [WorkloadRequest(0.0, 8, 8)] * shorts
    prompts = _prompts(work)
    res = {}
    for name, kw in (("on", dict(enable_chunked_prefill=True, max_prefill_chunk_tokens=32)),
                     ("off", dict(enable_chunked_prefill=False))):
        done, _ = serve(model, tok, work, prompts, max_num_seqs=16,
                        max_num_batched_tokens=256, **kw)
        by_len = {224: [], 8: []}
        for o in done:
            by_len[len(o.prompt_token_ids)].append(o.metrics.ttft_s)
        res[f"short_ttft_p50_s_{name}"] = percentile(by_len[8], 50)
        res[f"long_ttft_p50_s_{name}"] = percentile(by_len[224], 50)
    return res


def calibrate(step_log, work, config: ModelConfig, bw: float, flops: float,
              measured: dict) -> dict:
    """Fit the simulator's overhead on the continuous run's steps; simulate that run."""
    cpu = Roofline("this CPU", flops, bw, "copy bandwidth and matmul rate measured in this run")
    spec = config.to_spec("tiny")
    fit = fit_overhead_s(step_log, roofline_step_time(spec, cpu, dtype="fp32"))
    blocks = default_num_blocks(config, ENGINE["block_size"], ENGINE["max_num_seqs"],
                                torch.float32)
    sim = Simulator(roofline_step_time(spec, cpu, dtype="fp32", overhead_s=fit["overhead_s"]),
                    num_blocks=blocks, max_seq_len=config.max_seq_len, **ENGINE)
    res = summarize(sim.run(work).metrics)
    fit.update(simulated_throughput_tokens_per_s=res["throughput_tokens_per_s"],
               measured_throughput_tokens_per_s=measured["throughput_tokens_per_s"],
               simulated_ttft_p50_s=res["ttft_s"]["p50"],
               measured_ttft_p50_s=measured["ttft_s"]["p50"])
    return fit


def run(quick: bool = False) -> dict:
    """Measure everything in the module docstring, on one thread; ``quick`` uses fewer
    requests, steps and repeats (same keys)."""
    with torch_threads(1):
        return _run(quick)


def _run(quick: bool) -> dict:
    g = torch.Generator().manual_seed(SEED)
    model, tok = load_tiny()
    n_req, steps = (24, 3) if quick else (64, 8)
    work = serving_workload(n_req, g, rate_per_s=RATE_PER_S,
                            max_seq_len=model.config.max_seq_len,
                            scale=0.25)
    bw, flops = copy_bandwidth_bytes_per_s(), matmul_flops_per_s()
    read_bw = read_bandwidth_bytes_per_s()
    pol = compare_policies(model, tok, work, _prompts(work),
                           repeats=1 if quick else POLICY_REPEATS)
    s = pol["summary"]
    big = Transformer(ModelConfig.from_name("bench-100m"),
                      generator=torch.Generator().manual_seed(SEED)).eval()
    models = {"tiny": model, "bench-100m": big}
    decode = {name: {str(b): decode_rate(m, b, steps) for b in BATCHES}
              for name, m in models.items()}
    floor = {name: parameter_bytes(m) / bw for name, m in models.items()}
    floor_read = {name: parameter_bytes(m) / read_bw for name, m in models.items()}
    result = {
        "environment": environment(), "quick": quick, "seed": SEED,
        "workload": {"num_requests": n_req, "rate_per_s": RATE_PER_S,
                     "trace": "sharegpt x 0.25",
                     "prompt_tokens_mean": sum(r.prompt_len for r in work) / n_req,
                     "output_tokens_mean": sum(r.output_len for r in work) / n_req},
        "copy_bandwidth_bytes_per_s": bw, "read_bandwidth_bytes_per_s": read_bw,
        "matmul_flops_per_s": flops,
        "throughput_tokens_per_s": {p: s[p]["throughput_tokens_per_s"] for p in POLICIES},
        "throughput_tokens_per_s_runs": pol["runs"],
        "ttft_p50_s": {p: s[p]["ttft_s"]["p50"] for p in POLICIES},
        "ttft_p99_s": {p: s[p]["ttft_s"]["p99"] for p in POLICIES},
        "tpot_p50_s": {p: s[p]["tpot_s"]["p50"] for p in POLICIES},
        "decode_tokens_per_s": decode, "decode_floor_s": floor,
        "decode_floor_read_s": floor_read,
        "runners": compare_runners(models, steps),
        "chunked_prefill": chunked_prefill_ttft(model, tok, *((2, 6) if quick else (4, 12))),
        "simulator_calibration": calibrate(pol["step_log"], work, model.config, bw, flops,
                                           s["continuous"]),
    }
    result["http"] = run_http_vs_engine(**(dict(num_requests=16, max_output_tokens=32) if quick
                                           else dict(num_requests=64, max_output_tokens=64)))
    result["targets"] = targets(result)
    return result


def targets(r: dict) -> dict:
    """The issue's three ratios, and whether each is met."""
    thr, dec = r["throughput_tokens_per_s"], r["decode_tokens_per_s"]["bench-100m"]
    cont = thr["continuous"] / thr["static"]
    b16 = dec["16"] / dec["1"]
    floor = (1 / dec["1"]) / r["decode_floor_s"]["bench-100m"]
    out = {"continuous_over_static": cont, "continuous_over_static_met": cont >= 2,
           "bench100m_b16_over_b1": b16, "bench100m_b16_over_b1_met": b16 >= 5,
           "bench100m_b1_over_floor": floor, "bench100m_b1_over_floor_met": floor <= 2.5}
    if "http" in r:  # the server over HTTP at concurrency 16 / the in-process engine
        out["http_vs_engine"] = r["http"]["http_vs_engine"]
        out["http_vs_engine_met"] = out["http_vs_engine"] >= 0.7
    return out


def format_table(result: dict) -> str:
    """The numbers as a plain-text table."""
    lines = [f"{'policy':<12}{'tokens/s':>10}{'TTFT p50 s':>12}{'TTFT p99 s':>12}"]
    for p in POLICIES:
        lines.append(f"{p:<12}{result['throughput_tokens_per_s'][p]:>10.4g}"
                     f"{result['ttft_p50_s'][p]:>12.4g}{result['ttft_p99_s'][p]:>12.4g}")
    lines.append(f"{'decode tok/s':<12}" + "".join(f"{'b=' + b:>10}" for b in map(str, BATCHES))
                 + f"{'floor s':>10}")
    for name, rates in result["decode_tokens_per_s"].items():
        lines.append(f"{name:<12}" + "".join(f"{rates[str(b)]:>10.4g}" for b in BATCHES)
                     + f"{result['decode_floor_s'][name]:>10.3g}")
    for name, row in result.get("runners", {}).items():
        lines.append(f"{name} runners: " + "; ".join(
            f"b={b} readable {row['readable']['tokens_per_s'][b]:.4g} tok/s "
            f"({row['readable']['calls_per_step'][b]} calls), fast "
            f"{row['fast']['tokens_per_s'][b]:.4g} tok/s ({row['fast']['calls_per_step'][b]} "
            f"calls), {row['fast_over_readable'][b]:.3g}x" for b in map(str, RUNNER_BATCHES)))
    c, cal = result["chunked_prefill"], result["simulator_calibration"]
    lines.append(f"TTFT p50 behind long prompts: short {c['short_ttft_p50_s_on']:.4g} s chunked"
                 f" vs {c['short_ttft_p50_s_off']:.4g} s whole; long "
                 f"{c['long_ttft_p50_s_on']:.4g} s vs {c['long_ttft_p50_s_off']:.4g} s")
    lines.append(f"simulator: overhead {cal['overhead_s'] * 1e3:.3g} ms/step, residual rms "
                 f"{cal['residual_rms_s'] * 1e3:.3g} ms, median |error| "
                 f"{cal['relative_error_median']:.1%}; throughput simulated "
                 f"{cal['simulated_throughput_tokens_per_s']:.4g} vs measured "
                 f"{cal['measured_throughput_tokens_per_s']:.4g} tokens/s")
    t = result["targets"]
    lines.append(f"targets: continuous/static {t['continuous_over_static']:.3g} (>= 2: "
                 f"{t['continuous_over_static_met']}), 100M b16/b1 "
                 f"{t['bench100m_b16_over_b1']:.3g} (>= 5: {t['bench100m_b16_over_b1_met']}), "
                 f"100M b1/floor {t['bench100m_b1_over_floor']:.3g} (<= 2.5: "
                 f"{t['bench100m_b1_over_floor_met']})")
    if "http_vs_engine" in t:
        h = result["http"]
        lines.append(f"HTTP at concurrency {h['concurrency']}: {h['http_output_tokens_per_s']:.4g}"
                     f" vs in-process {h['engine_output_tokens_per_s']:.4g} tokens/s, "
                     f"http_vs_engine {t['http_vs_engine']:.3g} (>= 0.7: "
                     f"{t['http_vs_engine_met']}); engine in a thread of the server: "
                     f"{h['http_thread_output_tokens_per_s']:.4g} tokens/s, "
                     f"{h['http_vs_engine_thread']:.3g}")
    return "\n".join(lines)
