"""The computations behind the ledger's verdicts, each a small function of the package.

Every function returns a :class:`~llminfra.ledger.claim.Finding`: the figure, formatted, and
whether it supports the verdict recorded in the claim that calls it. They reuse the course's
own functions (memory model, catalog, communication model, pipeline bubble, KV-cache
simulations), so the ledger and the chapters give one answer to one question.

Taught in appendix A1.
"""

from __future__ import annotations

import torch

from llminfra.calc import memory as mem
from llminfra.calc.step import decode_arithmetic_intensity
from llminfra.calc.params import param_count
from llminfra.ledger.claim import Finding, ratio_verdict, rel_error
from llminfra.specs import get_gpu, get_model, gpu_names
from llminfra.specs.formats import get_format
from llminfra.parallel.pipeline import bubble_fraction, split_layers
from llminfra.calc.cost import api_monthly_cost, selfhost_cost_per_million_tokens


def stated_size(model: str, dtype: str, stated_gb: float, verdict: str) -> Finding:
    """A stated weight size against the computed one: "<computed> GB (<GiB>), text e% off"."""
    b = mem.weight_bytes(model, dtype)
    got = ratio_verdict(stated_gb * 1e9, b)
    return Finding(f"{model} {dtype}: {b / 1e9:.4g} GB = {b / 2**30:.4g} GiB; the text's "
                   f"{stated_gb:g} GB is {rel_error(stated_gb * 1e9, b):+.1%} off", got == verdict)


def rule_of_thumb(bytes_per_param: float, dtype: str) -> Finding:
    """"X billion parameters → k·X GB in dtype": exact when X is the real count (GB = 1e9 B)."""
    n = param_count(get_model("llama-2-7b"))
    b = mem.weight_bytes("llama-2-7b", dtype)
    ok = abs(b - bytes_per_param * n) / b < 1e-9
    return Finding(f"llama-2-7b ({n / 1e9:.4g} B params) in {dtype}: {b / 1e9:.4g} GB = "
                   f"{bytes_per_param:g} × {n / 1e9:.4g}", ok)


def quantized_rule(model: str, dtype: str, bytes_per_param: float) -> Finding:
    """Quantized weights cost more than bits/8 per parameter: group scales and the
    unquantized embeddings come on top. The rule is a lower bound, 'approximately' while the
    excess is 0.5–20 %."""
    n = param_count(get_model(model))
    b = mem.weight_bytes(model, dtype)
    excess = b / (bytes_per_param * n) - 1
    return Finding(f"{model} {dtype} (group 128, fp16 scales, bf16 embeddings): "
                   f"{b / 1e9:.4g} GB vs {bytes_per_param:g} × {n / 1e9:.4g} B = "
                   f"{bytes_per_param * n / 1e9:.4g} GB ({excess:+.1%})", 0.005 < excess <= 0.20)


def gb_vs_gib(model: str = "starcoder") -> Finding:
    """"31 GB expected, 29 GB measured": 31.03 GB is 28.90 GiB — a unit, not a discrepancy."""
    b = mem.weight_bytes(model, "bf16")
    ok = round(b / 1e9) == 31 and round(b / 2**30) == 29
    return Finding(f"{model} bf16: {b / 1e9:.4g} GB = {b / 2**30:.4g} GiB", ok)


def kv_per_sequence(model: str, tokens: int, stated_gb: float, verdict: str) -> Finding:
    """KV cache of one ``tokens``-long sequence in fp16 against a stated size."""
    per_token = mem.kv_bytes_per_token(model, "fp16")
    b = per_token * tokens
    got = ratio_verdict(stated_gb * 1e9, b, exact_rel=0.02)
    return Finding(f"{model}: {per_token:,} B/token × {tokens} = {b / 1e9:.4g} GB "
                   f"({b / 2**30:.4g} GiB)", got == verdict)


