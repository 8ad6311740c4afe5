"""What ``make compare-engines`` writes (:mod:`llminfra.bench.compare_engines`): greedy agreement
and throughput ratios per weight format, and chapter 10's plan for this machine beside what the
engines measured.

**The plan's prediction.** Chapter 10 predicts an engine's speed as a roofline bound (chapter
08) divided by an assumed efficiency. Here the roofline is this CPU's, measured in the same run
(copy bandwidth, and as the compute roof the faster of torch's fp32 matmul and the package's
panel kernel, on the servers' thread count: :func:`llminfra.bench.roofline.measure_cpu_roofline`),
and the bound is SmolLM2-135M's (:func:`llminfra.calc.roofline.step_time_s`, the output layer
only for each sequence's last new token, ``logits="last"``: a prefill needs the last position's
logits alone) in a closed loop of ``c`` clients, each request with the run's mean prompt and
``n`` output tokens:

* TPOT: one decode step of ``c`` sequences at the mean context (prompt + n / 2);
* TTFT: one step holding a new prompt's prefill beside ``c − 1`` decoding sequences (a closed
  loop admits a request while the others decode);
* throughput: ``c · n / (TTFT + (n − 1) · TPOT)``.

The bound is of a mean request, so it is compared with the engines' means (mean TTFT, mean
TPOT; throughput is a total). It assumes efficiency 1, so each engine's **efficiency** is
bound / measured, one for TTFT and one for TPOT: the numbers chapter 10 tells a planner to put
in place of its assumed 50 %. :func:`replan` recomputes a recorded report's bound on another
roof.
"""

from __future__ import annotations

import math

from llminfra.bench.compare_servers import OURS
from llminfra.bench.server_process import agreement
from llminfra.calc.roofline import Roofline, step_time_s
from llminfra.specs.models import ModelSpec


def greedy_agreement(results: dict, specs) -> dict:
    """``{label: [per probe]}``: every peer against our server of its weight format, and our
    int4 server against our fp32 one (its weights are the fp32 ones rounded again onto
    ``int4-g32``, not llama.cpp's Q4_1 values, and change some greedy tokens: reported, not
    hidden)."""
    out = {}
    for spec in specs:
        ref = OURS["fp32"] if spec.label == OURS["int4"] else OURS.get(spec.fmt)
        if spec.label != ref and ref in results:
            out[f"{spec.label} vs {ref}"] = agreement(results[ref]["probe_texts"],
                                                      results[spec.label]["probe_texts"])
    return out


def throughput_ratios(results: dict, specs) -> dict:
    """``{peer label: {concurrency: ours / theirs}}``: output tokens/s of our server of the
    peer's weight format over the peer's, per concurrency."""
    out = {}
    for spec in specs:
        if spec.engine == "llminfra" or OURS[spec.fmt] not in results:
            continue
        ours = results[OURS[spec.fmt]]["concurrency"]
        theirs = results[spec.label]["concurrency"]
        out[spec.label] = {c: ours[c]["output_tokens_per_s"]
                           / (theirs[c]["output_tokens_per_s"] or math.nan) for c in ours}
    return out


def plan_bound(model: ModelSpec | str, roof: Roofline, clients: int, prompt_tokens: float,
               output_tokens: int) -> dict:
    """The roofline's TTFT, TPOT (seconds) and output tokens/s for ``clients`` in a closed
    loop (the module docstring), fp32 weights and KV."""
    p = max(1, round(prompt_tokens))
    context = p + output_tokens // 2
    tpot = step_time_s(model, roof, [(1, context)] * clients, dtype="fp32", logits="last")
    ttft = step_time_s(model, roof, [(p, p)] + [(1, context)] * (clients - 1), dtype="fp32",
                       logits="last")
    return {"ttft_s": ttft, "tpot_s": tpot,
            "output_tokens_per_s": clients * output_tokens / (ttft + (output_tokens - 1) * tpot)}


def plan_beside_measured(model: ModelSpec | str, roof: Roofline, results: dict,
                         output_tokens: int) -> dict:
    """Per concurrency: the plan's bound (:func:`plan_bound` at the run's mean prompt) and,
    per fp32 server of ``results`` (its ``format``), what it measured (mean TTFT, mean TPOT,
    tokens/s) and its efficiency (bound / measured time, measured / bound tokens/s)."""
    out = {}
    fp32 = [label for label, r in results.items() if r.get("format") == "fp32"]
    if not fp32:
        return out
    for c in results[fp32[0]]["concurrency"]:
        row = results[fp32[0]]["concurrency"][c]
        bound = plan_bound(model, roof, int(c), row["prompt_tokens"] / row["num_ok"],
                           output_tokens)
        measured = {}
        for label in fp32:
            r = results[label]["concurrency"][c]
            got = {"ttft_s": r["ttft_s"]["mean"], "tpot_s": r["tpot_s"]["mean"],
                   "output_tokens_per_s": r["output_tokens_per_s"], "statistic": "mean"}
            eff = {"tpot": bound["tpot_s"] / got["tpot_s"], "ttft": bound["ttft_s"] / got["ttft_s"],
                   "throughput": got["output_tokens_per_s"] / bound["output_tokens_per_s"]}
            measured[label] = {**got, "efficiency": eff}
        out[c] = {"bound": bound, "measured": measured}
    return out


def replan(report: dict, roof: Roofline, model: ModelSpec | str | None = None) -> dict:
    """:func:`plan_beside_measured` of a recorded ``make compare-engines`` report (its servers,
    its output length) on ``roof``: the same engines' runs against another bound. ``model``
    defaults to the report's."""
    return plan_beside_measured(report["model"] if model is None else model, roof,
                                report["servers"], report["settings"]["output_tokens"])


def roofline_json(roof: Roofline, threads: int) -> dict:
    """The roof as the report records it: name, threads, copy and compute rates, source."""
    return {"name": roof.name, "threads": threads, "copy_bytes_per_s": roof.bytes_per_s,
            "matmul_flops_per_s": roof.peak_flops_per_s, "source": roof.source}
