"""``bench gpu``'s ``memory`` suite: the memory model of chapter 02 against what CUDA allocates.

A Llama-3-8B-shaped model *of the package* (:class:`~llminfra.model.Transformer`, random bf16
weights), a paged KV cache for ``batch`` × ``context`` tokens, and one prefill of all of it
(the engine's ragged step; attention through PyTorch's fused SDPA, as the model's FlashAttention
assumption says; logits of each sequence's last token only). Measured with
``torch.cuda.memory_allocated`` / ``max_memory_allocated`` against
:func:`llminfra.calc.memory.inference_memory` for the same shape: weights, KV cache and the
prefill's peak. Chapter 02 (the model), chapter 08 (the GPU run).
"""

from __future__ import annotations

import torch

from llminfra.bench.timing import environment
from llminfra.model import ModelConfig, Transformer
from llminfra.specs import get_model
from llminfra.attention.reference import sdpa_attention
from llminfra.calc.memory import inference_memory
from llminfra.kvcache import PagedKVCache

#: the shape and sizes measured
MODEL, BATCH, CONTEXT, BLOCK = "llama-3-8b", 8, 4096, 16


def config_of(name: str):
    """The package's :class:`~llminfra.model.ModelConfig` for a dense preset of the specs."""
    s = get_model(name)
    return ModelConfig(vocab_size=s.vocab_size, dim=s.hidden_size, n_layers=s.num_layers,
                       n_heads=s.num_heads, n_kv_heads=s.num_kv_heads,
                       ffn_dim=s.intermediate_size, max_seq_len=s.max_positions,
                       rope_theta=500000.0, tie_embeddings=s.tied_embeddings)


def run_gpu(batch: int = BATCH, context: int = CONTEXT) -> dict:
    """Weights, KV cache and prefill peak, measured and predicted. ``RuntimeError`` without
    CUDA (never a silent skip)."""
    if not torch.cuda.is_available():
        raise RuntimeError("memory.run_gpu needs a CUDA device; none is visible to torch")

    device = torch.device("cuda")
    config = config_of(MODEL)
    predicted = inference_memory(config.to_spec(MODEL), "bf16", context=context, batch=batch)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.device("meta"):
        model = Transformer(config)
    model = model.to_empty(device=device).to(torch.bfloat16).eval()
    g = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=g)
    weights = torch.cuda.memory_allocated() - base
    blocks = batch * -(-context // BLOCK)
    cache = PagedKVCache.for_model(config, blocks, BLOCK, torch.bfloat16, device)
    kv = torch.cuda.memory_allocated() - base - weights
    seqs = [cache.add_sequence() for _ in range(batch)]
    tokens = torch.randint(0, config.vocab_size, (batch * context,), device=device)
    meta = cache.prepare_step(seqs, [context] * batch)
    meta = meta.with_logits_indices(meta.last_token_indices())
    model.set_attention(lambda q, k, v, causal=False: sdpa_attention(q, k, v, causal))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        model(tokens, cache, meta=meta)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    scratch = cache.nbytes // blocks                     # the cache's one scratch block
    out = {"environment": environment(), "model": f"{MODEL} shape (llminfra Transformer, "
                                                  f"random bf16)",
           "batch": batch, "context": context,
           "weights_measured": weights, "weights_predicted": predicted.weight_bytes,
           "weights_ratio": weights / predicted.weight_bytes,
           "kv_measured": kv, "kv_predicted": predicted.kv_bytes,
           "kv_scratch_block_bytes": scratch,
           "kv_ratio": (kv - scratch) / predicted.kv_bytes,
           "peak_measured": peak, "predicted_total": predicted.total_bytes,
           "activation_predicted": predicted.activation_bytes,
           "activation_measured_peak_minus_w_kv": peak - weights - kv,
           "peak_ratio": peak / predicted.total_bytes}
    del model, cache
    torch.cuda.empty_cache()
    return out


def run(quick: bool = False) -> dict:
    """This suite measures CUDA's allocator: on a machine without CUDA it says so."""
    raise RuntimeError("bench memory measures CUDA allocations: run `python -m llminfra bench "
                       "gpu` on a machine with a CUDA GPU")
