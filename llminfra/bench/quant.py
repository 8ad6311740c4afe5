"""``python -m llminfra bench quant [--quick] --json PATH``: quantization measured on the tiny model.

Per scheme (keyed by its name, e.g. ``int4-g128``): ``bytes_per_param`` actually stored for the
blocks' linear weights (scales and zero points included), ``layer_rel_error`` (mean relative
output error of the quantized linear layers on real held-out activations), held-out
``perplexity`` and ``perplexity_delta`` from fp32, ``greedy_agreement`` with fp32, and the CPU
time of one quantized linear (PyTorch's int8 / int4 kernel with bf16 activations, dequantize +
matmul, or int8 matmul) against fp32, measured side by side. ``outlier_layer``: RTN / AWQ / GPTQ
on a real layer with injected outlier channels.
``kv_cache``: perplexity and bytes with the KV cache in int8 / fp8. ``gguf``: file sizes and
round-trip error of the GGUF export. ``memory_rules``: the source texts' memory rules recomputed.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch

from llminfra.bench.timing import best_time_s, environment, torch_threads
from llminfra.model import corpus_tokens, heldout_tokens, load_tiny, perplexity
from llminfra.quant import QuantLinear, quantize_model
from llminfra.quant.evaluate import evaluate_scheme, linear_inputs, outlier_layer_experiment
from llminfra.quant.kv_quant import kv_perplexity
from llminfra.quant.gguf_export import export_gguf, load_state_dict_from_gguf
from llminfra.quant.memory_rules import kv_stays, seventy_b_at_4_bits, weight_rule_table
from llminfra.quant.quantize_model import model_weight_bytes

SCHEMES = ("int8-absmax", "int8-zeropoint", "int8-channel", "int8-dynamic", "fp8-e4m3",
           "fp8-e5m2", "nf4", "int4-g128", "gptq-int4-g128", "awq-int4-g128", "int4-channel",
           "gptq-int4-channel", "int3-g128", "gptq-int3-g128", "int3-channel", "int2-g32")
QUICK_SCHEMES = ("int8-absmax", "int8-zeropoint", "int8-channel", "fp8-e4m3", "nf4", "int4-g128",
                 "gptq-int4-g128", "awq-int4-g128", "int4-channel", "int3-g128")
TIMED = ("int8-channel", "int8-dynamic", "fp8-e4m3", "int4-g128", "nf4")


def _data(quick: bool):
    """Evaluation ids (1-D), layer-error windows (B, T), calibration windows, prompts."""
    T = 256
    held = heldout_tokens()
    n_eval = 8 * T + 1 if quick else 48 * T + 1
    eval_ids = held[:n_eval]
    rest = held[n_eval:]
    layer = rest[: 4 * T].reshape(4, T)
    prompts = [rest[4 * T + i * 97: 4 * T + i * 97 + 24].tolist() for i in range(2 if quick else 6)]
    train = corpus_tokens("train")
    n_cal = 4 if quick else 16
    step = max(1, (train.numel() - T) // n_cal)
    calib = torch.stack([train[i * step: i * step + T] for i in range(n_cal)])
    return eval_ids, layer, calib, prompts


def _quantized(model, scheme: str, calib):
    return quantize_model(copy.deepcopy(model), scheme, calibration=calib)


def _timing(scheme: str, quick: bool) -> dict:
    """CPU time of ``x (M, 2048) @ W (2048, 2048)``: QuantLinear vs nn.Linear in fp32, same run.

    A layout with one of PyTorch's int8 / int4 kernels takes it with bf16 activations, the dtype
    its vectorized code is written for (``environment.cpu_capability`` names the CPU's); the
    others dequantize and multiply in fp32. ``path`` and ``activations`` say which."""
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(2048, 2048, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(2048, 2048, generator=g) * 0.02)
    if scheme == "int8-dynamic":
        ql = QuantLinear.from_linear(lin, "int8-channel", act_quant="int8")
    else:
        ql = QuantLinear.from_linear(lin, scheme, fast=True)
    path = "w8a8" if ql.act_quant else ql.fast_path or "dequantize+matmul"
    dtype = torch.bfloat16 if ql.fast_path else torch.float32
    out = {"path": path, "activations": str(dtype).removeprefix("torch.")}
    for m in (1, 64):
        x = torch.randn(m, 2048, generator=g)
        xq = x.to(dtype)
        with torch.no_grad():
            t_fp = best_time_s(lambda: lin(x), repeats=3 if quick else 7)
            t_q = best_time_s(lambda: ql(xq), repeats=3 if quick else 7)
        out[f"tokens_{m}"] = {"fp32_s": t_fp, "quant_s": t_q, "ratio": t_q / t_fp}
    return out


def _outlier(model, layer, calib, name="layers.1.feed_forward.w1") -> dict:
    X_eval = linear_inputs(model, layer)[name]
    X_cal = linear_inputs(model, calib)[name]
    W = model.get_submodule(name).weight.detach()
    res = outlier_layer_experiment(W, X_cal, X_eval, 4, torch.Generator().manual_seed(0))
    res["layer"] = name
    return res


def _kv(model, eval_ids) -> dict:
    c = model.config
    out = {}
    for fmt, bpv in ((None, 4.0), ("int8", 1 + 2 / c.head_dim), ("fp8-e4m3", 1 + 2 / c.head_dim)):
        ppl = kv_perplexity(model, eval_ids, fmt)
        out[fmt or "fp32"] = {"perplexity": ppl, "bytes_per_token":
                              2 * c.n_layers * c.n_kv_heads * c.head_dim * bpv}
    for k in ("int8", "fp8-e4m3"):
        out[k]["perplexity_delta"] = out[k]["perplexity"] - out["fp32"]["perplexity"]
    return out


def _gguf(model, eval_ids) -> dict:
    out = {"fp32_perplexity": perplexity(model, eval_ids), "eval_tokens": int(eval_ids.numel())}
    with tempfile.TemporaryDirectory() as d:
        for qtype in ("Q8_0", "Q4_0"):
            path = export_gguf(model, Path(d) / f"tiny-{qtype}.gguf", qtype)
            m2 = copy.deepcopy(model)
            m2.load_state_dict(load_state_dict_from_gguf(model, path))
            out[qtype] = {"file_bytes": path.stat().st_size, "perplexity": perplexity(m2, eval_ids)}
    return out


def _memory_rules() -> dict:
    return {"7b": weight_rule_table(), "70b_int4": seventy_b_at_4_bits(), "kv_stays": kv_stays()}


def measure(model, quick: bool = False, schemes=SCHEMES) -> dict:
    """All the numbers for ``model`` (the trained tiny model in :func:`run`)."""
    eval_ids, layer, calib, prompts = _data(quick)
    n_new = 16 if quick else 32
    ppl_fp = perplexity(model, eval_ids)
    result = {"environment": environment(), "quick": quick,
              "eval_tokens": int(eval_ids.numel()), "calibration_tokens": int(calib.numel()),
              "fp32": {"bytes_per_param": 4.0, "perplexity": ppl_fp}}
    for scheme in schemes:
        q = _quantized(model, scheme, calib)
        wb = model_weight_bytes(q)
        r = {"bytes_per_param": wb["quantized_bytes"] / wb["quantized_params"]}
        r.update(evaluate_scheme(model, q, eval_ids, layer, prompts, n_new, ppl_fp))
        if scheme in TIMED:
            r["matmul_cpu_time"] = _timing(scheme, quick)
        result[scheme] = r
    result["outlier_layer"] = _outlier(model, layer, calib)
    result["kv_cache"] = _kv(model, eval_ids)
    result["gguf"] = _gguf(model, eval_ids[: 4 * 256 + 1] if quick else eval_ids)
    result["memory_rules"] = _memory_rules()
    return result


def run(quick: bool = False, threads: int = 1) -> dict:
    """Measure every scheme on the trained tiny model (``--quick``: fewer tokens and schemes).

    Runs on ``threads`` CPU threads (1 by default: on a shared 2-core machine GPTQ's column
    loop, many small products in a row, ran several times slower on two threads than on one);
    fp32 and quantized timings share that setting.
    """
    model, _ = load_tiny()
    with torch_threads(threads):
        return measure(model.float().eval(), quick, QUICK_SCHEMES if quick else SCHEMES)


def format_table(result: dict) -> str:
    """Scheme table, then outlier layer, KV cache and GGUF lines."""
    lines = [f"{'scheme':<18} {'B/param':>8} {'layer err':>10} {'ppl':>8} {'Δppl':>8} "
             f"{'greedy=':>8} {'t_q/t_fp32 (1 tok)':>19}",
             f"{'fp32':<18} {4.0:>8.3f} {'-':>10} {result['fp32']['perplexity']:>8.4f}"]
    for k, r in result.items():
        if not isinstance(r, dict) or "layer_rel_error" not in r:
            continue
        t = r.get("matmul_cpu_time", {}).get("tokens_1", {}).get("ratio")
        lines.append(f"{k:<18} {r['bytes_per_param']:>8.4f} {100 * r['layer_rel_error']:>9.2f}% "
                     f"{r['perplexity']:>8.4f} {r['perplexity_delta']:>+8.4f} "
                     f"{r['greedy_agreement']:>8.3f} {'' if t is None else f'{t:.2f}x':>19}")
    o = result["outlier_layer"]
    lines.append(f"outlier layer {o['layer']} (channels {o['channels']} × {o['factors']}): " + ", ".join(
        f"{k} {100 * v:.2f}%" for k, v in o.items() if k.endswith("g128")))
    kv = result["kv_cache"]
    lines.append("KV cache: " + ", ".join(f"{k} ppl {v['perplexity']:.4f} ({v['bytes_per_token']:.0f} B/token)"
                                          for k, v in kv.items()))
    gg = result["gguf"]
    lines.append(f"GGUF (ppl on {gg['eval_tokens']} tokens, fp32 {gg['fp32_perplexity']:.4f}): " + ", ".join(
        f"{k} {v['file_bytes']} B, ppl {v['perplexity']:.4f}" for k, v in gg.items() if isinstance(v, dict)))
    return "\n".join(lines)
