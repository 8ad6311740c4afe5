"""Answer checkers for chapter 08 (``solutions/08_gpu_hardware_and_roofline.ipynb``): one
transformer layer's roofline point in decode, and the decode tokens/s bound of a model on a GPU.

Every run builds its cases from one seed that a failure names (replay them with
``ch08.check_…(fn, seed=…)``); one case of each category the exercises name comes first:
batch 1 at a context of 1 (the weights alone), a large batch, a long context, a grouped-query
(GQA) and a multi-query (MQA) model, for the decode bound a step of a GQA model that is
compute-bound (so an answer without the compute roof, or with the attention FLOPs over the KV
heads, fails every run, not only when a random draw lands there), and random models, batches,
contexts and GPUs. On a mismatch the message gives the case, the expected and returned values,
their difference, and the usual mistake when the wrong answer matches one: the factor 2 of a
multiply-add left out, the weights counted once per sequence, the KV cache left out or counted
once for the batch, fp32 instead of bf16 bytes, the attention FLOPs left out or counted over
(or divided by) the KV heads, the compute roof left out, the batch left out of tokens/s,
seconds per token returned, GiB/s read for GB/s, bits for bytes, milliseconds for
seconds, the head dim left out, batch and context swapped, the context off by one. Each is
tried on every case and the one the answer matches on all of them is named.

References: :func:`llminfra.calc.roofline.layer_point` and
:func:`llminfra.calc.roofline.decode_tokens_per_s` (taught in chapter 08).
"""

from __future__ import annotations

import random
from dataclasses import replace

from llminfra.calc.memory import kv_bytes_per_token, weight_bytes
from llminfra.calc.params import active_param_count, param_count
from llminfra.calc.roofline import decode_batch, decode_tokens_per_s, layer_point
from llminfra.course.checking import Case, checker, first_matching, run_checks, seeded
from llminfra.specs.gpus import get_gpu, gpu_names
from llminfra.specs.models import get_model, model_names

#: dense presets (mixture-of-experts left out: their active and stored weights differ)
DENSE = tuple(n for n in model_names() if not get_model(n).is_moe)
#: GPUs with a dense bf16 peak in the catalog
BF16_GPUS = tuple(g for g in gpu_names() if get_gpu(g).tflops("bf16"))


def _matching(wrong: dict, got, expected) -> str:
    return first_matching(got, wrong, expected, rel=1e-6)


def _case_models(rng: random.Random) -> list[str]:
    """One MHA, one GQA and one MQA preset, then random dense ones."""
    by_kind = {k: [n for n in DENSE if get_model(n).attention == k] for k in ("MHA", "GQA", "MQA")}
    return [rng.choice(by_kind[k]) for k in ("MHA", "GQA", "MQA")]


def _context(rng: random.Random, name: str, top: int | None = None) -> int:
    limit = get_model(name).max_positions or 8192
    return rng.randint(1, min(limit, top or limit))


# --- exercise 1: one layer's roofline point -----------------------------------------------

def _layer_reference(model, batch, context):
    return layer_point(model, decode_batch(batch, context), "bf16")["intensity"]


def _block(model):
    spec = get_model(model)
    one, two = replace(spec, num_layers=1), replace(spec, num_layers=2)
    p_flops = active_param_count(two) - active_param_count(one)
    p_bytes = param_count(two) - param_count(one)
    attn = 4 * spec.num_heads * spec.head_dim
    kv = kv_bytes_per_token(spec, "bf16") / spec.num_layers
    return p_flops, p_bytes, attn, kv


def _layer_wrong(model, B, c) -> dict[str, float]:
    """The usual wrong intensities of one layer, by what to tell the learner."""
    p_f, p_b, attn, kv = _block(model)
    spec = get_model(model)
    flops, nbytes = B * (2 * p_f + attn * c), 2 * p_b + B * c * kv
    return {
        "you left out the factor 2: a weight costs a multiply AND an add per token":
            B * (p_f + attn * c / 2) / nbytes,
        "you counted the weights once per sequence: a step reads them once for the whole batch":
            flops / (B * 2 * p_b + B * c * kv),
        "you left out the KV cache each sequence reads": flops / (2 * p_b),
        "you read the KV cache once for the batch: every sequence reads its own":
            flops / (2 * p_b + c * kv),
        "you used 4 bytes (fp32) per value: the weights and cache are bf16, 2 bytes":
            flops / (2 * nbytes),
        "you counted bits, not bytes (×8): bf16 is 2 bytes per value": flops / (8 * nbytes),
        "you left out the attention FLOPs (QKᵀ and AV over the context)":
            B * 2 * p_f / nbytes,
        "you left out the head dim d: attention does 4·H·d FLOPs per cached position, not 4·H":
            B * (2 * p_f + 4 * spec.num_heads * c) / nbytes,
        "you left out the batch in the FLOPs: every sequence's token does 2·P + 4·H·d·context":
            (2 * p_f + attn * c) / nbytes,
        "you returned bytes per FLOP: intensity is FLOPs / bytes": nbytes / flops,
        "batch and context are swapped: the arguments are (model, batch, context)":
            _layer_reference(model, c, B),
        "off by one in the context: it already includes the new token (use context, not "
        "context + 1)": _layer_reference(model, B, c + 1) if c > 0 else None,
        "off by one in the context: it already includes the new token (use context, not "
        "context - 1)": _layer_reference(model, B, c - 1) if c > 1 else None,
    }


