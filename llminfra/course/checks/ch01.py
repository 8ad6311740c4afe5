"""Checkers for chapter 01 (training vs inference memory): ``from llminfra.course.checks import ch01``.

Each checker builds named cases from one seed. The cases that reach every branch of the
reference are always there, in the same places: tied and untied embeddings with grouped-query and
multi-head attention (cases 1-4, each with at least two layers, so a per-layer term counted once
shows), a layer with and one without FlashAttention (batch and heads above 1), and fp32, bf16 and
fp16 for the decode intensity; the rest is drawn from the seed. The learner's function is compared
with the package's own (:mod:`llminfra.calc.params`, :mod:`llminfra.calc.memory`) and, when they
disagree, the message names the case, the seed and the term that is most likely missing or wrong.
"""

from __future__ import annotations

import numbers
import random
from dataclasses import dataclass

from llminfra.calc.memory import activation_bytes_training, training_memory
from llminfra.calc.step import decode_arithmetic_intensity
from llminfra.calc.params import param_count
from llminfra.course.checking import Case, checker, first_matching, run_checks, seeded
from llminfra.specs.formats import dtype_bytes
from llminfra.specs.models import ModelSpec


@dataclass(frozen=True, repr=False)
class _CompactSpec(ModelSpec):
    """A ModelSpec that prints only the fields the exercises use (checker messages stay short)."""

    def __repr__(self) -> str:
        return (f"ModelSpec(L={self.num_layers}, h={self.hidden_size}, H={self.num_heads}, "
                f"H_kv={self.num_kv_heads}, d={self.head_dim}, I={self.intermediate_size}, "
                f"V={self.vocab_size}, tied_embeddings={self.tied_embeddings})")


def random_llama_spec(rng: random.Random, tied: bool | None = None,
                      gqa: bool | None = None, min_layers: int = 1) -> ModelSpec:
    """A valid random Llama-style ModelSpec (RMSNorm, rotary, SwiGLU, no biases) with
    grouped-query attention: H_kv divides H, head_dim even, sizes small and awkward.
    ``gqa=True``: 1 < H_kv < H; ``gqa=False``: H_kv = H (multi-head); None: either.
    ``min_layers``: the fewest layers (1 … 12 are drawn)."""
    kv = rng.choice([2, 3, 4] if gqa else [1, 2, 3, 4])
    group = {True: rng.choice([2, 3, 4]), False: 1, None: rng.choice([1, 2, 3, 4])}[gqa]
    heads = kv * group
    head_dim = 2 * rng.randint(2, 40)
    return _CompactSpec(
        name="random-llama", display_name="random llama-style model", family="llama",
        hidden_size=heads * head_dim, num_layers=rng.randint(min_layers, 12), num_heads=heads,
        num_kv_heads=kv, intermediate_size=rng.randint(5, 700), vocab_size=rng.randint(50, 5000),
        max_positions=4096, mlp="gated", positions="rotary", norm="rmsnorm",
        tied_embeddings=rng.random() < 0.3 if tied is None else tied)


def spec_name(s: ModelSpec) -> str:
    """``L=3, h=96, H=6 over H_kv=2 (GQA), I=200, V=700, tied`` — a case name."""
    kind = "MHA" if s.num_kv_heads == s.num_heads else ("MQA" if s.num_kv_heads == 1 else "GQA")
    return (f"L={s.num_layers}, h={s.hidden_size}, H={s.num_heads} over H_kv={s.num_kv_heads} "
            f"({kind}), I={s.intermediate_size}, V={s.vocab_size}, "
            f"{'tied' if s.tied_embeddings else 'untied'} embeddings")


def _spec_cases(rng: random.Random, n: int) -> list[Case]:
    """Always: untied GQA, tied GQA, untied MHA, tied MHA, each of 2 layers or more (a
    per-layer term counted once is then wrong); then random ones (1 layer among them)."""
    specs = [random_llama_spec(rng, tied=t, gqa=g, min_layers=2)
             for g in (True, False) for t in (False, True)]
    specs += [random_llama_spec(rng) for _ in range(n - 4)]
    return [Case(spec_name(s), (s,)) for s in specs]


def _param_hint(args, kwargs, expected, got) -> str:
    s: ModelSpec = args[0]
    if not isinstance(got, numbers.Real):
        return f"return a number of parameters, got {type(got).__name__}"
    h, L, V, I = s.hidden_size, s.num_layers, s.vocab_size, s.intermediate_size
    kv = s.num_kv_heads * s.head_dim
    diff = got - expected
    known = {
        V * h: ("off by exactly the lm_head (V·h): the embeddings are tied here, so the output "
                "layer reuses the embedding matrix" if s.tied_embeddings else
                "you added one V·h matrix too many"),
        -V * h: ("short by exactly the lm_head (V·h): this model does NOT tie its embeddings, "
                 "count the output matrix too" if not s.tied_embeddings else
                 "short by V·h: the embedding matrix itself must be counted once"),
        2 * L * h * (h - kv): "K and V projections are h × (H_kv·head_dim), not h × h: this is "
                              "grouped-query attention",
        -(2 * L * h + h): "missing the RMSNorm weights: 2·h per layer plus the final norm's h",
        -2 * L * h: "missing the two RMSNorm weights per layer (2·h each layer)",
        -L * h: "a block has TWO RMSNorm weight vectors (before attention and before the MLP), "
                "h each",
        -h: "missing the final RMSNorm (h weights)",
        -L * h * I: "the SwiGLU MLP has THREE matrices (gate, up, down), not two",
    }
    if diff in known:
        return known[diff]
    return f"off by {diff:+,}; L={L}, h={h}, H={s.num_heads}, H_kv={s.num_kv_heads}, I={I}, V={V}"


