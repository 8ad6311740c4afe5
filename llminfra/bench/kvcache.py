"""``python -m llminfra bench kvcache``: where KV memory goes under contiguous and paged designs.

Measured on request traces whose lengths follow the vLLM paper's workloads
(:mod:`llminfra.kvcache.trace`), served in one fixed KV budget: OPT-13B in fp16 on an A100-40GB,
the setting of Kwon et al., 2023 (arXiv:2309.06180) Fig. 2 — the package's one KV budget,
:func:`llminfra.calc.memory.kv_budget` (``0.9 · memory - weights - one prefill's activations``,
in tokens). Every number is simulated on the
package's own allocator, block tables and prefix cache; the paper's figures sit beside them under
``"paper"``. ``run_gpu()`` checks and times the Triton paged-attention kernel on CUDA.

Taught in chapter 04.
"""

from __future__ import annotations

import time

import torch

from llminfra.bench.timing import best_time_s, environment
from llminfra.kvcache.sharing import (beam_search_blocks, parallel_sampling_blocks,
                                      prefix_cache_run, sharing_saving)
from llminfra.kvcache.simulate import (PAPER, kv_budget_tokens, simulate_contiguous,
                                       simulate_paged)
from llminfra.kvcache.trace import DEFAULT_MAX_SEQ_LEN, request_trace, trace_summary
from llminfra.attention.paged import paged_attention

BLOCK_SIZES = (8, 16, 32)
WIDTHS = (2, 4, 6)
#: shared prefix length: the 5-shot prefix of the paper's §6.4 experiment (341 tokens)
SYSTEM_PROMPT_LEN = 341
SEED = 2023


def _utilisation(trace, budget: int) -> dict:
    runs = {f"contiguous-{p}": simulate_contiguous(trace, budget, p) for p in ("max", "pow2",
                                                                             "oracle")}
    runs.update({f"paged-{b}": simulate_paged(trace, budget, b) for b in BLOCK_SIZES})
    return {
        "contiguous_utilization": runs["contiguous-max"]["fractions"]["token"],
        "contiguous_utilization_by_policy": {p: runs[f"contiguous-{p}"]["fractions"]["token"]
                                             for p in ("max", "pow2", "oracle")},
        "paged_utilization": {str(b): runs[f"paged-{b}"]["fractions"]["token"]
                              for b in BLOCK_SIZES},
        "utilization_of_allocated": {k: r["utilization"] for k, r in runs.items()},
        "fragmentation": {k: r["fractions"] for k, r in runs.items()},
        "max_concurrent_requests": {k: r["max_running"] for k, r in runs.items()},
        "mean_concurrent_requests": {k: r["mean_running"] for k, r in runs.items()},
        "paged_preemptions": {k: r["preemptions"] for k, r in runs.items() if "preemptions" in r},
    }


def _sharing(workload: str, n_requests: int, gen: torch.Generator) -> dict:
    trace = request_trace(n_requests, gen, workload)
    par, beam = {}, {}
    for n in WIDTHS:
        pairs = [parallel_sampling_blocks(r.prompt_len, [x.output_len for x in
                                                          request_trace(n, gen, workload)])
                 for r in trace]
        par[str(n)] = sharing_saving(pairs)
    for w in WIDTHS:
        beam[str(w)] = sharing_saving([beam_search_blocks(r.prompt_len, r.output_len, w, gen)
                                       for r in trace])
    return {"parallel_sampling_saving": par, "beam_search_saving": beam}


def run(quick: bool = False) -> dict:
    """All measurements; ``quick`` uses fewer requests (same keys, under a minute)."""
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(SEED)
    n = 200 if quick else 1000
    budget = kv_budget_tokens()
    trace = request_trace(n, gen, "sharegpt")
    result = {"environment": environment(), "quick": quick, "seed": SEED,
              "kv_budget_tokens": budget, "max_seq_len": DEFAULT_MAX_SEQ_LEN,
              "trace": {"workload": "sharegpt", **trace_summary(trace)}}
    result.update(_utilisation(trace, budget))
    alpaca = _sharing("alpaca", 40 if quick else 150, gen)
    result.update(alpaca)
    if not quick:
        result["sharing_sharegpt"] = _sharing("sharegpt", 30, gen)
    prefix_trace = request_trace(60 if quick else 200, gen, "alpaca")
    prefix = prefix_cache_run(prefix_trace, SYSTEM_PROMPT_LEN, gen, num_blocks=400)
    result["prefix_hit_rate"] = prefix["hit_rate"]
    result["prefix_memory_saved"] = prefix["memory_saved"]
    result["memory_saved"] = {
        "paged16_vs_contiguous_max": 1 - result["contiguous_utilization"]
        / result["paged_utilization"]["16"],
        "prefix_cache": prefix["memory_saved"]}
    result["paper"] = PAPER
    result["wall_s"] = time.perf_counter() - t0
    return result