LAYER_MISTAKES = _layer_wrong  # every usual wrong value of a case at once


def _layer_hint(args, kwargs, expected, got) -> str:
    wrong = {k: v for k, v in _layer_wrong(*args).items() if v is not None}
    return _matching(wrong, got, expected) or (
        "expected B·(2·P_layer + 4·H·d·context) / "
        "(2·P_layer + B·context·kv_bytes_per_token/L)")


@checker
def check_layer_point(fn, seed: int | None = None) -> int:
    """Check ``fn(model, batch, context) -> FLOP/byte``: one transformer layer's arithmetic
    intensity in a decode step of ``batch`` sequences at ``context`` tokens, bf16 weights and
    cache. Llama-2-7B, batch 1, context 1: 404,783,104 FLOPs / 404,783,104 bytes = 1.0."""
    seed, rng = seeded(seed)
    m = _case_models(rng)
    cases = [Case("the weights alone: batch 1, context 1", (rng.choice(DENSE), 1, 1)),
             Case("MHA preset, a large batch", (m[0], rng.randint(64, 512),
                                                _context(rng, m[0], 256))),
             Case("MHA preset, a few sequences at its longest context",
                  (m[0], rng.randint(1, 4), get_model(m[0]).max_positions or 8192)),
             Case("GQA preset", (m[1], rng.randint(1, 64), _context(rng, m[1]))),
             Case("MQA preset", (m[2], rng.randint(1, 64), _context(rng, m[2])))]
    for _ in range(3):
        name = rng.choice(DENSE)
        cases.append(Case("random dense preset, batch and context",
                          (name, rng.randint(1, 256), _context(rng, name))))
    return run_checks("layer_point", fn, _layer_reference, cases, rel=1e-6, hint=_layer_hint,
                      seed=seed, replay="ch08.check_layer_point", mistakes=LAYER_MISTAKES)


# --- exercise 2: the decode tokens/s bound ------------------------------------------------

def _decode_reference(model, gpu, batch, context):
    return decode_tokens_per_s(model, gpu, batch, context)


def _step_times(model, gpu, batch, context) -> tuple[float, float]:
    """``(compute seconds, memory seconds)`` of one decode step, bf16, by the roofline."""
    spec, g = get_model(model), get_gpu(gpu)
    flops = batch * (2 * param_count(spec)
                     + 4 * spec.num_layers * spec.num_heads * spec.head_dim * context)
    nbytes = weight_bytes(spec, "bf16") + batch * context * kv_bytes_per_token(spec, "bf16")
    return flops / (g.tflops("bf16") * 1e12), nbytes / g.hbm_bytes_per_s


#: dense grouped-query presets (1 < H_kv < H): attention FLOPs counted over the KV heads differ
GQA = tuple(n for n in DENSE if get_model(n).attention == "GQA")


def _compute_bound(rng: random.Random) -> tuple:
    """A dense grouped-query preset on a GPU with a large batch at a short context whose
    compute time is at least twice its memory time: the compute roof decides the bound, and
    attention FLOPs counted over the KV heads (H_kv < H) change it."""
    while True:
        name, gpu, context = rng.choice(GQA), rng.choice(BF16_GPUS), rng.randint(1, 16)
        for batch in (256, 512, 1024, 2048, 4096):
            compute, memory = _step_times(name, gpu, batch, context)
            if compute >= 2 * memory:
                return name, gpu, batch, context