def short_prompt_weights_dominate(model: str, tokens: int = 1024) -> Finding:
    """Below ~1k tokens the weights dominate: KV share of weights + KV at batch 1."""
    w, kv = mem.weight_bytes(model, "bf16"), mem.kv_bytes(model, tokens, 1, "bf16")
    share = kv / (w + kv)
    return Finding(f"{model}, {tokens} tokens, batch 1: KV {kv / 1e9:.3g} GB = {share:.2%} of "
                   f"weights + KV", share < 0.05)


def decode_memory_bound(model: str = "llama-2-7b", gpus=("a100-80gb", "h100", "h200")) -> Finding:
    """Decode at batch 1 does ~1 FLOP per byte; ridge points (peak bf16 / bandwidth) are > 100."""
    ai = decode_arithmetic_intensity(model, 1, 2048)
    ridges = {g: get_gpu(g).tflops("bf16") * 1e12 / get_gpu(g).hbm_bytes_per_s for g in gpus}
    text = ", ".join(f"{g} {r:.0f}" for g, r in ridges.items())
    return Finding(f"{model} decode, batch 1: {ai:.3g} FLOP/B; ridge points (dense bf16): {text}",
                   ai < 2 and min(ridges.values()) > 100)


def batching_raises_intensity(model: str = "llama-2-7b") -> Finding:
    """Reading the weights once for B sequences: intensity grows with the batch."""
    a1, a64 = (decode_arithmetic_intensity(model, b, 512) for b in (1, 64))
    return Finding(f"{model} decode at 512 tokens: {a1:.3g} FLOP/B at batch 1, {a64:.3g} at "
                   f"batch 64", a64 > 10 * a1)


def kv_linear_growth(model: str = "llama-2-13b") -> Finding:
    """KV bytes double when the context or the batch doubles: linear, not exponential."""
    k = [mem.kv_bytes(model, c, b, "bf16") for c, b in ((1024, 1), (2048, 1), (4096, 1), (1024, 2))]
    ok = k[1] == 2 * k[0] and k[2] == 4 * k[0] and k[3] == 2 * k[0]
    return Finding(f"{model} KV at 1k/2k/4k tokens: {k[0] / 1e9:.3g} / {k[1] / 1e9:.3g} / "
                   f"{k[2] / 1e9:.3g} GB; batch 2 at 1k: {k[3] / 1e9:.3g} GB", ok)


def quantization_leaves_kv(model: str = "llama-2-70b", context: int = 4096, batch: int = 16) -> Finding:
    """int4 weights, KV still in bf16: the KV part is unchanged by weight quantization."""
    a = mem.inference_memory(model, "bf16", "bf16", context, batch)
    b = mem.inference_memory(model, "int4", "bf16", context, batch)
    share_a, share_b = a.kv_bytes / a.total_bytes, b.kv_bytes / b.total_bytes
    return Finding(f"{model}, {batch} × {context} tokens: weights {a.weight_bytes / 1e9:.4g} → "
                   f"{b.weight_bytes / 1e9:.4g} GB, KV {a.kv_bytes / 1e9:.4g} → "
                   f"{b.kv_bytes / 1e9:.4g} GB ({share_a:.0%} → {share_b:.0%} of the total)",
                   a.kv_bytes == b.kv_bytes and share_b > 2 * share_a)


def training_10b(stated_low: float = 80e9, stated_high: float = 100e9) -> Finding:
    """A 10 B model with mixed-precision AdamW: 16 B/param = 160 GB before activations."""
    per_param = sum(mem.TRAINING_RECIPES["adamw-mixed"])
    need = per_param * 10e9
    sgd = sum(mem.TRAINING_RECIPES["sgd-mixed"]) * 10e9
    return Finding(f"10 B params × {per_param} B (AdamW, mixed) = {need / 1e9:.4g} GB before "
                   f"activations; momentum-free SGD: {sgd / 1e9:.4g} GB",
                   need > stated_high and stated_low <= sgd <= stated_high)


def training_175b() -> Finding:
    """175 B parameters with mixed-precision AdamW: 2.8 TB of states, ~35 GPUs of 80 GiB."""
    per_param = sum(mem.TRAINING_RECIPES["adamw-mixed"])
    need = per_param * 175e9
    gpus = need / get_gpu("a100-80gb").memory_bytes
    return Finding(f"175 B × {per_param} B = {need / 1e12:.3g} TB before activations "
                   f"(≥ {gpus:.0f} A100-80GB just to hold it)", need > 1e12)


