"""Answer checkers for chapter 02 (``solutions/02_gpu_memory.ipynb``): KV bytes per token, KV
cache of one sequence in GiB, and the largest batch that fits on a GPU.

Each checker builds named cases from one seed (presets and random GQA / MQA / MHA architectures;
a 1-byte, a 4-byte and a 2-byte KV dtype in that order; for the largest batch, an fp8 cache
that a count in the weights' dtype or in 16 bits gets wrong, a model that does not fit, one
whose exact quotient has a fraction above .5 and one below, where each usual mistake gives a
count of its own), compares the learner's function with the package's
(:mod:`llminfra.calc.memory`) and, on a mismatch, names the usual mistake the wrong answer
matches: the missing factor 2 for K and V, ``num_heads`` instead of ``num_kv_heads``, the KV
dtype ignored (or the weights' dtype used for the cache), bits instead of bytes, GB (1e9) instead of GiB (2**30), the runtime reserve or
the activations left out, no clip at 0, round() instead of floor.

KV cache rule: Kwon et al., 2023 (vLLM, arXiv:2309.06180), §3: per token
``2 · layers · kv_heads · head_dim · bytes`` (K and V of every layer).
"""

from __future__ import annotations

import dataclasses
import math
import random

from llminfra.calc.memory import (DEFAULT_RESERVE_FRACTION, inference_memory, kv_bytes,
                                  kv_bytes_per_token, max_batch)
from llminfra.course.checking import Case, checker, first_matching, run_checks, seeded
from llminfra.specs.formats import dtype_bytes
from llminfra.specs.gpus import get_gpu, gpu_names
from llminfra.specs.models import ModelSpec, get_model, model_names

KV_DTYPES = ("fp8", "fp32", "bf16", "fp16", "int8")  # 1, 4, 2 bytes first: each mistake distinct


class CaseSpec(ModelSpec):
    """A :class:`ModelSpec` whose repr names only what the KV cache depends on, so that a
    checker's message stays readable."""

    def __repr__(self) -> str:
        return (f"<{self.name}: num_layers={self.num_layers}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}>")


def _case(spec: ModelSpec) -> CaseSpec:
    return CaseSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})


def random_spec(rng: random.Random) -> ModelSpec:
    """A random Llama-style architecture with grouped-query attention (``num_kv_heads`` strictly
    between 1 and ``num_heads``, so a ``num_heads`` mix-up always shows) and a long window."""
    head_dim = rng.choice([64, 80, 96, 128])
    kv_heads = rng.choice([2, 4, 8])
    heads = kv_heads * rng.choice([2, 8])  # never 4: 4·H_kv·1 byte would equal H·(2·1 byte)
    return dataclasses.replace(
        get_model("llama-2-7b"), name=f"random-gqa-{heads}q{kv_heads}kv",
        display_name="random GQA model", num_layers=rng.randint(2, 96), num_heads=heads,
        num_kv_heads=kv_heads, hidden_size=heads * head_dim,
        intermediate_size=rng.randint(1, 8) * 1024 * 2, max_positions=131072)


def _specs(rng: random.Random, n_random: int = 4) -> list[ModelSpec]:
    """Two random GQA specs first (so num_heads / num_kv_heads mix-ups show on case 1, and a
    1-byte dtype on case 2 is never confused with another mistake), a GQA preset, presets,
    then more random GQA specs."""
    presets = [get_model(rng.choice(["llama-2-70b", "mistral-7b", "llama-3-8b"]))]  # GQA
    standard = [n for n in model_names() if get_model(n).attention != "MLA"]  # 2·L·H_kv·d
    presets += [get_model(n) for n in rng.sample(standard, 4)]
    specs = [random_spec(rng), random_spec(rng)] + presets
    specs += [random_spec(rng) for _ in range(n_random - 2)]
    return [_case(s) for s in specs]


def _spec_name(spec: ModelSpec) -> str:
    kind = ("MHA" if spec.num_kv_heads == spec.num_heads else
            "MQA" if spec.num_kv_heads == 1 else "GQA")
    return (f"{spec.name} ({kind}: L={spec.num_layers}, H={spec.num_heads}, "
            f"H_kv={spec.num_kv_heads}, d={spec.head_dim})")


def _bytes(n: float) -> str:
    """``1 byte``, ``0.5 bytes``, ``2 bytes``."""
    return f"{n:g} byte" + ("" if n == 1 else "s")


