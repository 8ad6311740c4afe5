"""Checkers for chapter 01 (training vs inference memory): ``from llminfra.course.checks import ch01``.

Each checker draws fresh random cases, compares the learner's function with the package's own
(:mod:`llminfra.calc.params`, :mod:`llminfra.calc.memory`) and, when they disagree, names the
input and says which term is most likely missing or wrong.
"""

from __future__ import annotations

import numbers
import random
from dataclasses import dataclass

from llminfra.calc.memory import (activation_bytes_training,
                                  decode_arithmetic_intensity, training_memory)
from llminfra.calc.params import param_count
from llminfra.course.checking import fresh_rng, run_checks
from llminfra.specs.models import ModelSpec


@dataclass(frozen=True, repr=False)
class _CompactSpec(ModelSpec):
    """A ModelSpec that prints only the fields the exercises use (checker messages stay short)."""

    def __repr__(self) -> str:
        return (f"ModelSpec(L={self.num_layers}, h={self.hidden_size}, H={self.num_heads}, "
                f"H_kv={self.num_kv_heads}, d={self.head_dim}, I={self.intermediate_size}, "
                f"V={self.vocab_size}, tied_embeddings={self.tied_embeddings})")


def random_llama_spec(rng: random.Random, tied: bool | None = None) -> ModelSpec:
    """A valid random Llama-style ModelSpec (RMSNorm, rotary, SwiGLU, no biases) with
    grouped-query attention: H_kv divides H, head_dim even, sizes small and awkward."""
    kv = rng.choice([1, 2, 3, 4])
    heads = kv * rng.choice([1, 2, 3, 4])
    head_dim = 2 * rng.randint(2, 40)
    return _CompactSpec(
        name="random-llama", display_name="random llama-style model", family="llama",
        hidden_size=heads * head_dim, num_layers=rng.randint(1, 12), num_heads=heads,
        num_kv_heads=kv, intermediate_size=rng.randint(5, 700), vocab_size=rng.randint(50, 5000),
        max_positions=4096, mlp="gated", positions="rotary", norm="rmsnorm",
        tied_embeddings=rng.random() < 0.3 if tied is None else tied)


def _spec_cases(rng: random.Random, n: int) -> list[tuple[tuple, dict]]:
    specs = [random_llama_spec(rng, tied=False), random_llama_spec(rng, tied=True)]
    specs += [random_llama_spec(rng) for _ in range(n - 2)]
    return [((s,), {}) for s in specs]


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
        -h: "missing the final RMSNorm (h weights)",
        -L * h * I: "the SwiGLU MLP has THREE matrices (gate, up, down), not two",
    }
    if diff in known:
        return known[diff]
    return f"off by {diff:+,}; L={L}, h={h}, H={s.num_heads}, H_kv={s.num_kv_heads}, I={I}, V={V}"


def check_param_count(fn) -> int:
    """``fn(spec) -> int``: every parameter of a Llama-style GQA model (no biases), checked
    against :func:`llminfra.calc.params.param_count` on 8 random specs."""
    rng = fresh_rng()
    return run_checks("count_params", fn, param_count, _spec_cases(rng, 8), hint=_param_hint)


def _training_hint(args, kwargs, expected, got) -> str:
    spec, batch, seq_len = args
    P = param_count(spec)
    parts = training_memory(spec, batch, seq_len)
    if not isinstance(got, (int, float)):
        return f"return a number of bytes, got {type(got).__name__}"
    for scale, unit in ((1e9, "GB"), (2**30, "GiB")):
        if abs(got * scale - expected) < 0.01 * expected:
            return f"that looks like {unit}: return bytes"
    known = {parts["activations"]: "you left out the activations (Korthikanti: 34·s·b·h per layer)",
             4 * P: "you left out the fp32 master weights (4 bytes per parameter)",
             8 * P: "you left out AdamW's two fp32 moments (8 bytes per parameter)",
             2 * P: "you left out the 16-bit gradients (2 bytes per parameter)",
             12 * P: "you left out the optimizer state: fp32 master weights + two moments "
                     "= 12 bytes per parameter"}
    for missing, why in known.items():
        if abs(expected - got - missing) <= 1:
            return why
    return f"per parameter you have {(got - parts['activations']) / P:.4g} bytes; expected 16"