def format_bytes() -> Finding:
    """fp32 4 B, fp16 and bf16 2 B, fp8 1 B (the format catalog)."""
    b = {n: get_format(n).bits / 8 for n in ("fp32", "fp16", "bf16", "fp8-e4m3")}
    return Finding(", ".join(f"{k} {v:g} B" for k, v in b.items()),
                   b == {"fp32": 4, "fp16": 2, "bf16": 2, "fp8-e4m3": 1})


def bf16_range() -> Finding:
    """bf16 is fp16's size with fp32's exponent: max 3.39e38 vs 65,504 (checked by torch)."""
    f16, b16 = torch.finfo(torch.float16).max, torch.finfo(torch.bfloat16).max
    return Finding(f"max fp16 {f16:.5g}, max bf16 {b16:.3g}", b16 > 1e38 > f16)


def gpu_field(gpu: str, attr: str, stated, verdict: str, unit: str = "") -> Finding:
    """A catalog field against a stated value (numbers within 0.5 %, text as substring)."""
    g = get_gpu(gpu)
    value = getattr(g, attr)
    if isinstance(stated, (int, float)):
        got = ratio_verdict(stated, float(value))
    else:
        got = "holds" if str(stated).lower() in str(value).lower() else "wrong"
    return Finding(f"{gpu}.{attr} = {value}{unit}", got == verdict)


def pipeline_bubble() -> Finding:
    """GPipe's idle share (p − 1) / (m + p − 1) at 4 stages: 1 vs 16 micro-batches."""
    b1, b16 = bubble_fraction(4, 1), bubble_fraction(4, 16)
    return Finding(f"4 stages: idle share {b1:.0%} with one batch, {b16:.1%} with 16 micro-batches",
                   b1 == 0.75 and b16 < 0.2)


def training_vs_inference(model: str = "llama-2-7b") -> Finding:
    """Training state (mixed AdamW, no activations) vs inference weights (bf16): 16 vs 2 B/param."""
    train = mem.training_memory(model, 1, 2048)
    infer = mem.weight_bytes(model, "bf16")
    states = train["total"] - train["activations"]
    return Finding(f"{model}: weights + gradients + master + Adam moments {states / 1e9:.4g} GB "
                   f"vs {infer / 1e9:.4g} GB of bf16 weights ({states / infer:.3g}×)",
                   states >= 8 * infer)


def activations_small(model: str = "opt-13b", batch: int = 8, context: int = 2048) -> Finding:
    """Inference activations (one step's working set) vs weights and KV."""
    m = mem.inference_memory(model, "fp16", "fp16", context, batch)
    return Finding(f"{model}, {batch} × {context}: weights {m.weight_bytes / 1e9:.4g} GB, KV "
                   f"{m.kv_bytes / 1e9:.4g} GB, activations {m.activation_bytes / 1e9:.3g} GB",
                   m.activation_bytes < 0.15 * m.weight_bytes and m.activation_bytes < m.kv_bytes)


def weights_only_oom(model: str = "llama-2-13b", gpu: str = "a100-80gb", batch: int = 32,
                     context: int = 4096) -> Finding:
    """Counting only the weights: they fit, but weights + KV for the real load do not."""
    w = mem.weight_bytes(model, "bf16")
    f = mem.fits(model, gpu, "bf16", None, context, batch)
    return Finding(f"{model} on {gpu}: weights {w / 1e9:.4g} GB of {f['usable_bytes'] / 1e9:.4g} GB "
                   f"usable; with {batch} × {context} tokens the total is "
                   f"{f['total_bytes'] / 1e9:.4g} GB", w < f["usable_bytes"] and not f["fits"])


def too_big_for_one_gpu(model: str = "llama-2-70b") -> Finding:
    """Weights alone against the largest 40 GB / 80 GB cards' capacity."""
    w = mem.weight_bytes(model, "fp16")
    cap = max(get_gpu(g).memory_bytes for g in ("a100-40gb", "a100-80gb", "h100"))
    return Finding(f"{model} fp16 weights {w / 1e9:.4g} GB vs {cap / 2**30:.4g} GiB on one card",
                   w > cap)


