"""``python -m llminfra bench spec [--quick] --json PATH``: speculative decoding in the engine, on
the real model (SmolLM2-135M-Instruct, fp32), one CPU thread, batch 1.

Two greedy chat workloads, each request served alone (``max_num_seqs=1``: the latency-bound
regime speculation is for):

* ``input_grounded`` — edit a given text (:data:`EDITS`: repeat it, put it in the past tense,
  correct its spelling, replace a word): the answer copies much of the prompt, which prompt
  lookup can find;
* ``open_chat`` — short open questions: little to copy.

Configurations: ``baseline`` (no speculation), then for each proposer — ``ngram`` (prompt lookup)
and ``draft_int4`` (the same model in int4 through :class:`~llminfra.runner.FastDecoder`, groups of
64, drafting for the fp32 target) — γ ∈ :data:`GAMMAS` and ``adaptive`` (γ ≤ 6 by
:func:`~llminfra.engine.spec_decode.choose_gamma`). Each run keeps its best time of ``repeats``,
all configurations taking turns within a round (interleaved), so a neighbour's burst on a shared
machine does not decide a ratio. Every configuration's tokens must equal the baseline's
(``tokens_equal_baseline``: greedy speculation is exact).

Per configuration and workload: ``acceptance_rate`` (drafts kept / drafts proposed: every draft
after a step's first rejection counts as not kept), ``draft_misses`` (verifications that rejected
a draft), ``kept_past_end`` (kept drafts after a request's end-of-text token, dropped) and
``per_draft_acceptance`` α = kept / (kept + misses) — the chance that a draft the
target actually judged is kept, the α of the formula and of the adaptive rule (under the
formula's own model, independent drafts kept with probability α, kept / proposed is
(α + … + α^γ) / γ, less than α) — ``tokens_per_step`` (generated tokens / engine steps; the
baseline's is 1), ``speedup`` (baseline time / its time), and the formulas beside them:
``predicted_tokens_per_step`` (:func:`predicted_tokens_per_step`: the mean over steps of
(1 − α^{γ+1}) / (1 − α) at the per-draft α and the γ each used, with the steps that proposed
nothing at 1) and ``step_cost_ratio`` (its seconds per step / the baseline's),
from which the costs c₀ and c of 1 + c₀ + γ·c are fitted (``fitted_costs``). Targets: prompt lookup ≥ 1.5× on
``input_grounded``; the adaptive rule never below 0.9× on ``open_chat``. Chapter 05.
"""

from __future__ import annotations

import time

import torch

from llminfra.bench.timing import cpu_name, environment, torch_threads
from llminfra.engine import LLMEngine, SamplingParams, SpeculativeConfig
from llminfra.engine.spec_decode import expected_tokens_per_step
from llminfra.model import load_pretrained
from llminfra.runner import FastDecoder
from llminfra.quant import int4_linear

MODEL = "smollm2-135m"
GAMMAS = (2, 4, 6)
INT4_GROUP = 64
QUESTIONS = ("What are three tips for learning a new language?",
             "Why is the sky blue? Answer in two sentences.",
             "Write a short poem about the sea.",
             "What should I pack for a weekend hiking trip?")
#: the input-grounded requests: an edit of a given text (the course's own prose)
EDITS = (
    ("Repeat the following text exactly:",
     "A serving engine keeps the model in memory and answers many requests at once. Each "
     "step it reads every weight, so the more sequences share a step, the cheaper each token."),
    ("Rewrite the following text in the past tense:",
     "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun all afternoon, "
     "and the fox runs back to the forest before the farmer comes home."),
    ("Correct the spelling mistakes in the following text and return it:",
     "The cach holds the keys and values of evry token, so the model does not compute them "
     "agian. When the cache is ful, the scheduler must wait or preempt a request."),
    ("Rewrite the following text, replacing 'cat' with 'dog':",
     "My cat wakes up early. The cat eats breakfast, then the cat sits by the window and "
     "watches the birds until the cat falls asleep again."),
)
SIZES = {False: dict(n_prompts=4, max_tokens=96, repeats=3),
         True: dict(n_prompts=2, max_tokens=48, repeats=1)}