def format_table(result: dict) -> str:
    """The numbers, with the paper's beside them."""
    p = result["paper"]
    lines = [f"trace: {result['trace']['num_requests']} ShareGPT-like requests (mean prompt "
             f"{result['trace']['prompt_mean']:.0f}, output {result['trace']['output_mean']:.0f}"
             f" tokens); KV budget {result['kv_budget_tokens']} tokens (OPT-13B fp16, A100-40GB)",
             "share of KV memory holding real tokens (paper Fig. 2: "
             f"{p['token_share_earlier_systems'][0]:.1%}-{p['token_share_earlier_systems'][1]:.1%}"
             f" earlier systems, {p['token_share_vllm']:.1%} vLLM):"]
    for design, fr in result["fragmentation"].items():
        lines.append(f"  {design:<18} token {fr['token']:.3f}  reserved {fr['reserved']:.3f}  "
                     f"internal {fr['internal']:.3f}  external {fr['external']:.3f}  "
                     f"free {fr['free']:.3f}  max concurrent "
                     f"{result['max_concurrent_requests'][design]}")
    lines.append("copy-on-write saving (Alpaca-like; paper Fig. 15: parallel "
                 f"{p['parallel_sampling_saving_alpaca'][0]:.1%}-"
                 f"{p['parallel_sampling_saving_alpaca'][1]:.1%}, beam "
                 f"{p['beam_search_saving_alpaca'][0]:.1%}-"
                 f"{p['beam_search_saving_alpaca'][1]:.1%}):")
    for k in result["parallel_sampling_saving"]:
        lines.append(f"  n/width {k}: parallel sampling {result['parallel_sampling_saving'][k]:.3f}"
                     f"   beam search {result['beam_search_saving'][k]:.3f}")
    lines.append(f"prefix cache ({SYSTEM_PROMPT_LEN}-token shared prompt): hit rate "
                 f"{result['prefix_hit_rate']:.3f}, memory saved "
                 f"{result['prefix_memory_saved']:.3f}")
    return "\n".join(lines)


#: (sequences N, query heads H, K/V heads H_kv, head_dim d, block size B, longest context)
GPU_CASES = ((7, 12, 4, 64, 16, 1000), (64, 32, 8, 128, 16, 2048), (3, 8, 8, 80, 32, 333))


def compare_kernels(device: torch.device | str, cases=GPU_CASES, dtype=torch.float16,
                    repeats: int = 10) -> dict:
    """Triton paged attention vs the PyTorch gather on ``device``: max error and best times.

    Each case scatters K/V over a pool at random block ids, with ragged context lengths (the
    first sequence at the full length). Used by :func:`run_gpu` on CUDA, and by the tests on
    the CPU under ``TRITON_INTERPRET=1`` with small cases.
    """
    from llminfra.attention.paged_triton import paged_attention_triton
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(SEED)
    out, worst = {"cases": []}, 0.0
    for N, H, H_kv, d, B, ctx in cases:
        per = -(-ctx // B)
        nb = N * per + 5
        q = torch.randn(N, H, d, device=dev, dtype=dtype, generator=gen)
        k = torch.randn(nb, B, H_kv, d, device=dev, dtype=dtype, generator=gen)
        v = torch.randn(nb, B, H_kv, d, device=dev, dtype=dtype, generator=gen)
        bt = torch.randperm(nb, device=dev, generator=gen)[:N * per].view(N, per)
        lens = torch.randint(1, ctx + 1, (N,), device=dev, generator=gen)
        lens[0] = ctx
        ref = paged_attention(q, k, v, bt, lens)
        err = float((paged_attention_triton(q, k, v, bt, lens).float() - ref.float()).abs().max())
        worst = max(worst, err)
        t_ref = best_time_s(lambda: paged_attention(q, k, v, bt, lens), repeats, 1, dev)
        t_tri = best_time_s(lambda: paged_attention_triton(q, k, v, bt, lens), repeats, 1, dev)
        out["cases"].append({"shape_N_H_Hkv_d_B_ctx": [N, H, H_kv, d, B, ctx],
                             "max_abs_error": err, "torch_gather_s": t_ref, "triton_s": t_tri,
                             "speedup": t_ref / t_tri})
    out["max_abs_error"] = worst
    return out


def run_gpu() -> dict:
    """Check the Triton paged-attention kernel against the PyTorch gather on CUDA and time both.

    Raises ``RuntimeError`` when there is no CUDA device (never a silent skip) and
    ``RuntimeError`` when the kernel disagrees with the reference (fp16, atol 1e-2).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("kvcache.run_gpu needs a CUDA device; none is visible to torch")
    out = {"environment": environment(), **compare_kernels("cuda")}
    if not out["max_abs_error"] < 1e-2:
        raise RuntimeError("Triton paged attention differs from the PyTorch gather by "
                           f"{out['max_abs_error']}")
    return out
