"""``python -m llminfra bench disagg``: colocated vs disaggregated serving of the real model.

One seeded mixed workload — a few long prompts (documents to summarise) among short chat
prompts, Poisson arrivals — served by SmolLM2-135M twice, in real time:

* **colocated**: one :class:`~llminfra.engine.LLMEngine` in this process, on **two** torch
  threads (and once more on one thread, ``colocated_1_thread``, for reference: on a 2-core
  machine that other processes share, two OpenMP threads can stall each other, so the
  two-thread run may be the slower one);
* **disaggregated**: a prefill and a decode process (:mod:`llminfra.cluster.disagg_process`),
  **one** thread each, the K/V sent over gloo — the same two cores in total.

Reported: TTFT and TPOT p50 / p90 / p99, SLO attainment and **goodput** (requests per second
that meet the TTFT SLO and the TPOT SLO together: Zhong et al. 2024, DistServe,
arXiv:2401.09670, §2; :func:`llminfra.sim.disagg.slo_goodput`), the KV moved per
request and the gloo link's MB/s, and whether greedy outputs agree. The SLOs are set from this
machine, as DistServe scales its SLOs from the model's own latency: TTFT SLO = 2 × a long
prompt's TTFT alone, TPOT SLO = 2 × a short request's TPOT alone, both on the colocated engine.
On a busy 2-core CPU the numbers move from run to run (other processes share the cores):
read them as one run's, and re-run for the record. Chapter 11.
"""

from __future__ import annotations

import math
import time

import torch

from llminfra.bench.serving import serve
from llminfra.bench.timing import environment, torch_threads
from llminfra.cluster.disagg_process import TimedRequest, serve_disaggregated
from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import heldout_tokens, load_pretrained
from llminfra.sim.disagg import RequestTiming, slo_goodput
from llminfra.sim.workload import WorkloadRequest, poisson_arrivals

SEED = 2026
MODEL = "smollm2-135m"
#: same engine settings in both designs (chunked prefill on, the engine's default)
ENGINE = dict(num_blocks=256, block_size=16, max_num_seqs=32, max_num_batched_tokens=512)
QUESTIONS = ("What is a KV cache?", "Name three prime numbers.", "Say hello in French.",
             "What does a GPU do?", "Give me a synonym for fast.", "What is 12 times 7?",
             "Why is the sky blue?", "Write a haiku about rain.", "What is Python?",
             "Define latency in one line.", "What is the capital of Japan?",
             "Suggest a name for a cat.")


def _prompts(tok, n_long: int, n_short: int, long_tokens: int) -> list[list[int]]:
    """Long prompts cut from the held-out corpus (``long_tokens`` each), then chat prompts."""
    text = bytes(heldout_tokens().tolist()).decode("utf-8", errors="ignore")
    ids = tok.encode(text)
    longs = [ids[5000 * k:5000 * k + long_tokens] for k in range(n_long)]
    shorts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
              for q in (QUESTIONS * 4)[:n_short]]
    return longs + shorts


def workload(tok, quick: bool) -> tuple[list[list[int]], list[WorkloadRequest]]:
    """Prompts and their arrivals: long and short prompts interleaved in a seeded order,
    Poisson arrivals; outputs of a set length (``ignore_eos``)."""
    g = torch.Generator().manual_seed(SEED)
    n_long, n_short, long_tokens, rate = (2, 8, 384, 1.5) if quick else (4, 20, 512, 1.5)
    prompts = _prompts(tok, n_long, n_short, long_tokens)
    order = torch.randperm(len(prompts), generator=g).tolist()
    prompts = [prompts[k] for k in order]
    times = poisson_arrivals(len(prompts), rate, g)
    out_len = 16 if quick else 32
    return prompts, [WorkloadRequest(t, len(p), out_len) for t, p in zip(times, prompts)]


def _timings(metrics) -> list[RequestTiming]:
    return [RequestTiming(m.arrival_time, m.ttft_s, m.tpot_s, m.e2e_s) for m in metrics]


def _slos(model, tok, prompts) -> dict:
    """TTFT of the longest prompt alone and TPOT of a short one alone (colocated, 2 threads),
    each × 2."""
    longest = max(prompts, key=len)
    shortest = min(prompts, key=len)
    engine = LLMEngine(model, tok, **ENGINE)
    engine.generate([shortest], SamplingParams(max_tokens=4, ignore_eos=True))    # warm-up
    ttft = engine.generate([longest], SamplingParams(max_tokens=1))[0].metrics.ttft_s
    tpot = engine.generate([shortest], SamplingParams(max_tokens=16, ignore_eos=True)
                           )[0].metrics.tpot_s
    return {"ttft_alone_s": ttft, "tpot_alone_s": tpot, "ttft_slo_s": 2 * ttft,
            "tpot_slo_s": 2 * tpot}