def workloads(tokenizer, n_prompts: int) -> dict[str, list[list[int]]]:
    """Chat-templated prompt ids of the two workloads."""
    def chat(text):
        return tokenizer.encode(tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True))
    return {"input_grounded": [chat(f"{ask}\n\n{text}") for ask, text in EDITS[:n_prompts]],
            "open_chat": [chat(q) for q in QUESTIONS[:n_prompts]]}


def configs(model) -> dict[str, SpeculativeConfig | None]:
    """Every configuration measured, the baseline first."""
    draft = FastDecoder(model, linear=int4_linear(INT4_GROUP))
    out: dict[str, SpeculativeConfig | None] = {"baseline": None}
    for name, kw in (("ngram", dict(method="ngram")),
                     ("draft_int4", dict(method="draft", draft=draft))):
        for g in GAMMAS:
            out[f"{name}_g{g}"] = SpeculativeConfig(num_speculative_tokens=g, **kw)
        out[f"{name}_adaptive"] = SpeculativeConfig(num_speculative_tokens=max(GAMMAS),
                                                    adaptive=True, **kw)
    return out


def predicted_tokens_per_step(num_steps: int, verifications: int, draft_tokens: int,
                              alpha: float) -> float:
    """Tokens per engine step the formula predicts: the ``num_steps − verifications`` steps
    that proposed nothing yield 1, each verification E(α, γ̄) = (1 − α^{γ̄+1}) / (1 − α) at
    the per-draft acceptance ``alpha`` and the mean γ̄ = ``draft_tokens / verifications``
    (linear between the two whole γ around it). Leviathan et al., 2023, arXiv:2211.17192,
    eq. 1. Chapter 05 §9."""
    if not verifications:
        return 1.0
    gamma = draft_tokens / verifications
    g_lo = int(gamma)
    e = (expected_tokens_per_step(alpha, g_lo) * (g_lo + 1 - gamma)
         + expected_tokens_per_step(alpha, g_lo + 1) * (gamma - g_lo))
    return (num_steps - verifications + verifications * e) / num_steps


def per_draft_acceptance(kept: int, misses: int) -> float | None:
    """α = kept / (kept + misses): each verification judges its drafts up to the first
    rejection, so a draft is a trial only if every draft before it was kept; the drafts after
    a miss were never judged. None when nothing was judged."""
    return kept / (kept + misses) if kept + misses else None


def serve(model, tokenizer, prompts, spec, max_tokens: int) -> dict:
    """One run: every prompt alone through a fresh engine; time, tokens and counters (the
    verifications that rejected a draft counted here, around the engine's verify)."""
    engine = LLMEngine(model, tokenizer, max_num_seqs=1, speculative=spec)
    misses = [0]
    if engine.speculator is not None:
        verify = engine.speculator.verify

        def counted(seq, logits, drafts):
            tokens = verify(seq, logits, drafts)
            misses[0] += int(len(tokens) - 1 < len(drafts))
            return tokens
        engine.speculator.verify = counted
    params = SamplingParams(max_tokens=max_tokens)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - t0
    stats = engine.stats()
    row = {"seconds": seconds, "tokens": [o.outputs[0].token_ids for o in outs],
           "num_steps": stats["num_steps"],
           "generation_tokens": stats["generation_tokens_total"],
           "acceptance_rate": stats.get("spec_acceptance_rate"),
           "draft_tokens": stats.get("spec_draft_tokens_total", 0),
           "verifications": stats.get("spec_verifications_total", 0),
           "per_draft_acceptance": None, "draft_misses": None, "kept_past_end": None,
           "predicted_tokens_per_step": None}
    if spec is not None:
        row.update(with_misses(row, stats["spec_accepted_tokens_total"], misses[0]))
    return row


