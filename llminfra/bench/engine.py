"""``python -m llminfra bench engine``: the engine's model runners against the floor and against
Hugging Face ``generate``, on the same shapes and the same weights.

The ladder chapter 08 teaches, measured (random weights, byte vocabulary, one device):

* ``readable`` — :class:`~llminfra.engine.readable_runner.ReadableRunner`: the model as chapter 01
  writes it, about 110 torch calls a layer;
* ``fast`` — :class:`~llminfra.runner.FastRunner` eager: fused weights, 25 calls a
  layer;
* ``graphs`` — the fast runner's decode steps replayed from CUDA graphs (on a CPU the emulated
  path: the same buffers, no graph — so its time there is the fast runner's, plus padding).

Per shape: batch-1 decode ms/token of each, × the floor (weight bytes / copy bandwidth
measured in the same run: the time to read every weight once), torch calls per decode step
(and on CUDA the kernels it launches, as the profiler counts them: calls are not launches),
throughput of ``requests`` × ``prompt`` prompt tokens × ``new`` new tokens, and the same
requests through ``transformers``' ``generate`` with a dynamic and a static cache on the same
weights (:func:`hf_llama`), when transformers is installed (else the row says why). Greedy
tokens of the graph path against the eager fast path are counted (they should all agree).

``run_gpu`` (``bench gpu``): bench-100m and a 1B shape (dim 2048, 16 layers, 32/8 heads, FFN
8192) in bf16 on CUDA, 64 × 256 × 128. ``run`` (CPU): bench-100m in fp32, small sizes.
Chapters 05 and 08.
"""

from __future__ import annotations

import time

import torch

from llminfra.bench.calls import count_torch_calls, launches_or_error
from llminfra.bench.timing import (copy_bandwidth_bytes_per_s, environment, synchronize,
                                   torch_threads)
from llminfra.calc.measured import parameter_bytes
from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import ByteTokenizer, ModelConfig, Transformer
from llminfra.model.hf_export import hf_state_dict
from llminfra.runner import runner_for

SEED = 0
#: the 1B shape of the first GPU run (../shared/gpu_runs/2026-12-04-h200)
ONE_B = ModelConfig(vocab_size=256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                    ffn_dim=8192, max_seq_len=2048)
#: runner name -> (LLMEngine runner, cuda_graphs) for a device type
LADDER = {"readable": ("readable", None), "fast": ("fast", False), "graphs": ("fast", True)}


def _engine(model, name: str, device: torch.device, **kw) -> LLMEngine:
    runner, graphs = LADDER[name]
    if graphs and device.type != "cuda":
        graphs = "emulate"
    return LLMEngine(model, ByteTokenizer(), runner=runner_for(runner, cuda_graphs=graphs), **kw)


def decode_ms(model, name: str, device, short: int = 16,
              long: int = 80) -> tuple[float, int, dict | None]:
    """Batch-1 decode: ms per token from the time of ``long`` minus ``short`` new tokens (the
    prompt and the first token cancel), the torch calls of one decode step and, on CUDA, what
    the next step launches (:func:`llminfra.bench.calls.launches_or_error`; None elsewhere)."""
    def timed(n: int) -> float:
        e = _engine(model, name, device, max_num_seqs=1, max_num_batched_tokens=64)
        e.generate([list(range(1, 33))], SamplingParams(max_tokens=4, ignore_eos=True))
        synchronize(device)
        t0 = time.perf_counter()
        e.generate([list(range(1, 33))], SamplingParams(max_tokens=n, ignore_eos=True))
        synchronize(device)
        return time.perf_counter() - t0
    ms = min(timed(long) - timed(short) for _ in range(2)) / (long - short) * 1e3
    e = _engine(model, name, device, max_num_seqs=1, max_num_batched_tokens=64)
    e.add_request(list(range(1, 33)), SamplingParams(max_tokens=4, ignore_eos=True))
    e.step()
    calls = count_torch_calls(e.step)
    return ms, calls, launches_or_error(e.step) if device.type == "cuda" else None