def _decode_wrong(model, gpu, B, c) -> dict[str, float]:
    """The usual wrong decode bounds, by what to tell the learner."""
    g = get_gpu(gpu)
    w, kv = weight_bytes(model, "bf16"), kv_bytes_per_token(model, "bf16")
    bw = g.hbm_bytes_per_s
    compute, memory = _step_times(model, gpu, B, c)
    spec = get_model(model)
    peak = g.tflops("bf16") * 1e12
    expected = B / max(compute, memory)
    no_attention = B * 2 * param_count(spec) / peak

    def attention_over(heads: float, d: int = spec.head_dim) -> float:
        flops = B * (2 * param_count(spec) + 4 * spec.num_layers * heads * d * c)
        return B / max(flops / peak, memory)
    return {
        "the attention FLOPs use every query head: 4·L·H·d per cached position (H, not H_kv; "
        "grouped-query attention shares K and V, not the work)": attention_over(spec.num_kv_heads),
        "you divided the attention FLOPs by the KV heads: every query head does its own "
        "4·d FLOPs per cached position (4·L·H·d)": attention_over(spec.num_heads / spec.num_kv_heads),
        "you left out the head dim d: attention does 4·L·H·d FLOPs per cached position, not "
        "4·L·H": attention_over(spec.num_heads, 1),
        "you left out the compute roof: this step is compute-bound, so it takes "
        "max(FLOPs / peak, bytes / bandwidth), here the FLOPs": B / memory,
        "you left out the attention FLOPs (4·L·H·d per cached position, per sequence)":
            B / max(no_attention, memory),
        "you left out the KV cache each sequence reads every step": B * bw / w,
        "you read one KV cache for the whole batch: every sequence reads its own":
            B * bw / (w + c * kv),
        "you counted the weights once per sequence: a step reads them once":
            B * bw / (B * w + B * c * kv),
        "you counted bits, not bytes (×8): bf16 is 2 bytes per value, bandwidth is bytes/s":
            B / max(compute, 8 * memory),
        "tokens/s counts every sequence's token: multiply by the batch": expected / B,
        "you returned seconds per token (step time / batch), not tokens per second": 1 / expected,
        "you returned the step time, not tokens per second": B / expected,
        "you returned tokens per millisecond: the peak and bandwidth are per second":
            expected / 1e3,
        "you returned the step time in milliseconds, not tokens per second": 1e3 * B / expected,
        "the catalog's GB/s are 1e9 bytes/s, not GiB/s (2³⁰)": B / max(compute, memory * 2**30 / 1e9),
        "the catalog's TFLOPS are 1e12 FLOP/s, not 2⁴⁰": B / max(compute * 2**40 / 1e12, memory),
        "batch and context are swapped: the arguments are (model, gpu, batch, context)":
            _decode_reference(model, gpu, c, B),
        "off by one in the context: it already includes the new token (use context, not "
        "context + 1)": _decode_reference(model, gpu, B, c + 1),
        "off by one in the context: it already includes the new token (use context, not "
        "context - 1)": _decode_reference(model, gpu, B, c - 1) if c > 1 else None,
    }


DECODE_MISTAKES = _decode_wrong


def _decode_hint(args, kwargs, expected, got) -> str:
    wrong = {k: v for k, v in _decode_wrong(*args).items() if v is not None}
    return _matching(wrong, got, expected) or (
        "expected batch / max(FLOPs / peak, (weights + batch · "
        "context · kv_bytes_per_token) / bandwidth)")


@checker
def check_decode_bound(fn, seed: int | None = None) -> int:
    """Check ``fn(model, gpu, batch, context) -> tokens/s``: the upper bound of decode tokens
    per second (all sequences together), bf16 weights and cache. Llama-2-7B on an H100, batch
    1 at 2048 tokens: 3.35e12 / 14,550,573,056 = 230.2 tokens/s. Every run has memory-bound
    steps and one compute-bound step (a grouped-query model, a large batch at a short
    context: attention FLOPs over H_kv heads, or divided by them, show there)."""
    seed, rng = seeded(seed)
    m = _case_models(rng)
    gpu = lambda: rng.choice(BF16_GPUS)  # noqa: E731
    cases = [Case("the weights alone: batch 1, context 1", (rng.choice(DENSE), gpu(), 1, 1)),
             Case("the worked example: llama-2-7b on an h100, batch 1", ("llama-2-7b", "h100",
                                                                         1, 2048)),
             Case("compute-bound GQA preset: a large batch at a short context (FLOPs / peak > "
                  "bytes / bandwidth)", _compute_bound(rng)),
             Case("MHA preset, a large batch", (m[0], gpu(), rng.randint(64, 256),
                                                _context(rng, m[0], 512))),
             Case("GQA preset at its longest context", (m[1], gpu(), rng.randint(1, 32),
                                                        get_model(m[1]).max_positions or 8192)),
             Case("MQA preset", (m[2], gpu(), rng.randint(1, 32), _context(rng, m[2])))]
    for _ in range(2):
        name = rng.choice(DENSE)
        cases.append(Case("random dense preset, GPU, batch and context",
                          (name, gpu(), rng.randint(1, 128), _context(rng, name))))
    return run_checks("decode_bound", fn, _decode_reference, cases, rel=1e-6, hint=_decode_hint,
                      seed=seed, replay="ch08.check_decode_bound", mistakes=DECODE_MISTAKES)


__all__ = ["check_decode_bound", "check_layer_point"]
