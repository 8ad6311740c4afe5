"""Incremental detokenization (``IncrementalDetokenizer`` in llminfra/engine/sequence.py): the
text after each token equals decoding every token again, for the byte tokenizer and the real
model's byte-level BPE, on text with Korean syllables and emoji (3- and 4-byte UTF-8 characters
split across tokens)."""

import random

import pytest

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.engine.sequence import IncrementalDetokenizer
from llminfra.model import load_tiny
from llminfra.model.gguf_file import GGUFFile
from llminfra.model.pretrained import gguf_tokenizer, pretrained_path
from llminfra.model.tokenizer import ByteTokenizer

TEXT = "서빙 엔진은 토큰을 하나씩 만든다 🚀 then English, 日本語, and 👩‍💻 again. "


def feed_and_compare(tok, ids, chunks):
    d = IncrementalDetokenizer(tok.decode)
    i, emitted = 0, ""
    for n in chunks:
        emitted += d.add(ids[i:i + n])
        i += n
        assert d.text == tok.decode(ids[:i]), (i, d.text, tok.decode(ids[:i]))
        assert "\ufffd" not in emitted[-1:] or "\ufffd" in tok.decode(ids[:i])
        assert d.text.startswith(emitted)
    return d, emitted


@pytest.mark.parametrize("seed", range(5))
def test_byte_tokenizer_split_anywhere(seed):
    rng = random.Random(seed)
    tok = ByteTokenizer()
    ids = tok.encode(TEXT * 2)
    if seed:                                  # also bytes that never form a character
        ids = ids[:40] + [rng.randrange(128, 256) for _ in range(7)] + ids[40:]
    chunks = [rng.randint(1, 4) for _ in range(len(ids))]
    d, emitted = feed_and_compare(tok, ids, chunks)
    assert d.text == tok.decode(ids)


def test_real_bpe_tokenizer_one_token_at_a_time():
    tok = gguf_tokenizer(GGUFFile(pretrained_path("smollm2-135m")).metadata)
    ids = tok.encode(TEXT * 3)
    rng = random.Random(1)
    feed_and_compare(tok, ids, [1] * len(ids))
    feed_and_compare(tok, ids, [rng.randint(1, 3) for _ in range(len(ids))])
    # a token that ends inside a character: its text waits for the next token
    d = IncrementalDetokenizer(tok.decode)
    parts = [d.add([t]) for t in ids]
    assert "".join(parts) == tok.decode(ids) and "\ufffd" not in "".join(parts)


def test_engine_text_equals_a_full_decode():
    model, tok = load_tiny()
    engine = LLMEngine(model, tok, num_blocks=64, block_size=8)
    outs = engine.generate(["def f(", "한국어 "], SamplingParams(max_tokens=40, temperature=1.0,
                                                               seed=3, n=2))
    for out in outs:
        for c in out.outputs:
            assert c.text == tok.decode(c.token_ids)


def test_stop_string_found_across_tokens():
    model, tok = load_tiny()
    engine = LLMEngine(model, tok, num_blocks=64, block_size=8)
    free = engine.generate(["The "], SamplingParams(max_tokens=30, temperature=0))[0]
    text = free.outputs[0].text
    stop = text[5:8]
    out = engine.generate(["The "], SamplingParams(max_tokens=30, temperature=0,
                                                   stop=[stop]))[0].outputs[0]
    assert out.text == text[:text.find(stop)] and out.finish_reason == "stop"