@checker
def check_param_count(fn, seed: int | None = None) -> int:
    """``fn(spec) -> int``: every parameter of a Llama-style GQA model (no biases), checked
    against :func:`llminfra.calc.params.param_count` on 8 specs (tied / untied × GQA / MHA
    always, then random)."""
    seed, rng = seeded(seed)
    return run_checks("count_params", fn, param_count, _spec_cases(rng, 8), hint=_param_hint,
                      seed=seed, replay="ch01.check_param_count")


def _training_hint(args, kwargs, expected, got) -> str:
    spec, batch, seq_len = args
    P = param_count(spec)
    parts = training_memory(spec, batch, seq_len)
    L, acts = spec.num_layers, parts["activations"]
    attention = L * 5 * spec.num_heads * seq_len * seq_len * batch
    for scale, unit in ((1e9, "GB"), (2**30, "GiB")):
        if abs(got * scale - expected) < 0.01 * expected:
            return f"that looks like {unit}: return bytes"
    known = {acts: "you left out the activations (Korthikanti: 34·s·b·h per layer)",
             -attention: "with FlashAttention no attention matrix is stored: leave out the "
                         "5·a·s²·b term",
             4 * P: "you left out the fp32 master weights (4 bytes per parameter)",
             8 * P: "you left out AdamW's two fp32 moments (8 bytes per parameter)",
             2 * P: "you left out the 16-bit gradients (2 bytes per parameter)",
             12 * P: "you left out the optimizer state: fp32 master weights + two moments "
                     "= 12 bytes per parameter"}
    if L > 1:
        known[acts * (L - 1) // L] = ("34·s·b·h is per layer: multiply the activations by the "
                                      "number of layers")
    for missing, why in known.items():
        if abs(expected - got - missing) <= 1:
            return why
    return f"per parameter you have {(got - parts['activations']) / P:.4g} bytes; expected 16"


@checker
def check_training_memory(fn, seed: int | None = None) -> int:
    """``fn(spec, batch, seq_len) -> bytes``: mixed-precision AdamW (16 B/param) plus
    Korthikanti's activations with FlashAttention, against
    :func:`llminfra.calc.memory.training_memory` (``total``)."""
    seed, rng = seeded(seed)
    cases = []
    for spec_case in _spec_cases(rng, 8):
        b, t = rng.randint(2, 8), rng.randint(2, 4096)
        cases.append(Case(f"{spec_case.name}; batch {b} × {t} tokens",
                          spec_case.args + (b, t)))
    return run_checks("training_bytes", fn, lambda s, b, t: training_memory(s, b, t)["total"],
                      cases, hint=_training_hint, seed=seed, replay="ch01.check_training_memory")


def _activation_reference(seq_len, batch, hidden, heads, flash):
    spec = ModelSpec(name="one-layer", display_name="one GPT layer", family="gpt2",
                     hidden_size=hidden, num_layers=1, num_heads=heads, num_kv_heads=heads,
                     intermediate_size=4 * hidden, vocab_size=2, max_positions=None, mlp="plain",
                     positions="learned", norm="layernorm", tied_embeddings=True)
    return activation_bytes_training(spec, batch, seq_len, flash=flash)


def _activation_variants(s, b, h, a, flash) -> dict[str, int]:
    """Wrong answers a learner plausibly writes for one layer, each with what to say about it."""
    base, attention = 34 * s * b * h, 5 * a * s * s * b
    if flash:
        wrong = {"with FlashAttention (flash=True) the 5·a·s²·b attention-matrix term is not "
                 "stored": base + attention}
    else:
        wrong = {"without FlashAttention (flash=False) add the attention matrices: 5·a·s²·b "
                 "bytes": base,
                 "the attention term counts heads a, not the hidden size h: 5·a·s²·b":
                     base + 5 * h * s * s * b,
                 "the attention matrices grow with the batch: 5·a·s²·b": base + 5 * a * s * s,
                 "each head's attention matrix is s × s: 5·a·s²·b, not 5·a·s·b":
                     base + 5 * a * s * b}
    wrong["the stored activations grow with the batch: 34·s·b·h"] = \
        34 * s * h + (0 if flash else attention)
    return wrong


