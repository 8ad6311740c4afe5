"""The tiny model written to a GGUF file (the format of llama.cpp) and read back.

GGUF holds a header of key/value metadata (architecture, sizes, rope base, norm epsilon …) and
the tensors, each with its GGML type. ``Q8_0`` stores blocks of 32 weights as 32 int8 values and
one fp16 scale (34 bytes per 32 weights = 1.0625 bytes/weight); ``Q4_0`` stores 32 4-bit values
and one fp16 scale (18 bytes per 32 = 0.5625 bytes/weight) — the same absmax-per-group idea as
:mod:`llminfra.quant.rtn`, encoded by the ``gguf`` package (``gguf.quants``). Tensors whose rows
are not a whole number of 32-blocks (the tiny model's ``w2`` has 688 inputs) and 1-D norms are
written as F16 / F32, as llama.cpp's converter does. Names follow llama.cpp (``blk.N.attn_q``…).
Not written: a tokenizer, and the row permutation llama.cpp's converter applies to ``wq``/``wk``
for its rotary layout — the file shows what the format holds; it is not meant to be run by
llama.cpp as is. Chapter 03.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

QTYPES = ("Q8_0", "Q4_0", "F16", "F32")

_NAMES = {"tok_embeddings.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
          "output.weight": "output.weight"}
_BLOCK = {"attention.wq": "attn_q", "attention.wk": "attn_k", "attention.wv": "attn_v",
          "attention.wo": "attn_output", "feed_forward.w1": "ffn_gate",
          "feed_forward.w2": "ffn_down", "feed_forward.w3": "ffn_up",
          "attention_norm": "attn_norm", "ffn_norm": "ffn_norm"}


def gguf_name(name: str) -> str:
    """llama.cpp's tensor name for a parameter name of :class:`llminfra.model.Transformer`."""
    if name in _NAMES:
        return _NAMES[name]
    parts = name.split(".")
    if parts[0] == "layers":
        stem = ".".join(parts[2:-1])
        return f"blk.{parts[1]}.{_BLOCK.get(stem, stem)}.{parts[-1]}"
    return name


def export_gguf(model, path: str | Path, qtype: str = "Q8_0") -> Path:
    """Write ``model`` (config + every parameter) to ``path``; the blocks' linear weights in
    ``qtype`` where their rows split into 32-blocks, F16 otherwise; norms F32."""
    import gguf
    if qtype not in QTYPES:
        raise KeyError(f"unknown GGUF type {qtype!r}; allowed: {QTYPES}")
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llminfra-tiny")
    w.add_context_length(c.max_seq_len)
    w.add_embedding_length(c.dim)
    w.add_block_count(c.n_layers)
    w.add_feed_forward_length(c.ffn_dim)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_rope_freq_base(float(c.rope_theta))
    w.add_layer_norm_rms_eps(float(c.norm_eps))
    w.add_vocab_size(c.vocab_size)
    for name, p in model.state_dict().items():
        _add_tensor(w, gguf_name(name), p, qtype if name.startswith("layers.") else "F16")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _add_tensor(writer, name: str, p: torch.Tensor, qtype: str) -> None:
    import gguf
    data = p.detach().float().cpu().numpy()
    if data.ndim == 1:
        writer.add_tensor(name, data.astype(np.float32))
    elif qtype in ("Q8_0", "Q4_0") and data.shape[-1] % 32 == 0:
        t = getattr(gguf.GGMLQuantizationType, qtype)
        writer.add_tensor(name, gguf.quants.quantize(data, t), raw_dtype=t)
    elif qtype == "F32":
        writer.add_tensor(name, data.astype(np.float32))
    else:
        writer.add_tensor(name, data.astype(np.float16))


def read_gguf(path: str | Path) -> tuple[dict, dict[str, dict]]:
    """``(metadata, tensors)``: metadata key -> value (scalars and strings), tensor name ->
    ``{"type", "shape", "nbytes", "values" (dequantized float32 torch tensor)}``."""
    import gguf
    r = gguf.GGUFReader(str(path))
    meta = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or not field.types:
            continue
        if field.types[0] == gguf.GGUFValueType.STRING:
            meta[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        elif field.types[0] != gguf.GGUFValueType.ARRAY:
            meta[key] = field.parts[field.data[0]].tolist()[0]
    tensors = {}
    for t in r.tensors:
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        tensors[t.name] = {"type": t.tensor_type.name, "shape": shape, "nbytes": int(t.n_bytes),
                           "values": torch.from_numpy(np.array(values, dtype=np.float32)).reshape(shape)}
    return meta, tensors


def load_state_dict_from_gguf(model, path: str | Path) -> dict[str, torch.Tensor]:
    """The model's parameter names -> dequantized tensors read back from ``path``."""
    _, tensors = read_gguf(path)
    return {name: tensors[gguf_name(name)]["values"] for name in model.state_dict()}