def long_context_capacity(model: str = "llama-3-70b", context: int = 8192) -> Finding:
    """How many full-context sequences fit beside bf16 weights on 2 × H100 vs 2 × H200."""
    h100 = mem.max_batch(model, "h100", context, "bf16", num_gpus=2)
    h200 = mem.max_batch(model, "h200", context, "bf16", num_gpus=2)
    return Finding(f"{model} bf16 on 2 GPUs, {context:,}-token sequences: H100 {h100}, H200 {h200}",
                   h200 > 2 * max(h100, 1) or (h100 == 0 and h200 > 0))


def pipeline_memory(model: str = "llama-2-70b", stages: int = 4) -> Finding:
    """Pipeline stages hold a share of the layers: weights per stage ≈ total / p."""
    spec = get_model(model)
    parts = split_layers(spec.num_layers, stages)
    biggest = max(len(r) for r in parts) / spec.num_layers
    return Finding(f"{model}: {spec.num_layers} layers over {stages} stages → at most "
                   f"{max(len(r) for r in parts)} layers ({biggest:.0%}) per GPU", biggest <= 1 / stages + 0.02)


def selfhost_vs_api(api_usd_per_m: float = 1.0, gpu_usd_per_h: float = 2.0,
                    tokens_per_s: float = 1000.0) -> Finding:
    """Example prices (inputs, not current prices): the utilisation at which a rented GPU's
    cost per token equals an API's."""
    full = selfhost_cost_per_million_tokens(gpu_usd_per_h, tokens_per_s)
    u = full / api_usd_per_m
    return Finding(f"example: GPU ${gpu_usd_per_h:g}/h at {tokens_per_s:g} tok/s = ${full:.3g} per M "
                   f"tokens when busy; it matches a ${api_usd_per_m:g}/M API at {u:.0%} utilisation, "
                   f"costs {1 / 0.1 * full / api_usd_per_m:.3g}× the API at 10 %", 0 < u < 1)


def api_example() -> Finding:
    """1,000 requests/day × (2,000 in, 500 out) × 30 days, by chapter 09's cost model."""
    day = api_monthly_cost(1000, 2000, 500, 1.0, 1.0, days=1)
    month = api_monthly_cost(1000, 2000, 500, 1.0, 1.0, days=30)
    got = (day.monthly_input_tokens, day.monthly_output_tokens, month.monthly_input_tokens,
           month.monthly_output_tokens)
    return Finding(f"per day {got[0]:,.0f} in / {got[1]:,.0f} out; per 30 days {got[2]:,.0f} / "
                   f"{got[3]:,.0f} tokens", got == (2e6, 5e5, 6e7, 1.5e7))


def per_token_cost() -> Finding:
    """Cost per token = hourly price / tokens per hour, divided by the utilisation
    (chapter 09's :func:`~llminfra.calc.cost.selfhost_cost_per_million_tokens`)."""
    per_m = selfhost_cost_per_million_tokens
    full, double, quarter = per_m(2.0, 1000), per_m(2.0, 2000), per_m(2.0, 1000, 0.25)
    return Finding(f"example $2/h at 1,000 tok/s: ${full:.3g} per M tokens; at 2,000 tok/s "
                   f"${double:.3g}; busy 25 % of the hour ${quarter:.3g}",
                   abs(double - full / 2) < 1e-12 and abs(quarter - 4 * full) < 1e-9)


def largest_gpu() -> Finding:
    """The catalog's largest memory against the 80 GB "largest GPU" of 2023."""
    big = max(gpu_names(), key=lambda n: get_gpu(n).memory_bytes)
    g = get_gpu(big)
    return Finding(f"largest in the catalog: {big} with {g.memory_bytes / 2**30:.4g} GiB "
                   f"({g.launch}); h200 {get_gpu('h200').memory_bytes / 2**30:.4g} GiB",
                   g.memory_bytes > 80 * 2**30)