def _score(outputs, slo: dict) -> dict:
    """:func:`slo_goodput` of the requests that did not fail (both designs use the same two
    cores, so no per-GPU figure; the real transfer is reported apart)."""
    done = [o for o in outputs if o.outputs[0].finish_reason != "error"]
    g = slo_goodput(_timings([o.metrics for o in done]), slo["ttft_slo_s"], slo["tpot_slo_s"])
    for key in ("goodput_rps_per_gpu", "transfer_mean_s"):
        g.pop(key)
    g["num_errors"] = len(outputs) - len(done)
    return g


def run(quick: bool = False) -> dict:
    """Both designs on one workload; ``quick``: 10 requests of 16 tokens (else 24 of 32)."""
    with torch_threads(2):
        return _run(quick)


def _run(quick: bool) -> dict:
    model, tok = load_pretrained(MODEL)
    prompts, work = workload(tok, quick)
    slo = _slos(model, tok, prompts)
    t = time.perf_counter()
    co_out, _ = serve(model, tok, work, prompts, **ENGINE)
    co_wall = time.perf_counter() - t
    co_out = sorted(co_out, key=lambda o: int(o.request_id))
    with torch_threads(1):                   # reference: the colocated engine on one core
        one_out, _ = serve(model, tok, work, prompts, **ENGINE)
    reqs = [TimedRequest(p, SamplingParams(max_tokens=w.output_len, ignore_eos=True),
                         w.arrival_time_s) for p, w in zip(prompts, work)]
    t = time.perf_counter()
    dis = serve_disaggregated(reqs, model=MODEL, engine_kwargs=ENGINE, threads_per_worker=1,
                              timeout_s=300)
    dis_wall = time.perf_counter() - t
    transfers = dis["prefill"].get("transfers", [])
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids
               for a, b in zip(co_out, dis["outputs"]))
    return {
        "environment": environment(), "quick": quick, "seed": SEED, "model": MODEL,
        "threads": {"colocated": 2, "prefill_worker": 1, "decode_worker": 1},
        "workload": {"num_requests": len(work),
                     "prompt_tokens": [w.prompt_len for w in work],
                     "output_tokens": work[0].output_len,
                     "arrival_s": [round(w.arrival_time_s, 3) for w in work]},
        "slo": slo,
        "colocated": {**_score(co_out, slo), "wall_s": co_wall},
        "colocated_1_thread": _score(one_out, slo),
        "disaggregated": {**_score(dis["outputs"], slo), "wall_s": dis_wall,
                          "kv_bytes_per_request_mean": (sum(x["bytes"] for x in transfers)
                                                        / max(1, len(transfers))),
                          "transfer_s_mean": (sum(x["seconds"] for x in transfers)
                                              / max(1, len(transfers))),
                          "handoff_delay_s_mean": _mean(dis["decode"].get("handoff_delay_s")),
                          "blocks_leaked": {k: dis[k].get("blocks_total", 0)
                                            - dis[k].get("blocks_free", 0)
                                            for k in ("prefill", "decode")}},
        "link_mb_per_s": dis["prefill"].get("link_mb_per_s", {}),
        "greedy_outputs_equal": f"{same}/{len(work)}",
    }


def _mean(xs) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def format_table(result: dict) -> str:
    """The numbers as a plain-text table."""
    s = result["slo"]
    lines = [f"SLOs: TTFT <= {s['ttft_slo_s']:.3g} s, TPOT <= {s['tpot_slo_s'] * 1e3:.3g} ms "
             f"(2 x alone); threads: colocated 2, prefill 1 + decode 1",
             f"{'design':<19}{'TTFT p50 s':>11}{'p90':>8}{'p99':>8}{'TPOT p50 ms':>12}"
             f"{'p90':>8}{'p99':>8}{'SLO met':>9}{'goodput r/s':>12}"]
    for name in ("colocated", "colocated_1_thread", "disaggregated"):
        r = result[name]
        lines.append(f"{name:<19}{r['ttft_p50_s']:>11.3g}{r['ttft_p90_s']:>8.3g}"
                     f"{r['ttft_p99_s']:>8.3g}{r['tpot_p50_s'] * 1e3:>12.3g}"
                     f"{r['tpot_p90_s'] * 1e3:>8.3g}{r['tpot_p99_s'] * 1e3:>8.3g}"
                     f"{r['slo_attainment']:>9.0%}{r['goodput_rps']:>12.3g}")
    d = result["disaggregated"]
    link = ", ".join(f"{int(k) / 2**20:g} MiB: {v:.0f}" for k, v in
                     result["link_mb_per_s"].items())
    lines.append(f"KV per request {d['kv_bytes_per_request_mean'] / 1e6:.2f} MB, send "
                 f"{d['transfer_s_mean'] * 1e3:.2f} ms, first token -> decode worker "
                 f"{d['handoff_delay_s_mean'] * 1e3:.2f} ms; gloo MB/s ({link}); blocks leaked "
                 f"{d['blocks_leaked']}; greedy outputs equal {result['greedy_outputs_equal']}")
    return "\n".join(lines)