def with_misses(row: dict, kept: int, misses: int) -> dict:
    """``draft_misses``, ``per_draft_acceptance`` and ``predicted_tokens_per_step`` of a
    row with ``kept`` drafts kept and ``misses`` rejections, and ``kept_past_end``: tokens the
    steps yielded (1 per step + the kept drafts) that the answers do not hold — a request
    that stops on its end-of-text token inside a step drops the kept drafts after it."""
    alpha = per_draft_acceptance(kept, misses)
    return {"draft_misses": misses, "per_draft_acceptance": alpha,
            "kept_past_end": kept + row["num_steps"] - row["generation_tokens"],
            "predicted_tokens_per_step": predicted_tokens_per_step(
                row["num_steps"], row["verifications"], row["draft_tokens"],
                0.0 if alpha is None else alpha)}


def run(quick: bool = False, models: tuple | None = None, n_prompts: int | None = None,
        max_tokens: int | None = None, repeats: int | None = None) -> dict:
    """Everything in the module docstring, on one thread (restored afterwards). ``models``:
    ``(model, tokenizer)`` already loaded; the other arguments override :data:`SIZES` (the
    tests run a tiny one)."""
    size = dict(SIZES[bool(quick)])
    for key, value in (("n_prompts", n_prompts), ("max_tokens", max_tokens),
                       ("repeats", repeats)):
        if value is not None:
            size[key] = value
    with torch_threads(1):
        model, tok = models if models is not None else load_pretrained(MODEL)
        loads = workloads(tok, size["n_prompts"])
        cfgs = configs(model)
        env = environment()                       # inside: torch_threads says 1
        best: dict[tuple[str, str], dict] = {}
        for _ in range(size["repeats"]):
            for wname, prompts in loads.items():
                for cname, spec in cfgs.items():
                    r = serve(model, tok, prompts, spec, size["max_tokens"])
                    old = best.get((wname, cname))
                    if old is None or r["seconds"] < old["seconds"]:
                        best[wname, cname] = r
    results = {w: {} for w in loads}
    for (wname, cname), r in best.items():
        base = best[wname, "baseline"]
        row = {k: v for k, v in r.items() if k != "tokens"}
        row["tokens_equal_baseline"] = r["tokens"] == base["tokens"]
        row["tokens_per_step"] = r["generation_tokens"] / r["num_steps"]
        row["speedup"] = base["seconds"] / r["seconds"]
        row["step_cost_ratio"] = ((r["seconds"] / r["num_steps"])
                                  / (base["seconds"] / base["num_steps"]))
        if r["draft_tokens"]:
            row["fitted_cost_per_draft"] = ((row["step_cost_ratio"] - 1)
                                            / (r["draft_tokens"] / r["num_steps"]))
        results[wname][cname] = row
    out = {"suite": "spec", "model": MODEL, "quick": bool(quick), "sizes": size,
           "threads": 1, "cpu": cpu_name(), "environment": env, "workloads": results,
           "fitted_costs": {p: fit_costs(results, p) for p in ("ngram", "draft_int4")}}
    out["targets"] = targets(out)
    return out


def fit_costs(results: dict, proposer: str) -> dict:
    """Least squares over the fixed-γ runs of ``proposer`` (both workloads): seconds per step /
    the baseline's − 1 = c₀·f + c·d, f the share of steps that verified drafts, d the drafts
    per step. The ``cost_fixed`` c₀ and ``cost_per_draft`` c of
    :data:`llminfra.engine.spec_decode.DEFAULT_COSTS`."""
    rows, ys = [], []
    for rows_of in results.values():
        for g in GAMMAS:
            r = rows_of[f"{proposer}_g{g}"]
            rows.append([r["verifications"] / r["num_steps"], r["draft_tokens"] / r["num_steps"]])
            ys.append([r["step_cost_ratio"] - 1.0])
    sol = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64),
                             torch.tensor(ys, dtype=torch.float64)).solution
    return {"cost_fixed": float(sol[0, 0]), "cost_per_draft": float(sol[1, 0]),
            "num_points": len(ys)}


