"""Read a llama.cpp GGUF checkpoint: its metadata, a :class:`ModelConfig`, dequantized weights.

A GGUF file (llama.cpp's format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) is a
header of typed key/value metadata (``llama.block_count``, ``tokenizer.ggml.tokens`` …) followed
by the tensors, each stored in a GGML type. The block types this module dequantizes itself, in
PyTorch, one line each (chapter 03 teaches the same group-wise idea)::

    Q8_0  blocks of 32: fp16 scale d, 32 int8 q            x = d · q            (34 B / 32 w)
    Q4_0  blocks of 32: fp16 d, 32 4-bit q (two per byte)  x = d · (q − 8)      (18 B / 32 w)
    Q4_1  blocks of 32: fp16 d, fp16 m, 32 4-bit q         x = d · q + m        (20 B / 32 w)

A 4-bit block packs element j in the low nibble of byte j and element j + 16 in the high nibble.
F32 / F16 / BF16 are read as they are. Every other type the ``gguf`` package can dequantize
(Q5_0, Q5_1, the K-quants Q2_K … Q6_K, the IQ types) goes through its NumPy reference
(``gguf.quants.dequantize``); a type it cannot read gives a ``ValueError`` naming tensor and type.

Tensor names follow llama.cpp (``token_embd``, ``blk.N.attn_q`` …, :data:`GGUF_NAMES`). The
``llama`` architecture's converter permutes the rows of ``attn_q`` / ``attn_k`` so that rotary
positions rotate adjacent pairs (x_2i, x_2i+1) — the layout :func:`llminfra.model.apply_rotary`
already uses, so those weights load as they are; ``qwen2`` files keep Hugging Face's
rotate-half layout, which :func:`rotate_half_to_interleaved` converts. Taught in chapter 03.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from llminfra.model.config import ModelConfig

#: :class:`llminfra.model.Transformer` parameter name -> llama.cpp tensor name (blocks: per layer)
GGUF_NAMES = {"tok_embeddings.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
              "output.weight": "output.weight"}
GGUF_BLOCK_NAMES = {"attention.wq": "attn_q", "attention.wk": "attn_k", "attention.wv": "attn_v",
                    "attention.wo": "attn_output", "feed_forward.w1": "ffn_gate",
                    "feed_forward.w2": "ffn_down", "feed_forward.w3": "ffn_up",
                    "attention_norm": "attn_norm", "ffn_norm": "ffn_norm"}
#: architectures (``general.architecture``) this loader builds; ``qwen2`` adds q/k/v biases
ARCHITECTURES = ("llama", "mistral", "qwen2")
#: ``tokenizer.ggml.token_type`` of a byte token (``<0x41>``) in llama.cpp's vocabularies
BYTE_TOKEN = 6
#: block types dequantized here, in PyTorch
OWN_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


def gguf_name(name: str) -> str:
    """llama.cpp's tensor name for a parameter name of :class:`llminfra.model.Transformer`
    (``layers.3.attention.wq.weight`` -> ``blk.3.attn_q.weight``)."""
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    parts = name.split(".")
    if parts[0] == "layers":
        stem = ".".join(parts[2:-1])
        return f"blk.{parts[1]}.{GGUF_BLOCK_NAMES.get(stem, stem)}.{parts[-1]}"
    return name


def rotate_half_to_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of a q or k projection (weight ``(H·d, dim)`` or bias ``(H·d,)``) from
    Hugging Face's rotate-half rotary layout (pairs (i, i + d/2)) to the interleaved one (pairs
    (2i, 2i+1)): within each head, row i goes to 2i and row i + d/2 to 2i + 1 — the permutation
    llama.cpp's converter applies to Llama checkpoints."""
    rows = w.shape[0]
    return (w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:])
             .transpose(1, 2).reshape(w.shape))