def prompts_for(n: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(SEED)
    return torch.randint(1, 256, (n, length), generator=g).tolist()


def throughput(model, name: str, device, prompts, new: int) -> tuple[float, list]:
    """Output tokens/s of the engine serving ``prompts`` to ``new`` tokens each, and the
    tokens."""
    per_seq = -(-(len(prompts[0]) + new) // 16)                    # blocks of 16 tokens
    e = _engine(model, name, device, max_num_seqs=len(prompts),
                max_num_batched_tokens=max(2048, len(prompts[0])),
                num_blocks=len(prompts) * per_seq + 8)                 # no preemption
    if hasattr(e.runner, "capture_all"):
        e.runner.capture_all()
    e.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))   # warm up
    synchronize(device)
    t0 = time.perf_counter()
    outs = e.generate(prompts, SamplingParams(max_tokens=new, ignore_eos=True))
    synchronize(device)
    return len(prompts) * new / (time.perf_counter() - t0), [o.outputs[0].token_ids for o in outs]


def hf_llama(model: Transformer):
    """``transformers``' ``LlamaForCausalLM`` holding ``model``'s weights, on its device and
    dtype (:func:`llminfra.model.hf_export.hf_state_dict`: q/k rows back to rotate-half).
    ``ImportError`` without transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    w = next(model.parameters())
    conf = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim,
                       num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                       num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
                       max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
                       rope_theta=c.rope_theta, tie_word_embeddings=c.tie_embeddings,
                       attention_bias=False, mlp_bias=False, bos_token_id=None,
                       eos_token_id=None, pad_token_id=0)
    with torch.device(w.device):
        hf = LlamaForCausalLM(conf).to(w.dtype).eval()
    hf.load_state_dict(hf_state_dict(model), strict=False)
    return hf


def hf_generate(hf, prompts, new: int, cache: str) -> tuple[float, list]:
    """Output tokens/s of ``generate`` (greedy, exactly ``new`` tokens) on the batch of
    ``prompts`` (equal lengths: no padding), with a ``dynamic`` or ``static`` cache."""
    device = next(hf.parameters()).device
    ids = torch.tensor(prompts, device=device)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        hf.generate(ids[:, :8], **dict(kw, max_new_tokens=2, min_new_tokens=2))   # warm up
        synchronize(device)
        t0 = time.perf_counter()
        out = hf.generate(ids, **kw)
        synchronize(device)
    return ids.numel() // ids.shape[1] * new / (time.perf_counter() - t0), \
        out[:, ids.shape[1]:].tolist()


def hf_decode_ms(hf, cache: str, short: int = 16, long: int = 80) -> float:
    """Batch-1 ``generate`` ms per token, the same difference as :func:`decode_ms`."""
    p = [list(range(1, 33))]
    t = {n: min(len(p) * n / hf_generate(hf, p, n, cache)[0] for _ in range(2))
         for n in (short, long)}
    return (t[long] - t[short]) / (long - short) * 1e3


def measure_shape(model, device, requests: int, prompt: int, new: int,
                  ladder=("readable", "fast", "graphs")) -> dict:
    """Every number of the module docstring for one model."""
    bw = copy_bandwidth_bytes_per_s(repeats=5, device=device)
    floor_ms = parameter_bytes(model) / bw * 1e3
    out = {"weight_bytes": parameter_bytes(model), "copy_bytes_per_s": bw, "floor_ms": floor_ms,
           "decode_b1": {}, "throughput": {}}
    for name in ladder:
        ms, calls, launches = decode_ms(model, name, device)
        out["decode_b1"][name] = {"ms_per_token": ms, "times_floor": ms / floor_ms,
                                  "torch_calls_per_step": calls}
        if launches is not None:
            out["decode_b1"][name]["launches_per_step"] = launches
    prompts = prompts_for(requests, prompt)
    toks = {}
    for name in ladder:
        rate, toks[name] = throughput(model, name, device, prompts, new)
        out["throughput"][name] = {"tokens_per_s": rate}
    if "graphs" in toks and "fast" in toks:
        out["graphs_vs_eager_identical"] = sum(a == b for a, b in zip(toks["graphs"],
                                                                      toks["fast"]))
        out["graphs_vs_eager_requests"] = len(prompts)
    try:
        hf = hf_llama(model)
    except ImportError as err:
        out["hf"] = {"error": f"transformers not installed: {err}"}
        return out
    out["hf"] = {}
    for cache in ("dynamic", "static"):
        rate, hf_toks = hf_generate(hf, prompts, new, cache)
        ms = hf_decode_ms(hf, cache)
        out["hf"][cache] = {"tokens_per_s": rate, "decode_b1_ms_per_token": ms,
                            "decode_b1_times_floor": ms / floor_ms,
                            "greedy_identical_to_fast": sum(
                                a == b for a, b in zip(hf_toks, toks.get("fast", [])))}
    best = max(out["throughput"].values(), key=lambda r: r["tokens_per_s"])["tokens_per_s"]
    out["engine_over_hf_static"] = best / out["hf"]["static"]["tokens_per_s"]
    del hf
    return out


def _model(config: ModelConfig, device, dtype) -> Transformer:
    """Random weights (seed :data:`SEED`): drawn on the CPU by the model's own init, or — on
    CUDA, where a 1B model's CPU draw would take most of the run — built empty and drawn on the
    device with the same rule (normal, std 0.02; norms 1)."""
    if device.type != "cuda":
        return Transformer(config).to(dtype).eval()
    with torch.device("meta"):
        model = Transformer(config)
    model = model.to_empty(device=device).to(dtype).eval()
    g = torch.Generator(device).manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model


def run_gpu() -> dict:
    """bench-100m and the 1B shape in bf16 on CUDA, 64 requests × 256 × 128. ``RuntimeError``
    without CUDA (never a silent skip)."""
    if not torch.cuda.is_available():
        raise RuntimeError("engine.run_gpu needs a CUDA device; none is visible to torch")
    device = torch.device("cuda")
    result = {"environment": environment(), "dtype": "bfloat16", "requests": 64,
              "prompt_tokens": 256, "new_tokens": 128, "shapes": {}}
    for name, config in (("bench-100m", ModelConfig.from_name("bench-100m")), ("1b", ONE_B)):
        model = _model(config, device, torch.bfloat16)
        result["shapes"][name] = measure_shape(model, device, 64, 256, 128)
        del model
        torch.cuda.empty_cache()
    return result


def run(quick: bool = False) -> dict:
    """On this machine's CPU: bench-100m in fp32, 8 requests × 64 × 16 (``quick``: 4 × 32 × 8),
    one thread."""
    device = torch.device("cpu")
    n, p, new = (4, 32, 8) if quick else (8, 64, 16)
    with torch_threads(1):
        model = _model(ModelConfig.from_name("bench-100m"), device, torch.float32)
        shape = measure_shape(model, device, n, p, new)
    return {"environment": environment(), "dtype": "float32", "requests": n,
            "prompt_tokens": p, "new_tokens": new, "shapes": {"bench-100m": shape}}


def format_table(result: dict) -> str:
    """One block per shape: the ladder's decode and throughput rows, then transformers'."""
    lines = []
    for name, s in result["shapes"].items():
        lines.append(f"{name}: weights {s['weight_bytes'] / 1e6:.4g} MB, floor "
                     f"{s['floor_ms']:.4g} ms/token at {s['copy_bytes_per_s'] / 1e9:.4g} GB/s")
        lines.append(f"  {'runner':<10}{'ms/token':>10}{'x floor':>9}{'calls':>7}{'tok/s':>10}")
        for r, d in s["decode_b1"].items():
            lines.append(f"  {r:<10}{d['ms_per_token']:>10.4g}{d['times_floor']:>9.3g}"
                         f"{d['torch_calls_per_step']:>7}"
                         f"{s['throughput'][r]['tokens_per_s']:>10.4g}")
        for cache, h in s.get("hf", {}).items():
            if cache == "error":
                lines.append(f"  transformers: {h}")
                continue
            lines.append(f"  {'hf ' + cache:<10}{h['decode_b1_ms_per_token']:>10.4g}"
                         f"{h['decode_b1_times_floor']:>9.3g}{'':>7}{h['tokens_per_s']:>10.4g}")
        if "graphs_vs_eager_identical" in s:
            lines.append(f"  graphs vs eager: {s['graphs_vs_eager_identical']} / "
                         f"{s['graphs_vs_eager_requests']} answers identical")
    return "\n".join(lines)