def _kv_hint(args, kwargs, expected, got) -> str:
    spec, kv_dtype = args
    L, Hkv, H, d = spec.num_layers, spec.num_kv_heads, spec.num_heads, spec.head_dim
    b = dtype_bytes(kv_dtype)
    wrong = {
        f"you ignored kv_dtype: {kv_dtype} takes {_bytes(b)} per element, not 2 (use "
        "dtype_bytes(kv_dtype))": 2 * L * Hkv * d * 2,
        "you forgot the factor 2: the cache holds both K and V": L * Hkv * d * b,
        "you used num_heads (query heads) instead of num_kv_heads: with GQA/MQA only "
        f"{Hkv} K/V heads are stored, not {H}": 2 * L * H * d * b,
        "you forgot both the factor 2 and num_kv_heads": L * H * d * b,
        "you counted elements, not bytes: multiply by the bytes per element of kv_dtype":
            2 * L * Hkv * d,
        "you counted bits, not bytes (divide by 8)": 2 * L * Hkv * d * b * 8,
        "you forgot the number of layers": 2 * Hkv * d * b,
    }
    return _matching(wrong, got, expected) or \
        "expected 2 · num_layers · num_kv_heads · head_dim · bytes(kv_dtype)"


def _matching(wrong: dict, got, expected) -> str:
    """The messages whose wrong value equals ``got`` (joined by "; or "), else ''."""
    return first_matching(got, wrong, expected)


def _kv_cases(rng: random.Random, with_context: bool) -> list[Case]:
    cases = []
    for k, spec in enumerate(_specs(rng)):
        kv = KV_DTYPES[k % len(KV_DTYPES)]
        if with_context:
            context = rng.randint(2, spec.max_positions or 2048)
            cases.append(Case(f"{_spec_name(spec)}, {context} tokens, kv_dtype={kv}",
                              (spec, context, kv)))
        else:
            cases.append(Case(f"{_spec_name(spec)}, kv_dtype={kv}", (spec, kv)))
    return cases


@checker
def check_kv_bytes_per_token(fn, seed: int | None = None) -> int:
    """Check ``fn(spec, kv_dtype) -> int``: KV-cache bytes of one token over all layers,
    against :func:`llminfra.calc.memory.kv_bytes_per_token` on fresh presets and random GQA
    models. Llama-2-7B in bf16: 2 · 32 · 32 · 128 · 2 = 524,288 bytes."""
    seed, rng = seeded(seed)
    return run_checks("kv_bytes_per_token", fn, kv_bytes_per_token, _kv_cases(rng, False),
                      hint=_kv_hint, seed=seed, replay="ch02.check_kv_bytes_per_token")


def _kv_gib_reference(spec: ModelSpec, context: int, kv_dtype: str) -> float:
    return kv_bytes(spec, context, 1, kv_dtype) / 2**30


def _gib_hint(args, kwargs, expected, got) -> str:
    spec, context, kv_dtype = args
    n_bytes = kv_bytes(spec, context, 1, kv_dtype)
    per_token = kv_bytes_per_token(spec, kv_dtype)
    wrong = {
        "GiB vs GB: you divided by 1e9 (GB); a GiB is 2**30 = 1,073,741,824 bytes":
            n_bytes / 1e9,
        "you returned bytes, not GiB (divide by 2**30)": n_bytes,
        "you divided by 1024**2 (MiB), not 1024**3 (GiB)": n_bytes / 2**20,
        "you forgot to multiply by the context length (that is one token's cache)":
            per_token / 2**30,
        "you forgot the factor 2 for K and V": n_bytes / 2 / 2**30,
    }
    wrong[f"you ignored kv_dtype: {kv_dtype} takes {_bytes(dtype_bytes(kv_dtype))} per "
          "element, not 2"] = n_bytes / dtype_bytes(kv_dtype) * 2 / 2**30
    heads_wrong = 2 * spec.num_layers * spec.num_heads * spec.head_dim * dtype_bytes(kv_dtype)
    wrong["you used num_heads instead of num_kv_heads"] = heads_wrong * context / 2**30
    return _matching(wrong, got, expected) or "expected kv_bytes_per_token · context / 2**30"