def check_training_memory(fn) -> int:
    """``fn(spec, batch, seq_len) -> bytes``: mixed-precision AdamW (16 B/param) plus
    Korthikanti's activations with FlashAttention, against
    :func:`llminfra.calc.memory.training_memory` (``total``)."""
    rng = fresh_rng()
    cases = [((random_llama_spec(rng), rng.randint(1, 8), rng.randint(1, 4096)), {})
             for _ in range(8)]
    return run_checks("training_bytes", fn, lambda s, b, t: training_memory(s, b, t)["total"],
                      cases, hint=_training_hint)


def _activation_reference(seq_len, batch, hidden, heads, flash):
    spec = ModelSpec(name="one-layer", display_name="one GPT layer", family="gpt2",
                     hidden_size=hidden, num_layers=1, num_heads=heads, num_kv_heads=heads,
                     intermediate_size=4 * hidden, vocab_size=2, max_positions=None, mlp="plain",
                     positions="learned", norm="layernorm", tied_embeddings=True)
    return activation_bytes_training(spec, batch, seq_len, flash=flash)


def _activation_hint(args, kwargs, expected, got) -> str:
    s, b, h, a, flash = args
    if not isinstance(got, numbers.Real):
        return f"return a number of bytes, got {type(got).__name__}"
    if flash and got - expected == 5 * a * s * s * b:
        return "with FlashAttention the 5·a·s²·b attention-matrix term is not stored"
    if not flash and expected - got == 5 * a * s * s * b:
        return "without FlashAttention add the attention matrices: 5·a·s²·b bytes"
    if isinstance(got, (int, float)) and got and abs(expected / got - round(expected / got)) < 1e-9 \
            and round(expected / got) in (2, 4):
        return f"off by a factor {expected / got:.4g}: the formula is already in bytes (16-bit)"
    return f"per token per hidden unit you have {got / (s * b * h):.4g} bytes; expected 34" + (
        "" if flash else " + 5·a·s/h")


def check_activation_bytes(fn) -> int:
    """``fn(seq_len, batch, hidden, heads, flash) -> bytes`` of one layer (Korthikanti et al.,
    2022, arXiv:2205.05198, eq. 1), against :func:`activation_bytes_training` on one layer."""
    rng = fresh_rng()
    cases = []
    for i in range(8):
        heads = rng.randint(1, 16)
        cases.append(((rng.randint(1, 4096), rng.randint(1, 16), heads * rng.randint(1, 200),
                       heads, i % 2 == 0), {}))
    return run_checks("activation_bytes_per_layer", fn, _activation_reference, cases,
                      hint=_activation_hint)


def _intensity_hint(args, kwargs, expected, got) -> str:
    spec, batch, context, dtype = args
    if isinstance(got, (int, float)) and got and abs(expected / got - batch) < 1e-6 * batch:
        return "the weights are read once for the whole batch, but every sequence does the FLOPs"
    if isinstance(got, (int, float)) and got and abs(got / expected - 2) < 1e-6:
        return "a multiply-add is 2 FLOPs, and each weight is 2 bytes in bf16: check both"
    return "FLOPs = B·(2·P + 4·L·H·d·context); bytes = weight bytes + KV bytes for B sequences"


def check_decode_intensity(fn) -> int:
    """``fn(spec, batch, context, dtype) -> FLOP/byte`` of one decode step, against
    :func:`llminfra.calc.memory.decode_arithmetic_intensity`."""
    rng = fresh_rng()
    cases = [((random_llama_spec(rng), rng.randint(1, 64), rng.randint(1, 4096),
               rng.choice(["bf16", "fp16", "fp32"])), {}) for _ in range(8)]
    return run_checks("decode_intensity", fn, decode_arithmetic_intensity, cases, rel=1e-9,
                      hint=_intensity_hint)


__all__ = ["random_llama_spec", "check_param_count", "check_training_memory",
           "check_activation_bytes", "check_decode_intensity"]
