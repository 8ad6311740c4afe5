"""Answer checkers for chapter 08 (``solutions/08_gpu_hardware_and_roofline.ipynb``): one
transformer layer's roofline point in decode, and the decode tokens/s bound of a model on a GPU.

Every run draws fresh cases from a seed that the failure message names (replay them with
``check_…(fn, seed=…)``) and always includes one case of each category the exercises name:
batch 1 at a context of 1 (the weights alone), a large batch, a long context, a grouped-query
(GQA) and a multi-query (MQA) model, and random models, batches, contexts and GPUs. On a
mismatch the message gives the case, the expected and returned values, their difference, and
the usual mistake when the wrong answer matches one: the factor 2 of a multiply-add left out,
the weights counted once per sequence, the KV cache left out or counted once for the batch,
fp32 instead of bf16 bytes, the attention FLOPs left out, the batch left out of tokens/s,
seconds per token returned, GiB/s read for GB/s.

References: :func:`llminfra.calc.roofline.layer_point` and
:func:`llminfra.calc.roofline.decode_tokens_per_s` (taught in chapter 08).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from llminfra.calc.memory import kv_bytes_per_token, weight_bytes
from llminfra.calc.params import active_param_count, param_count
from llminfra.calc.roofline import decode_batch, decode_tokens_per_s, layer_point
from llminfra.course.checking import CheckFailed, run_checks
from llminfra.specs.gpus import get_gpu, gpu_names
from llminfra.specs.models import get_model, model_names

#: dense presets (mixture-of-experts left out: their active and stored weights differ)
DENSE = tuple(n for n in model_names() if not get_model(n).is_moe)
#: GPUs with a dense bf16 peak in the catalog
BF16_GPUS = tuple(g for g in gpu_names() if get_gpu(g).tflops("bf16"))


def _as_number(value):
    """``value`` as a float when it holds one (numpy scalars, 0-d tensors, Decimal, Fraction);
    otherwise unchanged, so the comparison fails with the value shown, never a crash."""
    if isinstance(value, (bool, str, bytes)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return value


def _seeded(seed: int | None) -> tuple[int, random.Random]:
    seed = random.randrange(2**32) if seed is None else int(seed)
    return seed, random.Random(seed)


def _run(name: str, check: str, fn, reference, cases, seed: int, hint, rel: float = 1e-6) -> int:
    if not callable(fn):
        raise CheckFailed(f"{name}: expected a function, got {type(fn).__name__}")

    def learner(*args, **kwargs):
        return _as_number(fn(*args, **kwargs))

    try:
        return run_checks(name, learner, reference, cases, rel=rel, hint=hint)
    except CheckFailed as e:
        raise CheckFailed(f"{e} [replay: ch08.{check}(your_function, seed={seed})]") from None


def _difference(expected, got) -> str:
    try:
        d = float(got) - float(expected)
    except (TypeError, ValueError):
        return f"the answer is a {type(got).__name__}, not a number"
    rel = abs(d) / abs(expected) if expected else math.inf
    return f"off by {d:+.6g} ({rel:.3g} relative)"


def _matching(wrong: dict, got, expected) -> str:
    try:
        got = float(got)
    except (TypeError, ValueError):
        return ""
    hits = [m for m, v in wrong.items()
            if math.isclose(got, v, rel_tol=1e-6) and not math.isclose(v, expected, rel_tol=1e-6)]
    return "; or ".join(hits)


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


def _layer_hint(args, kwargs, expected, got) -> str:
    model, B, c = args
    p_f, p_b, attn, kv = _block(model)
    flops, nbytes = B * (2 * p_f + attn * c), 2 * p_b + B * c * kv
    wrong = {
        "you left out the factor 2: a weight costs a multiply AND an add per token":
            B * (p_f + attn * c / 2) / nbytes,
        "you counted the weights once per sequence: a step reads them once for the whole batch":
            flops / (B * 2 * p_b + B * c * kv),
        "you left out the KV cache each sequence reads": flops / (2 * p_b),
        "you read the KV cache once for the batch: every sequence reads its own":
            flops / (2 * p_b + c * kv),
        "you used 4 bytes (fp32) per value: the weights and cache are bf16, 2 bytes":
            flops / (2 * nbytes),
        "you left out the attention FLOPs (QKᵀ and AV over the context)":
            B * 2 * p_f / nbytes,
        "you returned bytes per FLOP: intensity is FLOPs / bytes": nbytes / flops,
    }
    return _matching(wrong, got, expected) or (
        f"{_difference(expected, got)}; expected B·(2·P_layer + 4·H·d·context) / "
        "(2·P_layer + B·context·kv_bytes_per_token/L)")


def check_layer_point(fn, seed: int | None = None) -> int:
    """Check ``fn(model, batch, context) -> FLOP/byte``: one transformer layer's arithmetic
    intensity in a decode step of ``batch`` sequences at ``context`` tokens, bf16 weights and
    cache. Llama-2-7B, batch 1, context 1: 404,783,104 FLOPs / 404,783,104 bytes = 1.0."""
    seed, rng = _seeded(seed)
    m = _case_models(rng)
    cases = [((rng.choice(DENSE), 1, 1), {}),                         # the weights alone
             ((m[0], rng.randint(64, 512), _context(rng, m[0], 256)), {}),  # a large batch
             ((m[0], rng.randint(1, 4), (get_model(m[0]).max_positions or 8192)), {}),  # long
             ((m[1], rng.randint(1, 64), _context(rng, m[1])), {}),     # GQA
             ((m[2], rng.randint(1, 64), _context(rng, m[2])), {})]     # MQA
    for _ in range(3):
        name = rng.choice(DENSE)
        cases.append(((name, rng.randint(1, 256), _context(rng, name)), {}))
    return _run("layer_point", "check_layer_point", fn, _layer_reference, cases, seed,
                _layer_hint)


# --- exercise 2: the decode tokens/s bound ------------------------------------------------

def _decode_reference(model, gpu, batch, context):
    return decode_tokens_per_s(model, gpu, batch, context)


def _decode_hint(args, kwargs, expected, got) -> str:
    model, gpu, B, c = args
    g = get_gpu(gpu)
    w, kv = weight_bytes(model, "bf16"), kv_bytes_per_token(model, "bf16")
    bw = g.hbm_bytes_per_s
    wrong = {
        "you left out the KV cache each sequence reads every step": B * bw / w,
        "you read one KV cache for the whole batch: every sequence reads its own":
            B * bw / (w + c * kv),
        "you counted the weights once per sequence: a step reads them once":
            B * bw / (B * w + B * c * kv),
        "tokens/s counts every sequence's token: multiply by the batch": expected / B,
        "you returned seconds per token (step time / batch), not tokens per second": 1 / expected,
        "you returned the step time, not tokens per second": B / expected,
        "the catalog's GB/s are 1e9 bytes/s, not GiB/s": expected * 2**30 / 1e9,
    }
    return _matching(wrong, got, expected) or (
        f"{_difference(expected, got)}; expected batch / max(FLOPs / peak, (weights + batch · "
        "context · kv_bytes_per_token) / bandwidth)")


def check_decode_bound(fn, seed: int | None = None) -> int:
    """Check ``fn(model, gpu, batch, context) -> tokens/s``: the upper bound of decode tokens
    per second (all sequences together), bf16 weights and cache. Llama-2-7B on an H100, batch
    1 at 2048 tokens: 3.35e12 / 14,550,573,056 = 230.2 tokens/s."""
    seed, rng = _seeded(seed)
    m = _case_models(rng)
    cases = [((rng.choice(DENSE), rng.choice(BF16_GPUS), 1, 1), {}),      # the weights alone
             (("llama-2-7b", "h100", 1, 2048), {}),                        # the worked example
             ((m[0], rng.choice(BF16_GPUS), rng.randint(64, 256), _context(rng, m[0], 512)), {}),
             ((m[1], rng.choice(BF16_GPUS), rng.randint(1, 32),
               get_model(m[1]).max_positions or 8192), {}),                # GQA, long context
             ((m[2], rng.choice(BF16_GPUS), rng.randint(1, 32), _context(rng, m[2])), {})]  # MQA
    for _ in range(3):
        name = rng.choice(DENSE)
        cases.append(((name, rng.choice(BF16_GPUS), rng.randint(1, 128), _context(rng, name)), {}))
    return _run("decode_bound", "check_decode_bound", fn, _decode_reference, cases, seed,
                _decode_hint)
