"""``python -m llminfra bench structured [--quick] --json PATH``: what structured output costs per
token, on the real model's vocabulary (SmolLM2-135M's 49,152-token BPE), one CPU thread.

For ``json_object`` and a small schema (:data:`SCHEMA`): the time to build a matcher (grammar
compiled against the vocabulary; the library caches the tokenizer after the first), then a
decode loop whose "model" is seeded random logits nudged toward closing characters (so the
random text ends), masked by the grammar every step — per-token cost of computing the mask and
advancing the state (mean, p50, p99), and whether every output parsed and matched. Beside it,
one batch-1 decode step of the model (fp32, :class:`~llminfra.runner.FastDecoder`), for scale.
Chapter 05.
"""

from __future__ import annotations

import json
import time

import torch

from llminfra.bench.timing import cpu_name, environment, torch_threads
from llminfra.engine.metrics import percentile
from llminfra.engine.structured import json_matcher
from llminfra.model import load_pretrained
from llminfra.runner import FastDecoder

MODEL = "smollm2-135m"
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
SIZES = {False: dict(runs=8, max_tokens=200), True: dict(runs=2, max_tokens=120)}


def _decode(tok, V: int, stops, schema, gen, closing, max_tokens: int) -> tuple[list, str]:
    m = json_matcher(tok, V, stops, schema)
    times, ids = [], []
    for step in range(max_tokens):
        logits = torch.randn(V, generator=gen) + min(0.15 * step, 8.0) * closing
        t0 = time.perf_counter()
        t = int(logits.masked_fill(~m.allowed(V), float("-inf")).argmax())
        m.advance(t)
        times.append(time.perf_counter() - t0)
        if t in stops:
            break
        ids.append(t)
        if m.finished():
            break
    return times, tok.decode(ids)


def run(quick: bool = False) -> dict:
    """Everything in the module docstring, on one thread (restored afterwards)."""
    size = SIZES[bool(quick)]
    with torch_threads(1):
        model, tok = load_pretrained(MODEL)
        env = environment()
        V, stops = model.config.vocab_size, sorted(tok.stop_token_ids)
        closing = torch.tensor([float(any(c in tok.decode([i]) for c in '"]}'))
                                for i in range(V)])
        out = {}
        for name, schema in (("json_object", {"type": "object"}), ("json_schema", SCHEMA)):
            gen = torch.Generator().manual_seed(0)
            t0 = time.perf_counter()
            json_matcher(tok, V, stops, schema)
            build_s = time.perf_counter() - t0
            per_token, ok = [], 0
            for _ in range(size["runs"]):
                times, text = _decode(tok, V, stops, schema, gen, closing, size["max_tokens"])
                per_token += times
                try:
                    obj = json.loads(text)
                    ok += isinstance(obj, dict) and (schema is not SCHEMA or set(obj) == set(
                        SCHEMA["properties"]))
                except ValueError:
                    pass
            out[name] = {"matcher_build_s": build_s, "tokens": len(per_token),
                         "mask_and_advance_us": {
                             "mean": 1e6 * sum(per_token) / len(per_token),
                             "p50": 1e6 * percentile(per_token, 50),
                             "p99": 1e6 * percentile(per_token, 99)},
                         "outputs_valid": f"{ok}/{size['runs']}"}
        fast = FastDecoder(model, max_len=80)
        ids = tok.encode("Describe a person in JSON.")
        fast.generate(ids, 4)
        t0 = time.perf_counter()
        fast.generate(ids, 33)
        t1 = time.perf_counter()
        fast.generate(ids, 1)
        step_s = ((t1 - t0) - (time.perf_counter() - t1)) / 32
    return {"suite": "structured", "model": MODEL, "library": "llguidance", "threads": 1,
            "cpu": cpu_name(), "environment": env, "quick": bool(quick), "formats": out,
            "decode_step_ms": 1e3 * step_s}


def format_table(result: dict) -> str:
    """One line per format."""
    lines = [f"bench structured: {result['model']} vocabulary, {result['library']}, one thread, "
             f"{result['cpu']}",
             f"{'format':<12} {'build ms':>9} {'mean us':>8} {'p50 us':>7} {'p99 us':>7} "
             f"{'valid':>6}"]
    for name, r in result["formats"].items():
        t = r["mask_and_advance_us"]
        lines.append(f"{name:<12} {1e3 * r['matcher_build_s']:>9.3g} {t['mean']:>8.3g} "
                     f"{t['p50']:>7.3g} {t['p99']:>7.3g} {r['outputs_valid']:>6}")
    lines.append(f"one batch-1 decode step of the model: {result['decode_step_ms']:.3g} ms")
    return "\n".join(lines)
