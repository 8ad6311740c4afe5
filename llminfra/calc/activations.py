"""Activation memory: the transient tensors of a forward pass in serving, and what training
stores for the backward pass. Bytes, as the rest of :mod:`llminfra.calc.memory`, which adds
them to the weights, the KV cache and the optimizer state.

* inference: layers run one after another, so only one layer's tensors are alive at once —
  the live tensors of one layer for the tokens in flight, plus the last position's logits in
  fp32 (:func:`activation_bytes_inference`);
* training: Korthikanti et al., 2022 (arXiv:2205.05198), eq. 1 per layer, with or without the
  attention matrix (FlashAttention) and with full activation checkpointing
  (:func:`activation_bytes_training`).

Rules worked by hand in ``tests/test_memory.py``. Taught in chapters 01 and 02.
"""

from __future__ import annotations

from llminfra.specs.formats import dtype_bytes
from llminfra.specs.models import ModelSpec, get_model
from llminfra.validate import positive_int


def activation_bytes_inference(model: str | ModelSpec, batch: int = 1, tokens: int = 1,
                               dtype: str = "bf16", attention: str = "flash") -> int:
    """Peak transient activations of one forward pass over ``batch · tokens`` new tokens.

    Layers run one after another, so only one layer's tensors are alive at once:
    residual and normed input (2h), q, k, v (h + 2·kv_dim), attention output (h) and the MLP's
    intermediate tensors (3·I when gated: gate, up, their product; 2·I when plain), all per
    token in ``dtype``; plus ``heads · tokens²`` scores per sequence when ``attention="naive"``
    (FlashAttention never forms them) and the last position's logits in fp32 (4 · vocab bytes
    per sequence, as serving engines compute only those). Wider heads (Qwen3's explicit
    head_dim) and latent attention use their own q / k / v / output widths; a mixture-of-experts
    layer with ``moe_intermediate_size`` runs ``experts_per_token + num_shared_experts`` expert
    MLPs per token, so its MLP width is that many ``moe_intermediate_size`` (the widest of the
    dense and MoE layers counts). Mixtral (no ``moe_intermediate_size``) keeps the one-MLP
    width it always had here.
    """
    spec = get_model(model)
    batch, tokens = positive_int("batch", batch), positive_int("tokens", tokens)
    if attention not in ("flash", "naive"):
        raise ValueError(f"attention must be 'flash' or 'naive', got {attention!r}")
    b = dtype_bytes(dtype)
    h, H = spec.hidden_size, spec.num_heads
    q, out = H * spec.head_dim, H * spec.value_head_dim
    k_v = (H * (spec.head_dim + spec.value_head_dim) if spec.is_mla
           else 2 * spec.num_kv_heads * spec.head_dim)
    i = spec.intermediate_size if spec.num_moe_layers < spec.num_layers else 0
    if spec.num_moe_layers and spec.moe_intermediate_size is not None:
        i = max(i, (spec.experts_per_token + spec.num_shared_experts) * spec.moe_intermediate_size)
    elif spec.num_moe_layers:
        i = spec.intermediate_size
    per_token = 2 * h + q + k_v + out + (3 if spec.mlp == "gated" else 2) * i
    total = batch * tokens * per_token * b
    if attention == "naive":
        total += batch * spec.num_heads * tokens * tokens * b
    total += batch * spec.vocab_size * 4
    return int(total)


def activation_bytes_training(model: str | ModelSpec, batch: int, seq_len: int,
                              checkpointing: bool = False, flash: bool = True) -> int:
    """Activations stored for the backward pass in 16-bit training.

    Korthikanti et al., 2022 (arXiv:2205.05198), eq. 1: per layer ``s·b·h·(34 + 5·a·s/h)``
    bytes for a GPT block (4h MLP, dropout). The ``5·a·s²·b`` term is the attention matrix
    (scores, softmax, dropout mask), which FlashAttention does not store (``flash=True``).
    Full activation checkpointing stores only each layer's input (``2·s·b·h``) and recomputes
    one layer at a time during backward (that layer's full activations).
    """
    spec = get_model(model)
    b, s = positive_int("batch", batch), positive_int("seq_len", seq_len)
    h, a = spec.hidden_size, spec.num_heads
    per_layer = s * b * h * 34 + (0 if flash else 5 * a * s * s * b)
    if checkpointing:
        return int(spec.num_layers * 2 * s * b * h + per_layer)
    return int(spec.num_layers * per_layer)