def targets(r: dict) -> dict:
    """The issue's targets, met or not, with the numbers they are judged on."""
    w = r["workloads"]
    lookup = max(w["input_grounded"][f"ngram_g{g}"]["speedup"] for g in GAMMAS)
    adaptive = min(w["open_chat"][f"{p}_adaptive"]["speedup"] for p in ("ngram", "draft_int4"))
    return {"prompt_lookup_input_grounded_speedup": lookup,
            "prompt_lookup_input_grounded_met": lookup >= 1.5,
            "adaptive_open_chat_min_speedup": adaptive,
            "adaptive_open_chat_met": adaptive >= 0.9,
            "all_tokens_equal_baseline": all(row["tokens_equal_baseline"]
                                             for rows in w.values() for row in rows.values())}


def recount_misses(record: dict, models: tuple | None = None) -> dict:
    """``record`` (a :func:`run` result without ``draft_misses``) with them added: every
    speculative configuration served once more, untimed. Greedy decoding and the rules that
    choose drafts depend on tokens only, never on time, so the run repeats the recorded one
    step for step; a row whose counters (steps, tokens, drafts, verifications, kept) differ
    raises instead. Timings and speed-ups stay as recorded."""
    size = record["sizes"]
    with torch_threads(1):
        model, tok = models if models is not None else load_pretrained(record["model"])
        loads = workloads(tok, size["n_prompts"])
        cfgs = configs(model)
        out = {**record, "workloads": {w: dict(rows) for w, rows in record["workloads"].items()}}
        for wname, prompts in loads.items():
            for cname, spec in cfgs.items():
                if spec is None:
                    continue
                old = record["workloads"][wname][cname]
                r = serve(model, tok, prompts, spec, size["max_tokens"])
                for key in ("num_steps", "generation_tokens", "draft_tokens", "verifications",
                            "acceptance_rate"):
                    if r[key] != old[key]:
                        raise RuntimeError(f"{wname}/{cname}: {key} {r[key]} in the recount, "
                                           f"{old[key]} recorded: not the same run")
                kept = round(old["acceptance_rate"] * old["draft_tokens"])
                out["workloads"][wname][cname] = {**old, **with_misses(old, kept,
                                                                       r["draft_misses"])}
    out["misses_recounted"] = {"date": environment()["date"], "torch": torch.__version__,
                               "cpu": cpu_name(), "counters_equal": True}
    return out


def format_table(result: dict) -> str:
    """One line per workload and configuration: kept / proposed, the per-draft α, tokens per
    step and the formula's prediction from α, the step cost and the speed-up."""
    lines = [f"bench spec: {result['model']}, fp32 target, one thread, batch 1, "
             f"{result['cpu']}",
             f"{'workload':<15} {'config':<19} {'kept/prop':>9} {'alpha':>6} {'tok/step':>8} "
             f"{'pred':>6} {'cost':>6} {'speedup':>7} {'equal':>5}"]

    def g(x):
        return '-' if x is None else f'{x:.3g}'
    for wname, rows in result["workloads"].items():
        for cname, row in rows.items():
            lines.append(f"{wname:<15} {cname:<19} {g(row['acceptance_rate']):>9} "
                         f"{g(row.get('per_draft_acceptance')):>6} "
                         f"{row['tokens_per_step']:>8.3g} "
                         f"{g(row['predicted_tokens_per_step']):>6} "
                         f"{row['step_cost_ratio']:>6.3g} {row['speedup']:>7.3g} "
                         f"{str(row['tokens_equal_baseline']):>5}")
    for name, c in result.get("fitted_costs", {}).items():
        lines.append(f"fitted step cost, {name}: 1 + {c['cost_fixed']:.3g} + "
                     f"{c['cost_per_draft']:.3g}·γ plain steps")
    t = result["targets"]
    lines.append(f"targets: prompt lookup on input_grounded {t['prompt_lookup_input_grounded_speedup']:.3g}x "
                 f"(>= 1.5: {t['prompt_lookup_input_grounded_met']}); adaptive on open_chat "
                 f"min {t['adaptive_open_chat_min_speedup']:.3g}x (>= 0.9: "
                 f"{t['adaptive_open_chat_met']}); tokens equal: {t['all_tokens_equal_baseline']}")
    return "\n".join(lines)
