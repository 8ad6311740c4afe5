"""The computations only text 000's claims (:mod:`llminfra.ledger.claims_000`) call: Megatron's
scaling efficiency and parameter count, OPT-13B's memory split on an A100-40GB, chapter 04's
paged vs contiguous KV and copy-on-write savings, FlashAttention's exactness and HBM traffic,
and the share of a tensor-parallel step spent communicating. The computations several texts
share are :mod:`llminfra.ledger.checks`. Each returns a
:class:`~llminfra.ledger.claim.Finding`. Taught in appendix A1.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from llminfra.attention import flash_attention, naive_attention
from llminfra.attention.io_accounting import theorem2_flash_elements, theorem2_naive_elements
from llminfra.calc.communication import communication_share
from llminfra.calc.memory import kv_budget
from llminfra.calc.params import param_count
from llminfra.kvcache.sharing import beam_search_blocks, parallel_sampling_blocks, sharing_saving
from llminfra.kvcache.simulate import simulate_contiguous, simulate_paged
from llminfra.kvcache.trace import request_trace
from llminfra.ledger.claim import Finding, ratio_verdict


def megatron_efficiency() -> Finding:
    """15.1 PFLOP/s on 512 GPUs vs 39 TFLOP/s on one (the paper's baseline): 15.1e15 / (512 · 39e12)."""
    eff = 15.1e15 / (512 * 39e12)
    return Finding(f"15.1e15 / (512 × 39e12) = {eff:.1%}", abs(eff - 0.76) < 0.01)


def megatron_params() -> Finding:
    n = param_count("megatron-8.3b")
    return Finding(f"megatron-8.3b preset: {n / 1e9:.4g} B parameters", abs(n / 8.3e9 - 1) < 0.01)


def opt13b_split() -> Finding:
    """OPT-13B fp16 weights on an A100-40GB: their share of the card, and what the course's one
    KV-budget function (:func:`llminfra.calc.memory.kv_budget`, chapters 02 and 04) leaves for
    the KV cache with vLLM's 10 % runtime reserve."""
    b = kv_budget("opt-13b", "a100-40gb", "fp16", context=2048)
    share = b.weight_bytes / b.gpu_memory_bytes
    kv = b.kv_budget_bytes / b.gpu_memory_bytes
    return Finding(f"weights {b.weight_bytes / 1e9:.4g} GB = {b.weight_bytes / 40e9:.1%} of 40e9 B, "
                   f"{share:.1%} of the card's {b.gpu_memory_bytes / 2**30:.4g} GiB; with a 10 % "
                   f"runtime reserve the KV cache gets {kv:.1%}",
                   ratio_verdict(0.65, share) == "approximately" and 0.25 <= kv <= 0.31)


@lru_cache(maxsize=1)
def paged_vs_contiguous() -> Finding:
    """Share of KV memory that holds tokens: contiguous at max length vs paged (block 16), on
    chapter 04's one pool and trace (its §5: 150 ShareGPT-like requests, seed 2023, in the KV
    budget of OPT-13B in fp16 on an A100-40GB), so the two print the same figures."""
    trace = request_trace(150, torch.Generator().manual_seed(2023), "sharegpt")
    pool = kv_budget("opt-13b", "a100-40gb", "fp16", context=2048).kv_budget_tokens
    cont = simulate_contiguous(trace, pool, "max", 2048)["fractions"]["token"]
    paged = simulate_paged(trace, pool, 16)["fractions"]["token"]
    return Finding(f"chapter 04's pool (OPT-13B fp16 on an A100-40GB: {pool:,} tokens) and 150 "
                   f"ShareGPT-like requests: contiguous (reserve 2,048) {cont:.1%} holds tokens, "
                   f"paged (block 16) {paged:.1%}",
                   0.15 <= cont <= 0.40 and paged >= 0.96)


def sharing_savings() -> Finding:
    """Copy-on-write savings on an Alpaca-like trace: parallel sampling (n = 4) vs beam search
    (width 4), the vLLM paper's measure (chapter 04's bench runs the full version)."""
    g = torch.Generator().manual_seed(0)
    trace = request_trace(40, g, "alpaca")
    par = sharing_saving([parallel_sampling_blocks(r.prompt_len, [x.output_len for x in
                                                                  request_trace(4, g, "alpaca")])
                          for r in trace])
    beam = sharing_saving([beam_search_blocks(r.prompt_len, r.output_len, 4, g) for r in trace])
    return Finding(f"40 Alpaca-like requests, block 16: parallel sampling (n = 4) saves {par:.1%}, "
                   f"beam search (width 4) {beam:.1%}", par < 0.15 and beam > 0.35)


def flash_exact() -> Finding:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 32, generator=g) for _ in range(3))
    err = (flash_attention(q, k, v, causal=True) - naive_attention(q, k, v, causal=True)).abs().max()
    # the bound, not the value: the last bits of fp32 sums differ between CPUs' kernels
    # (9.5e-07 with AVX-512, 7.7e-07 with vectorization forced off)
    return Finding(f"tiled vs naive attention, N = 200, d = 32, causal: max |Δ| "
                   f"{'<' if float(err) < 1e-5 else '>='} 1e-5 (fp32 rounding)", float(err) < 1e-5)


def flash_io() -> Finding:
    """HBM traffic (elements) of naive vs tiled attention, Theorem 2 of FlashAttention."""
    N, d, M = 4096, 64, 100_000
    naive, flash = theorem2_naive_elements(N, d), theorem2_flash_elements(N, d, M)
    return Finding(f"N = {N:,}, d = {d}, SRAM {M:,} elements: naive {round(naive):,}, tiled "
                   f"{round(flash):,} elements read/written ({naive / flash:.3g}× fewer)",
                   naive > 5 * flash)


def tp_link() -> Finding:
    pcie = communication_share("llama-2-70b", "a100-80gb", 4, "pcie-gen4", "prefill")["share"]
    nvl = communication_share("llama-2-70b", "a100-80gb", 4, "nvlink-a100", "prefill")["share"]
    return Finding(f"Llama-2-70B, 4-way TP prefill (2,048 tokens): communication {pcie:.1%} of "
                   f"the step over PCIe Gen4, {nvl:.1%} over NVLink", pcie > 3 * nvl)
