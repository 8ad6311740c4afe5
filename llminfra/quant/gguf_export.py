"""The tiny model written to a GGUF file (the format of llama.cpp) and read back.

GGUF holds a header of key/value metadata (architecture, sizes, rope base, norm epsilon …) and
the tensors, each with its GGML type. ``Q8_0`` stores blocks of 32 weights as 32 int8 values and
one fp16 scale (34 bytes per 32 weights = 1.0625 bytes/weight); ``Q4_0`` stores 32 4-bit values
and one fp16 scale (18 bytes per 32 = 0.5625 bytes/weight) — the same absmax-per-group idea as
:mod:`llminfra.quant.rtn`, encoded by the ``gguf`` package (``gguf.quants``). Tensors whose rows
are not a whole number of 32-blocks (the tiny model's ``w2`` has 688 inputs) and 1-D norms are
written as F16 / F32, as llama.cpp's converter does. Names follow llama.cpp (``blk.N.attn_q``…).
The tokenizer goes in too, so llama.cpp runs the file: the byte vocabulary of
:class:`llminfra.model.ByteTokenizer` as llama.cpp's ``llama`` (SentencePiece-style) model with
the 256 byte tokens ``<0x00>`` … ``<0xFF>`` of type BYTE, zero scores, no BOS / EOS and no space
prefix (give llama.cpp the prompt as token ids: its SentencePiece-style tokenizer writes a space
as "▁", U+2581, which a byte vocabulary spells as three bytes). No row permutation of ``wq`` / ``wk`` is needed: llama.cpp's converter permutes Hugging
Face checkpoints into the interleaved rotary layout (pairs (x_2i, x_2i+1)) that
:func:`llminfra.model.apply_rotary` already uses. :func:`llminfra.model.load_pretrained` reads the
file back (chapter 03).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from llminfra.model.gguf_file import BYTE_TOKEN, gguf_name

QTYPES = ("Q8_0", "Q4_0", "F16", "F32")


def export_gguf(model, path: str | Path, qtype: str = "Q8_0") -> Path:
    """Write ``model`` (config + every parameter) to ``path``; the blocks' linear weights in
    ``qtype`` where their rows split into 32-blocks, F16 otherwise; norms F32."""
    import gguf
    if qtype not in QTYPES:
        raise KeyError(f"unknown GGUF type {qtype!r}; allowed: {QTYPES}")
    if getattr(model.config, "num_experts", 1) > 1:
        raise ValueError(f"only dense models export; this one has "
                         f"num_experts={model.config.num_experts}")
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
    _add_byte_vocabulary(w, c.vocab_size)
    for name, p in model.state_dict().items():
        _add_tensor(w, gguf_name(name), p, qtype if name.startswith("layers.") else "F16")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _add_byte_vocabulary(writer, vocab_size: int) -> None:
    """The byte tokenizer as llama.cpp reads it: token i is ``<0xII>``, type BYTE."""
    if vocab_size != 256:
        raise ValueError(f"export_gguf writes the byte tokenizer's 256 tokens; this model has a "
                         f"vocabulary of {vocab_size}")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([f"<0x{i:02X}>" for i in range(256)])
    writer.add_token_scores([0.0] * 256)
    writer.add_token_types([BYTE_TOKEN] * 256)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)


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