@checker
def check_kv_sequence_gib(fn, seed: int | None = None) -> int:
    """Check ``fn(spec, context, kv_dtype) -> float``: the KV cache of ONE sequence of
    ``context`` tokens, in GiB (2**30 bytes). Llama-2-13B, 2048 tokens, bf16:
    819,200 · 2048 / 2**30 = 1.5625 GiB (= 1.678 GB)."""
    seed, rng = seeded(seed)
    return run_checks("kv_sequence_gib", fn, _kv_gib_reference, _kv_cases(rng, True),
                      hint=_gib_hint, seed=seed, replay="ch02.check_kv_sequence_gib")


def _per_sequence_quotient(model, gpu, context, dtype, kv_dtype, reserve_fraction,
                           memory_bytes=None, activations="once") -> float:
    """``(usable - weights - activations) / KV of one sequence``, not rounded, not clipped;
    ``activations``: ``"once"`` (right: one prefill's peak, as
    :func:`llminfra.calc.memory.kv_budget` counts it), ``"none"`` or ``"per_sequence"``.
    ``kv_dtype=None``: the KV cache in the 16-bit compute dtype (``inference_memory``'s
    default), a mistake when the cache has a dtype of its own."""
    est = inference_memory(model, dtype, kv_dtype, context, batch=1)
    memory = get_gpu(gpu).memory_bytes if memory_bytes is None else memory_bytes
    left = memory * (1 - reserve_fraction) - est.weight_bytes
    per_seq = est.kv_bytes
    if activations == "once":
        left -= est.activation_bytes
    elif activations == "per_sequence":
        per_seq += est.activation_bytes
    return left / per_seq


def _per_sequence_closed_form(model, gpu, context, dtype, kv_dtype, reserve_fraction,
                              memory_bytes=None, activations="once") -> int:
    """``floor(quotient)`` of :func:`_per_sequence_quotient`, clipped at 0."""
    return max(0, math.floor(_per_sequence_quotient(model, gpu, context, dtype, kv_dtype,
                                                    reserve_fraction, memory_bytes,
                                                    activations)))


def _batch_hint(args, kwargs, expected, got) -> str:
    model, gpu, context, dtype, kv_dtype, reserve = args
    g = get_gpu(gpu)
    x = _per_sequence_quotient(*args)
    if isinstance(got, (int, float)) and got < 0:
        return ("a batch cannot be negative: when even one sequence does not fit, the answer is "
                "0 (clip at 0 with max(0, …))")
    wrong = {
        "round() rounds up here: the batch must fit, so round down with math.floor":
            max(0, round(x)),
        "you left out the runtime reserve: only (1 - reserve_fraction) of the card is usable":
            _per_sequence_closed_form(model, gpu, context, dtype, kv_dtype, 0.0),
        "you left out the activations: one prefill's peak is held beside the weights":
            _per_sequence_closed_form(model, gpu, context, dtype, kv_dtype, reserve,
                                      activations="none"),
        "you counted the activations once per sequence: prompts are prefilled one at a time, "
        "so one prefill's peak is paid once":
            _per_sequence_closed_form(model, gpu, context, dtype, kv_dtype, reserve,
                                      activations="per_sequence"),
        "GB vs GiB: memory_bytes is the card's real size (vendors' memory 'GB' are GiB, or the "
        "driver's total); memory_gb · 1e9 reads them as decimal GB":
            _per_sequence_closed_form(model, gpu, context, dtype, kv_dtype, reserve,
                                      memory_bytes=g.memory_gb * 1e9),
    }
    own = f"the KV cache has its own dtype: kv_dtype={kv_dtype} ({_bytes(dtype_bytes(kv_dtype))} " \
          "per element)"
    wrong[f"{own}, not the weights' dtype {dtype} ({_bytes(dtype_bytes(dtype))})"] = \
        _per_sequence_closed_form(model, gpu, context, dtype, dtype, reserve)
    wrong[f"{own}, not 16 bits (inference_memory's kv_dtype defaults to the compute dtype: "
          "pass kv_dtype)"] = _per_sequence_closed_form(model, gpu, context, dtype, None, reserve)
    wrong["one too many: the batch must fit, so round down (floor), not up"] = expected + 1
    return _matching(wrong, got, expected) or (
        "expected floor((usable - weights - activations of one prefill) / KV of one sequence), "
        "clipped at 0; "
        "usable = memory_bytes · (1 - reserve_fraction)")


