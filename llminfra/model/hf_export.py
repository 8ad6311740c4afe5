"""Write a :class:`Transformer` and its :class:`BPETokenizer` as a Hugging Face model folder.

The folder is what ``transformers``' ``from_pretrained`` and vLLM read: ``config.json``
(``LlamaForCausalLM``, or ``Qwen2ForCausalLM`` when q/k/v carry biases), ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` (with the chat template) and
``generation_config.json`` (the stop ids). It is how the course puts the *same weights* in front
of another engine: ``make compare-engines`` exports SmolLM2 this way and serves it with vLLM.

The one transformation is the rotary layout: our q/k rows pair (2i, 2i+1) (interleaved, as
llama.cpp's GGUF files do), Hugging Face's pair (i, i + d/2) (rotate-half);
:func:`interleaved_to_rotate_half` undoes :func:`llminfra.model.gguf_file.rotate_half_to_interleaved`.
``load_pretrained(folder)`` reads the folder back; ``tests/test_pretrained_files.py`` checks
that transformers computes our logits from it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llminfra.model.bpe_tokenizer import BPETokenizer
from llminfra.model.pretrained import hf_name
from llminfra.model.transformer import Transformer

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def interleaved_to_rotate_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder q or k projection rows (weight ``(H·d, dim)`` or bias ``(H·d,)``) from the
    interleaved rotary layout back to Hugging Face's rotate-half one: within each head, row 2i
    goes to i and row 2i + 1 to i + d/2."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
             .transpose(1, 2).reshape(w.shape))


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """``model``'s weights under Hugging Face's Llama names, q/k rows in rotate-half order
    (:func:`interleaved_to_rotate_half`); a tied output matrix is left out (``lm_head`` is the
    embedding). The tensors are the model's own where no reordering was needed."""
    c = model.config
    out = {}
    for name, w in model.state_dict().items():
        if name == "output.weight" and c.tie_embeddings:
            continue
        kind = name.split(".")[-2] if name.startswith("layers.") else ""
        if kind in ("wq", "wk"):
            w = interleaved_to_rotate_half(w, c.n_heads if kind == "wq" else c.n_kv_heads)
        out[hf_name(name)] = w
    return out


def hf_config(model: Transformer, tokenizer: BPETokenizer, dtype: torch.dtype) -> dict:
    """The ``config.json`` of ``model`` (Llama field names; Qwen2 for q/k/v biases)."""
    c = model.config
    kind, arch = ("qwen2", "Qwen2ForCausalLM") if c.qkv_bias else ("llama", "LlamaForCausalLM")
    conf = {
        "architectures": [arch], "model_type": kind, "vocab_size": c.vocab_size,
        "hidden_size": c.dim, "intermediate_size": c.ffn_dim, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.dim // c.n_heads, "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta, "hidden_act": "silu",
        "tie_word_embeddings": c.tie_embeddings, "torch_dtype": _DTYPES[dtype],
        "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
    }
    if c.rope_scaling:
        conf["rope_scaling"] = dict(c.rope_scaling)
    if kind == "llama":
        conf.update(attention_bias=False, mlp_bias=False)
    return conf


def export_hf_folder(model: Transformer, tokenizer: BPETokenizer, folder: str | Path,
                     dtype: torch.dtype = torch.float32) -> Path:
    """Write ``model`` and ``tokenizer`` to ``folder`` (created) as a Hugging Face model; return
    the folder. ``ValueError`` for a tokenizer that is not a :class:`BPETokenizer` (the byte
    tokenizer has no ``tokenizer.json``) or an unsupported ``dtype``."""
    from safetensors.torch import save_file

    if not isinstance(tokenizer, BPETokenizer):
        raise ValueError(f"export_hf_folder needs a BPETokenizer, got {type(tokenizer).__name__}"
                         f" (the byte tokenizer exports to GGUF: llminfra.quant.gguf_export)")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(str, _DTYPES))}, got {dtype!r}")
    if getattr(model.config, "num_experts", 1) > 1:
        raise ValueError(f"only dense models export; this one has "
                         f"num_experts={model.config.num_experts}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    tensors = {name: w.detach().to("cpu", dtype).contiguous().clone()
               for name, w in hf_state_dict(model).items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    tokenizer.backend.save(str(folder / "tokenizer.json"))
    token = tokenizer._token
    tok_conf = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
                "model_max_length": c.max_seq_len, "clean_up_tokenization_spaces": False,
                "eos_token": token(tokenizer.eos_token_id) or None,
                "bos_token": token(tokenizer.bos_token_id) or None}
    if tokenizer.chat_template:
        tok_conf["chat_template"] = tokenizer.chat_template
    gen = {"bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": sorted(tokenizer.stop_token_ids) or tokenizer.eos_token_id}
    for fname, obj in (("config.json", hf_config(model, tokenizer, dtype)),
                       ("tokenizer_config.json", tok_conf), ("generation_config.json", gen)):
        (folder / fname).write_text(json.dumps(obj, indent=2) + "\n")
    return folder