# ------------------------------------------------------------------------- dequantization
def _f16(raw: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 from byte columns ``(n, 2)`` -> float32 ``(n, 1)``."""
    return raw.contiguous().view(torch.float16).float()


def _nibbles(raw: torch.Tensor) -> torch.Tensor:
    """16 packed bytes per block ``(n, 16)`` -> 32 4-bit values ``(n, 32)``: low nibbles are
    elements 0..15, high nibbles 16..31."""
    return torch.cat((raw & 0x0F, raw >> 4), dim=1).float()


def dequantize_blocks(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """Bytes of whole 32-weight blocks ``(n_blocks, block_bytes)`` uint8 -> float32 ``(n_blocks,
    32)`` for ``qtype`` in ``Q8_0``, ``Q4_0``, ``Q4_1`` (module docstring)."""
    if qtype == "Q8_0":
        return _f16(raw[:, :2]) * raw[:, 2:].contiguous().view(torch.int8).float()
    if qtype == "Q4_0":
        return _f16(raw[:, :2]) * (_nibbles(raw[:, 2:]) - 8)
    if qtype == "Q4_1":
        return _f16(raw[:, :2]) * _nibbles(raw[:, 4:]) + _f16(raw[:, 2:4])
    raise ValueError(f"dequantize_blocks handles Q8_0, Q4_0, Q4_1; got {qtype!r}")


def dequantize_tensor(data: np.ndarray, qtype: str, shape: tuple[int, ...],
                      name: str = "tensor") -> torch.Tensor:
    """A GGUF tensor's stored data -> float32 tensor of ``shape`` (PyTorch order: rows first).
    ``ValueError`` naming the tensor for a type that cannot be dequantized."""
    import gguf

    if qtype in ("F32", "F16"):
        return torch.from_numpy(np.array(data, dtype=np.float32)).reshape(shape)
    if qtype == "BF16":
        raw = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).copy())
        return raw.view(torch.bfloat16).float().reshape(shape)
    if qtype in ("Q8_0", "Q4_0", "Q4_1"):
        block_bytes = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[qtype]
        raw = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).copy())
        return dequantize_blocks(raw.reshape(-1, block_bytes), qtype).reshape(shape)
    try:
        values = gguf.quants.dequantize(np.asarray(data), gguf.GGMLQuantizationType[qtype])
    except (NotImplementedError, KeyError) as err:
        raise ValueError(f"tensor {name!r} has GGML type {qtype}, which cannot be dequantized "
                         f"(here: {', '.join(OWN_TYPES)}; others through the gguf package)"
                         ) from err
    return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(shape)


# ------------------------------------------------------------------------- the file
#: GGUF metadata value types with a fixed width: type id -> NumPy dtype (little-endian)
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
            10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Reads GGUF's little-endian header fields from a byte buffer, front to back."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path} is truncated: its header needs byte "
                             f"{self.pos + n:,} of a {len(self.buf):,}-byte file")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, kind: int):
        dtype = np.dtype(_SCALARS[kind])
        return np.frombuffer(self.take(dtype.itemsize), dtype)[0].item()

    def string(self) -> str:
        return bytes(self.take(self.scalar(10))).decode("utf-8")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar(4), self.scalar(10)
            if item == _STRING:
                return [self.string() for _ in range(count)]
            dtype = np.dtype(_SCALARS[item])
            return np.frombuffer(self.take(dtype.itemsize * count), dtype).tolist()
        if kind not in _SCALARS:
            raise ValueError(f"{self.path}: unknown GGUF value type {kind} at byte {self.pos}")
        return self.scalar(kind)


def _f32(value) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99999975e-06)."""
    return float(str(np.float32(value)))


class GGUFFile:
    """One GGUF file: ``metadata`` (key -> value, arrays as lists), ``tensor_info`` (name ->
    ``(type, shape)``), :meth:`config`, :meth:`tensor` and :meth:`state_dict`.

    The header (magic ``GGUF``, version, counts, key/value pairs, tensor infos) is parsed here
    with NumPy, in well under a second (the ``gguf`` package's reader takes tens of seconds on a
    49,152-token vocabulary); tensor data is memory-mapped and read on demand. Type names and
    block sizes come from the ``gguf`` package. ``ValueError`` naming the file for a file that
    is not GGUF or is cut short.
    """

    def __init__(self, path: str | Path):
        import gguf

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file {self.path} not found")
        size = self.path.stat().st_size
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r") if size else b""
        cur = _Cursor(memoryview(self._data), self.path)
        if size < 4 or bytes(cur.take(4)) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file (no 'GGUF' magic)")
        version = cur.scalar(4)
        if version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (2, 3)")
        n_tensors, n_kv = cur.scalar(10), cur.scalar(10)
        self.metadata = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar(4))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.scalar(10) for _ in range(cur.scalar(4))]
            kind, offset = cur.scalar(4), cur.scalar(10)
            try:
                qtype = gguf.GGMLQuantizationType(kind)
            except ValueError as err:
                raise ValueError(f"{self.path}: tensor {name!r} has unknown GGML type {kind}"
                                 ) from err
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            n = int(np.prod(dims)) if dims else 1
            infos.append((name, qtype.name, tuple(reversed(dims)), offset,
                          n // block * block_bytes))
        align = int(self.metadata.get("general.alignment", 32))
        start = -(-cur.pos // align) * align
        self.tensor_info, self._where = {}, {}
        for name, qtype, shape, offset, nbytes in infos:
            end = start + offset + nbytes
            if end > size:
                raise ValueError(f"{self.path} is truncated: tensor {name!r} ends at byte "
                                 f"{end:,} of a {size:,}-byte file")
            self.tensor_info[name] = (qtype, shape)
            self._where[name] = (start + offset, nbytes)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def _key(self, field: str, default=None):
        key = f"{self.architecture}.{field}"
        if key not in self.metadata:
            if default is not None:
                return default
            raise ValueError(f"{self.path}: metadata field {key!r} is missing")
        return self.metadata[key]

    def config(self) -> ModelConfig:
        """The :class:`ModelConfig` this file describes (``ValueError`` naming the field for an
        unsupported architecture or a missing field)."""
        arch = self.architecture
        if arch not in ARCHITECTURES:
            raise ValueError(f"{self.path}: general.architecture {arch!r} is not supported; "
                             f"supported: {', '.join(ARCHITECTURES)}")
        if "rope_freqs.weight" in self.tensor_info or f"{arch}.rope.scaling.type" in self.metadata:
            raise ValueError(f"{self.path}: rope scaling in a GGUF file (rope_freqs / "
                             f"{arch}.rope.scaling.type) is not supported; load the Hugging "
                             f"Face folder instead")
        n_heads = int(self._key("attention.head_count"))
        dim = int(self._key("embedding_length"))
        if int(self._key("rope.dimension_count", dim // n_heads)) != dim // n_heads:
            raise ValueError(f"{self.path}: {arch}.rope.dimension_count differs from head_dim "
                             f"{dim // n_heads} (partial rotary is not supported)")
        vocab = self.metadata.get(f"{arch}.vocab_size") or len(
            self.metadata.get("tokenizer.ggml.tokens") or [])
        if not vocab:
            raise ValueError(f"{self.path}: no {arch}.vocab_size and no tokenizer.ggml.tokens")
        return ModelConfig(
            vocab_size=int(vocab), dim=dim, n_layers=int(self._key("block_count")),
            n_heads=n_heads, n_kv_heads=int(self._key("attention.head_count_kv", n_heads)),
            ffn_dim=int(self._key("feed_forward_length")),
            max_seq_len=int(self._key("context_length")),
            rope_theta=_f32(self._key("rope.freq_base", 10000.0)),
            norm_eps=_f32(self._key("attention.layer_norm_rms_epsilon")),
            tie_embeddings="output.weight" not in self.tensor_info,
            qkv_bias="blk.0.attn_q.bias" in self.tensor_info)

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor called ``name`` (llama.cpp's name), dequantized to float32."""
        if name not in self.tensor_info:
            raise ValueError(f"{self.path}: tensor {name!r} is missing")
        qtype, shape = self.tensor_info[name]
        begin, nbytes = self._where[name]
        raw = self._data[begin:begin + nbytes]
        if qtype in ("F32", "F16"):
            raw = raw.view(np.float32 if qtype == "F32" else np.float16)
        elif qtype not in OWN_TYPES:  # the gguf package wants rows of whole blocks
            raw = raw.reshape(int(np.prod(shape[:-1])) if len(shape) > 1 else 1, -1)
        try:
            return dequantize_tensor(raw, qtype, shape, name)
        except ValueError as err:
            raise ValueError(f"{self.path}: {err}") from err

    def state_dict(self, config: ModelConfig, param_shapes: dict[str, tuple]) -> dict:
        """Parameter name -> float32 tensor for a model of ``config`` whose parameters have
        ``param_shapes``; ``ValueError`` naming the tensor for a missing one or a wrong shape."""
        rotate_half = self.architecture == "qwen2"  # llama.cpp keeps HF's layout for qwen2
        out = {}
        for name, shape in param_shapes.items():
            if name == "output.weight" and config.tie_embeddings:
                continue
            w = self.tensor(gguf_name(name))
            if tuple(w.shape) != tuple(shape):
                raise ValueError(f"{self.path}: tensor {gguf_name(name)!r} has shape "
                                 f"{tuple(w.shape)}, the config needs {tuple(shape)}")
            if rotate_half and name.split(".")[-2] in ("wq", "wk"):
                heads = config.n_heads if name.split(".")[-2] == "wq" else config.n_kv_heads
                w = rotate_half_to_interleaved(w, heads)
            out[name] = w
        return out