def _kv_dtype_shows(args: tuple) -> bool:
    """Does the KV cache counted in the weights' dtype, or in 16 bits, change the count?"""
    model, gpu, context, dtype, kv_dtype, reserve = args
    right = _per_sequence_closed_form(*args)
    return right > 1 and all(
        _per_sequence_closed_form(model, gpu, context, dtype, wrong_kv, reserve) != right
        for wrong_kv in (dtype, None))


def _each_mistake_shows(args: tuple) -> bool:
    """Do the activations (left out, or counted once per sequence), the runtime reserve and
    GiB read as 1e9-byte GB each give a count of their own, other than the right one?"""
    model, gpu, context, dtype, kv_dtype, reserve = args
    counts = [_per_sequence_closed_form(*args),
              _per_sequence_closed_form(*args, activations="none"),
              _per_sequence_closed_form(*args, activations="per_sequence"),
              _per_sequence_closed_form(model, gpu, context, dtype, kv_dtype, 0.0),
              _per_sequence_closed_form(*args, memory_bytes=get_gpu(gpu).memory_gb * 1e9)]
    return len(set(counts)) == len(counts)


#: kind -> does ``(args, exact quotient)`` belong to it; one case of each in every run, in this
#: order (the KV dtype first, with a fraction below .45 that round() does not change: any
#: later count may already show a cache in the wrong dtype)
_BATCH_KINDS = {
    "fits, fp8 KV cache beside 16-bit or int4 weights: the KV counted in the weights' dtype or "
    "in 16 bits changes the count": lambda args, x: (args[4] == "fp8" and args[3] != "int8"
                                                    and x - math.floor(x) < 0.45
                                                    and _kv_dtype_shows(args)),
    "does not fit (exact quotient below -1)": lambda args, x: x < -1,
    "fits, exact quotient's fraction above .5":
        lambda args, x: x > 1 and x - math.floor(x) > 0.55,
    "fits, exact quotient's fraction below .5; the activations, the reserve and GiB each "
    "change the count": lambda args, x: (x > 1 and x - math.floor(x) < 0.45
                                         and _each_mistake_shows(args)),
}


def _batch_case(rng: random.Random, kv_dtype: str | None = None) -> tuple:
    name = rng.choice(model_names())
    spec = get_model(name)
    return (name, rng.choice(gpu_names()), rng.randint(1, spec.max_positions or 2048),
            rng.choice(["bf16", "fp16", "int8", "int4"]), kv_dtype or rng.choice(["bf16", "fp8"]),
            rng.choice([DEFAULT_RESERVE_FRACTION, 0.05, 0.2]))


def _batch_name(args: tuple, kind: str) -> str:
    model, gpu, context, dtype, kv, reserve = args
    return (f"{model} on {gpu}, {context} tokens, {dtype} weights / {kv} KV, reserve "
            f"{reserve:g} — {kind}")


@checker
def check_largest_batch(fn, seed: int | None = None) -> int:
    """Check ``fn(model, gpu, context, dtype, kv_dtype, reserve_fraction) -> int``: the
    largest batch of ``context``-token sequences that fits, against the package's bisection
    :func:`llminfra.calc.memory.max_batch` (0 when even one sequence does not fit). Every run
    has, in this order, an fp8 KV cache beside 16-bit or int4 weights where a cache counted in
    the weights' dtype or in 16 bits gives another count, a model that does not fit (clip at
    0) and quotients with fractions above and below .5 (floor, not round) — the latter where
    the activations left out or counted per sequence, the reserve left out and GiB read as GB
    each give another count; then random cases."""
    seed, rng = seeded(seed)
    cases = []
    for kind, wanted in _BATCH_KINDS.items():
        for _ in range(5000):
            args = _batch_case(rng, "fp8" if "fp8 KV" in kind else None)
            if wanted(args, _per_sequence_quotient(*args)):
                cases.append(Case(_batch_name(args, kind), args))
                break
        else:  # pragma: no cover - the presets make every kind common
            raise RuntimeError(f"no case of kind {kind!r} found")
    cases += [Case(_batch_name(args, "random"), args) for args in
              (_batch_case(rng) for _ in range(3))]

    def reference(model, gpu, context, dtype, kv_dtype, reserve_fraction):
        return max_batch(model, gpu, context=context, dtype=dtype, kv_dtype=kv_dtype,
                         reserve_fraction=reserve_fraction)

    return run_checks("largest_batch", fn, reference, cases, hint=_batch_hint, seed=seed,
                      replay="ch02.check_largest_batch")
