"""The memory model: weights, KV cache, activations, training state, and what fits on a GPU.

All results are bytes (ints where exact). Say GB (1e9) or GiB (2**30) when printing them:
:func:`gb` and :func:`gib` convert.

Rules, each worked by hand in ``tests/test_memory.py``:

* weights: ``params · bytes(dtype)``; for quantized dtypes (fp8 / int8 / int4 / nf4) only the
  blocks' linear weights are quantized, each group of ``group_size`` weights adds one fp16 scale
  (and one zero point for asymmetric schemes), and the rest stays in 16 bits;
* KV cache per token: ``2 · layers · kv_heads · head_dim · bytes(kv_dtype)`` (K and V);
  for multi-head latent attention ``layers · (kv_lora_rank + qk_rope_head_dim) · bytes``;
  a sliding window bounds the tokens held, and quantized KV may add group scales
  (:mod:`llminfra.calc.kv_layout`);
* inference activations: the live tensors of one layer for the tokens in flight, plus the
  last position's logits in fp32; training activations: Korthikanti et al., 2022
  (arXiv:2205.05198), eq. 1 per layer (both in :mod:`llminfra.calc.activations`);
* training state: mixed-precision AdamW keeps 16 bytes per parameter (Rajbhandari et al., 2019,
  ZeRO, arXiv:1910.02054, §3.1): 16-bit weights (2) and gradients (2), fp32 master weights (4)
  and two fp32 moments (8);
* what fits: :func:`kv_budget` is the one answer to "how much is left for the KV cache beside
  the weights, and how many sequences fit" (:func:`fits`, :func:`max_batch`, the CLI, the
  memory widget and ``bench kvcache`` all use it).

The FLOPs and bytes of one forward step, built on these rules, are in :mod:`llminfra.calc.step`.

Taught in chapters 01, 02, 04 and 08.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from llminfra.calc.activations import activation_bytes_inference, activation_bytes_training
from llminfra.calc.kv_layout import (kv_bytes_per_token_layer, kv_share_per_rank,
                                     kv_tokens_held)
from llminfra.calc.params import (active_param_count, linear_shapes, linear_weight_count,
                                  param_count)
from llminfra.specs.formats import DTYPE_BYTES, dtype_bytes
from llminfra.specs.gpus import get_gpu
from llminfra.specs.models import ModelSpec, get_model
from llminfra.validate import positive_int

#: dtypes stored with per-group scales when used for weights
QUANTIZED = ("fp8", "fp8-e4m3", "fp8-e5m2", "int8", "int4", "nf4")

#: share of GPU memory held back for the runtime (CUDA context, allocator, graphs):
#: vLLM's default ``gpu_memory_utilization=0.9`` (vLLM engine arguments documentation)
DEFAULT_RESERVE_FRACTION = 0.10

#: training optimizer layouts: bytes per parameter for (weights, gradients, master, moments)
TRAINING_RECIPES = {
    "adamw-mixed": (2, 2, 4, 8),   # ZeRO §3.1: 2 + 2 + 12 = 16 bytes per parameter
    "adamw-8bit": (2, 2, 4, 2),    # 8-bit moments (Dettmers et al., 2021, arXiv:2110.02861)
    "adamw-no-master": (2, 2, 0, 8),  # pure bf16 weights, fp32 moments
    "adamw-fp32": (4, 4, 0, 8),    # everything in fp32
    "sgd-mixed": (2, 2, 4, 0),     # no moments (momentum-free SGD)
}


def gb(n_bytes: float) -> float:
    """Bytes to GB (1e9 bytes)."""
    return n_bytes / 1e9


def gib(n_bytes: float) -> float:
    """Bytes to GiB (2**30 bytes)."""
    return n_bytes / 2**30


def _dtype_key(dtype: str) -> str:
    """``dtype`` as the memory model spells it (``" BF16"`` -> ``"bf16"``); ``KeyError`` lists
    the allowed dtypes."""
    dtype_bytes(dtype)
    return str(dtype).strip().lower()


def _compute_dtype(dtype: str) -> str:
    """The dtype the matmuls run in: ``dtype`` itself for 16/32-bit weights, ``bf16`` for
    quantized ones (and the default KV-cache dtype)."""
    key = _dtype_key(dtype)
    return key if key in ("fp32", "fp16", "bf16") else "bf16"


def _check_context(spec: ModelSpec, context) -> int:
    context = positive_int("context", context)
    if spec.max_positions is not None and context > spec.max_positions:
        raise ValueError(f"context {context} exceeds {spec.name}'s max_position_embeddings "
                         f"{spec.max_positions}; allowed: 1..{spec.max_positions}")
    return context


def weight_bytes(model: str | ModelSpec, dtype: str = "bf16", group_size: int | None = 128,
                 zero_point: bool = False, rest_dtype: str = "bf16") -> int:
    """Bytes of the weights stored in ``dtype``.

    For 16/32-bit dtypes: ``params · bytes``. For quantized dtypes the blocks' linear weights
    take ``bytes(dtype)`` each plus, per group of ``group_size`` weights (``None`` = one group per
    output row), a 2-byte scale (and a 2-byte zero point if ``zero_point``); embeddings,
    lm_head, norms and biases stay in ``rest_dtype``.
    """
    spec = get_model(model)
    b = dtype_bytes(dtype)
    total = param_count(spec)
    if _dtype_key(dtype) not in QUANTIZED:
        return int(total * b)
    if group_size is not None:
        positive_int("group_size", group_size)
    linear = linear_weight_count(spec)
    if group_size is None:  # per output channel: one group per row of each matrix
        groups = sum(rows * count for rows, _, count in linear_shapes(spec))
    else:
        groups = -(-linear // group_size)
    overhead = groups * (2 + (2 if zero_point else 0))
    return int(linear * b + overhead + (total - linear) * dtype_bytes(rest_dtype))


def kv_bytes_per_token(model: str | ModelSpec, kv_dtype: str = "bf16",
                       kv_group_size: int | None = None) -> int:
    """``2 · layers · kv_heads · head_dim · bytes``: one token's keys and values, all layers;
    multi-head latent attention: ``layers · (kv_lora_rank + qk_rope_head_dim) · bytes``
    (DeepSeek-V2, arXiv:2405.04434, §2.1 and Table 1). ``kv_group_size``: one fp16 scale per
    group of that many elements (quantized KV only; see :mod:`llminfra.calc.kv_layout`).

    Llama-2-7B in bf16: 2 · 32 · 32 · 128 · 2 = 524,288 bytes (512 KiB); DeepSeek-V3 in bf16:
    61 · (512 + 64) · 2 = 70,272 bytes. Taught in chapters 02 and 11.
    """
    spec = get_model(model)
    return spec.num_layers * kv_bytes_per_token_layer(spec, kv_dtype, kv_group_size)


def kv_bytes(model: str | ModelSpec, context: int, batch: int = 1, kv_dtype: str = "bf16",
             sliding_window: bool = False, kv_group_size: int | None = None) -> int:
    """KV cache of ``batch`` sequences of ``context`` tokens each:
    ``kv_bytes_per_token · tokens_held · batch``, where ``tokens_held = min(context, W)`` for a
    model with a sliding window ``W`` when ``sliding_window`` (a rolling-buffer cache that
    evicts what left the window, Mistral-7B, arXiv:2310.06825, §2), else ``context``.
    Mistral-7B, bf16, 32,768 tokens: 131,072 · 4,096 = 0.537 GB windowed, 4.29 GB without."""
    spec = get_model(model)
    context = _check_context(spec, context)
    held = kv_tokens_held(spec, context, sliding_window)
    return kv_bytes_per_token(spec, kv_dtype, kv_group_size) * held * positive_int("batch", batch)


def training_memory(model: str | ModelSpec, batch: int = 1, seq_len: int = 2048,
                    recipe: str = "adamw-mixed", checkpointing: bool = False,
                    flash: bool = True) -> dict[str, int]:
    """Memory of full training with ``recipe`` (see :data:`TRAINING_RECIPES`), in bytes by part:
    ``weights``, ``gradients``, ``master_weights``, ``optimizer_states``, ``activations``,
    ``total``. Mixed-precision AdamW costs 16 bytes per parameter before activations."""
    spec = get_model(model)
    if recipe not in TRAINING_RECIPES:
        raise KeyError(f"unknown training recipe {recipe!r}; allowed: {', '.join(TRAINING_RECIPES)}")
    P = param_count(spec)
    w, g, m, o = TRAINING_RECIPES[recipe]
    parts = {"weights": w * P, "gradients": g * P, "master_weights": m * P,
             "optimizer_states": o * P,
             "activations": activation_bytes_training(spec, batch, seq_len, checkpointing, flash)}
    parts["total"] = sum(parts.values())
    return parts


@dataclass(frozen=True)
class InferenceMemory:
    """What serving ``batch`` sequences of ``context`` tokens needs, in bytes."""

    model: str
    dtype: str
    kv_dtype: str
    context: int
    batch: int
    params: int
    active_params: int
    weight_bytes: int
    kv_bytes_per_token: int
    kv_bytes: int
    activation_bytes: int
    attention: str = "MHA"
    sliding_window: int | None = None
    kv_tokens_per_sequence: int = 0
    kv_bytes_full_attention: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def inference_memory(model: str | ModelSpec, dtype: str = "bf16", kv_dtype: str | None = None,
                     context: int = 2048, batch: int = 1, group_size: int | None = 128,
                     prefill_chunk: int | None = None, sliding_window: bool = False,
                     kv_group_size: int | None = None) -> InferenceMemory:
    """Weights + KV cache + activations for serving. ``kv_dtype`` defaults to the 16-bit
    compute dtype (``bf16`` for quantized weights). Activations are for a prefill of
    ``prefill_chunk`` tokens per sequence (default: the whole context) with FlashAttention.
    Weights count every expert of a mixture-of-experts (all must be resident); ``params`` and
    ``active_params`` say how many exist and how many one token uses. ``sliding_window`` and
    ``kv_group_size`` as in :func:`kv_bytes`; ``kv_bytes_full_attention`` is the cache without
    the window (equal to ``kv_bytes`` when none applies)."""
    spec = get_model(model)
    for name, d in (("dtype", dtype), ("kv_dtype", kv_dtype)):
        if d is not None and str(d).strip().lower() not in DTYPE_BYTES:
            raise KeyError(f"unknown {name} {d!r}; allowed: {', '.join(DTYPE_BYTES)}")
    compute = _compute_dtype(dtype)
    if kv_dtype is None:
        kv_dtype = compute
    context = _check_context(spec, context)
    batch = positive_int("batch", batch)
    chunk = context if prefill_chunk is None else min(positive_int("prefill_chunk", prefill_chunk), context)
    return InferenceMemory(
        model=spec.name, dtype=dtype, kv_dtype=kv_dtype, context=context, batch=batch,
        params=param_count(spec), active_params=active_param_count(spec),
        weight_bytes=weight_bytes(spec, dtype, group_size),
        kv_bytes_per_token=kv_bytes_per_token(spec, kv_dtype, kv_group_size),
        kv_bytes=kv_bytes(spec, context, batch, kv_dtype, sliding_window, kv_group_size),
        activation_bytes=activation_bytes_inference(spec, batch, chunk, compute),
        attention=spec.attention, sliding_window=spec.sliding_window,
        kv_tokens_per_sequence=kv_tokens_held(spec, context, sliding_window),
        kv_bytes_full_attention=kv_bytes(spec, context, batch, kv_dtype, False, kv_group_size))


@dataclass(frozen=True)
class KVBudget:
    """What is left for the KV cache beside the weights, in bytes, tokens and sequences
    (see :func:`kv_budget`)."""

    model: str
    gpu: str
    num_gpus: int
    dtype: str
    kv_dtype: str
    context: int
    reserve_fraction: float
    gpu_memory_bytes: int
    gpu_memory_source: str
    usable_bytes: int
    weight_bytes: int
    activation_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int
    kv_budget_tokens: int
    max_sequences: int

    def to_dict(self) -> dict:
        return asdict(self)


def kv_budget(model: str | ModelSpec, gpu, dtype: str = "bf16", kv_dtype: str | None = None,
              context: int = 2048, reserve_fraction: float = DEFAULT_RESERVE_FRACTION,
              num_gpus: int = 1, sliding_window: bool = False) -> KVBudget:
    """The one answer to "how much is left for the KV cache beside the weights, and how many
    sequences fit", as vLLM sizes its cache (Kwon et al., 2023, arXiv:2309.06180, §4.3 and
    ``gpu_memory_utilization``):

    * ``usable = memory_bytes · num_gpus · (1 - reserve_fraction)`` — the card's memory by the
      catalog's one rule (:attr:`llminfra.specs.GPUSpec.memory_bytes`);
    * ``kv_budget_bytes = usable - weights - activations``, the activations being the peak of
      ONE forward pass over a ``context``-token prompt (vLLM measures this peak in a profiling
      run; prompts are prefilled one chunk at a time, so it does not grow with the batch);
    * ``kv_budget_tokens = kv_budget_bytes // (kv_bytes_per_token · r)``;
      ``max_sequences = kv_budget_tokens // context``. On ``n = num_gpus`` GPUs (tensor
      parallel) each holds ``ceil(H_kv / n)`` of the KV heads — a whole head when there are
      fewer heads than GPUs, which vLLM replicates — so a token costs ``r = ceil(H_kv / n) · n /
      H_kv`` times its KV bytes (r = 1 when n divides H_kv). Multi-head latent attention
      shares its latent across heads, so every GPU keeps all of it: r = n.
    * with ``sliding_window`` a sequence holds ``min(context, W)`` tokens
      (:func:`llminfra.calc.kv_layout.kv_tokens_held`), so ``max_sequences`` divides by that.

    OPT-13B in fp16 on an A100-40GB (40,960 MiB = 42,949,672,960 bytes), 10 % reserve, context
    2048: usable 38,654,705,664; weights 25,706,946,560; activations 2048 · 143,360 + 4 · 50,272
    = 293,802,368; budget 12,653,956,736 bytes = 15,446 tokens of 819,200 bytes = 7 sequences.
    Taught in chapters 02 and 04.
    """
    spec, g = get_model(model), get_gpu(gpu)
    if isinstance(reserve_fraction, bool) or not 0 <= reserve_fraction < 1:
        raise ValueError(f"reserve_fraction must be a number in [0, 1), got {reserve_fraction!r}")
    num_gpus = positive_int("num_gpus", num_gpus)
    one = inference_memory(spec, dtype, kv_dtype, context, batch=1, sliding_window=sliding_window)
    memory = g.memory_bytes * num_gpus
    usable = int(memory * (1 - reserve_fraction))
    left = max(0, usable - one.weight_bytes - one.activation_bytes)
    stored = one.kv_bytes_per_token * kv_share_per_rank(spec, num_gpus) * num_gpus  # replicas
    tokens = int(left // stored)
    return KVBudget(model=spec.name, gpu=g.name, num_gpus=num_gpus, dtype=one.dtype,
                    kv_dtype=one.kv_dtype, context=one.context,
                    reserve_fraction=reserve_fraction, gpu_memory_bytes=int(memory),
                    gpu_memory_source=g.memory_source, usable_bytes=usable,
                    weight_bytes=one.weight_bytes, activation_bytes=one.activation_bytes,
                    kv_budget_bytes=left, kv_bytes_per_token=one.kv_bytes_per_token,
                    kv_budget_tokens=tokens, max_sequences=tokens // one.kv_tokens_per_sequence)


def fits(model: str | ModelSpec, gpu: str, dtype: str = "bf16", kv_dtype: str | None = None,
         context: int = 2048, batch: int = 1, reserve_fraction: float = DEFAULT_RESERVE_FRACTION,
         num_gpus: int = 1, sliding_window: bool = False) -> dict:
    """Whether ``batch`` sequences of ``context`` tokens fit on ``num_gpus`` of ``gpu``: the
    weights, the batch's KV cache and the activations of ONE ``context``-token prefill (see
    :func:`kv_budget`) within ``usable_bytes``; so ``fits`` is exactly
    ``batch <= kv_budget(...).max_sequences``. Returns the keys of :func:`inference_memory`
    (``activation_bytes`` for one prefill) plus ``fits``, ``gpu_memory_bytes``,
    ``gpu_memory_source``, ``usable_bytes``, ``kv_budget_bytes``, ``max_sequences``,
    ``reserve_fraction``, ``gpu``, ``num_gpus``, ``gpu_confidence``."""
    budget = kv_budget(model, gpu, dtype, kv_dtype, context, reserve_fraction, num_gpus,
                       sliding_window)
    est = inference_memory(model, dtype, kv_dtype, context, batch, sliding_window=sliding_window)
    d = est.to_dict()
    d.update(activation_bytes=budget.activation_bytes,
             total_bytes=est.weight_bytes + est.kv_bytes + budget.activation_bytes,
             gpu=budget.gpu, num_gpus=budget.num_gpus,
             gpu_memory_bytes=budget.gpu_memory_bytes,
             gpu_memory_source=budget.gpu_memory_source, usable_bytes=budget.usable_bytes,
             kv_budget_bytes=budget.kv_budget_bytes, max_sequences=budget.max_sequences,
             reserve_fraction=reserve_fraction, gpu_confidence=get_gpu(gpu).confidence)
    d["fits"] = batch <= budget.max_sequences
    return d


def max_batch(model: str | ModelSpec, gpu: str, context: int = 2048, dtype: str = "bf16",
              kv_dtype: str | None = None, reserve_fraction: float = DEFAULT_RESERVE_FRACTION,
              num_gpus: int = 1, sliding_window: bool = False) -> int:
    """The largest batch of ``context``-token sequences that fits (0 if even one does not):
    ``kv_budget(...).max_sequences``, the KV budget in tokens divided by the tokens a sequence
    holds (the context, or ``min(context, W)`` with ``sliding_window``)."""
    return kv_budget(model, gpu, dtype, kv_dtype, context, reserve_fraction,
                     num_gpus, sliding_window).max_sequences