def _activation_hint(args, kwargs, expected, got) -> str:
    s, b, h, a, flash = args
    known = first_matching(got, _activation_variants(*args), expected)
    if known:
        return known
    if isinstance(got, (int, float)) and got and abs(expected / got - round(expected / got)) < 1e-9 \
            and round(expected / got) in (2, 4):
        return f"off by a factor {expected / got:.4g}: the formula is already in bytes (16-bit)"
    return f"per token per hidden unit you have {got / (s * b * h):.4g} bytes; expected 34" + (
        "" if flash else " + 5·a·s/h")


@checker
def check_activation_bytes(fn, seed: int | None = None) -> int:
    """``fn(seq_len, batch, hidden, heads, flash) -> bytes`` of one layer (Korthikanti et al.,
    2022, arXiv:2205.05198, eq. 1), against :func:`activation_bytes_training` on one layer;
    half the cases with FlashAttention (the odd ones), half without. Cases 1 (with) and 2
    (without) have a batch above 1 and a hidden size above the head count, so a term without
    the batch, or with h for a, fails every run; their batch is neither 2 nor 4, so an answer
    off by a factor 2 or 4 is not mistaken for one without the batch (34·s·h). A right float
    (``s·b·h·(34 + 5·a·s/h)``, the paper's form) passes: a count computed through floats is
    judged within float64 rounding (:func:`llminfra.course.compare.compare`)."""
    seed, rng = seeded(seed)
    cases = []
    for i in range(8):
        low = 2 if i < 2 else 1
        heads = rng.randint(low, 16)
        b = rng.choice([3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]) if i < 2 else \
            rng.randint(1, 16)
        s, h = rng.randint(2, 4096), heads * rng.randint(low, 200)
        flash = i % 2 == 0
        cases.append(Case(f"s={s}, b={b}, h={h}, a={heads}, flash={flash}", (s, b, h, heads, flash)))
    return run_checks("activation_bytes_per_layer", fn, _activation_reference, cases,
                      hint=_activation_hint, seed=seed, replay="ch01.check_activation_bytes")


INTENSITY_DTYPES = ("fp32", "bf16", "fp16")  # 16- and 32-bit: no quantization scales


def _intensity_variants(spec, batch, context, dtype) -> dict[str, float]:
    """Wrong answers a learner plausibly writes, each with what to say about it."""
    P, b = param_count(spec), dtype_bytes(dtype)
    L, H, Hkv, d = spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim
    flops = batch * (2 * P + 4 * L * H * d * context)
    kv = 2 * L * Hkv * d * context * batch
    return {
        f"you ignored dtype: with {dtype} each weight and each cached K/V element is {b:g} bytes, "
        "not 2 (use dtype_bytes(dtype))": flops / (2 * P + 2 * kv),
        f"the weights use dtype_bytes(dtype) but the KV cache does not: it is stored in {dtype} "
        f"too ({b:g} bytes per element)": flops / (b * P + 2 * kv),
        "a multiply-add is 2 FLOPs per weight: FLOPs = B·(2·P + …)":
            batch * (P + 4 * L * H * d * context) / (b * P + b * kv),
        "the weights are read once for the whole batch, not once per sequence":
            flops / (batch * b * P + b * kv),
        "every sequence does its own FLOPs: multiply them by the batch":
            (2 * P + 4 * L * H * d * context) / (b * P + b * kv),
        "the cache holds num_kv_heads heads, not num_heads (grouped-query attention)":
            flops / (b * P + b * 2 * L * H * d * context * batch),
        "the cache holds K and V: 2·L·H_kv·d elements per token": flops / (b * P + b * kv / 2),
        "the attention FLOPs use every query head: 4·L·H·d per cached position (H, not H_kv)":
            batch * (2 * P + 4 * L * Hkv * d * context) / (b * P + b * kv),
        "you returned bytes / FLOPs; intensity is FLOPs / bytes": (b * P + b * kv) / flops,
    }


def _intensity_hint(args, kwargs, expected, got) -> str:
    return first_matching(got, _intensity_variants(*args), expected) or \
        "FLOPs = B·(2·P + 4·L·H·d·context); bytes = P·bytes(dtype) + B·context·2·L·H_kv·d·bytes(dtype)"


@checker
def check_decode_intensity(fn, seed: int | None = None) -> int:
    """``fn(spec, batch, context, dtype) -> FLOP/byte`` of one decode step, against
    :func:`llminfra.calc.step.decode_arithmetic_intensity`; fp32 (case 1), bf16 and fp16 each
    in every run, with GQA and MHA specs."""
    seed, rng = seeded(seed)
    cases = []
    for k, spec_case in enumerate(_spec_cases(rng, 8)):
        batch, context = rng.randint(2, 64), rng.randint(2, 4096)
        dtype = INTENSITY_DTYPES[k % len(INTENSITY_DTYPES)]
        cases.append(Case(f"{spec_case.name}; batch {batch}, context {context}, {dtype}",
                          spec_case.args + (batch, context, dtype)))
    return run_checks("decode_intensity", fn, decode_arithmetic_intensity, cases, rel=1e-9,
                      hint=_intensity_hint, seed=seed, replay="ch01.check_decode_intensity")


__all__ = ["random_llama_spec", "check_param_count", "check_training_memory",
           "check_activation_bytes", "check_decode_intensity"]
