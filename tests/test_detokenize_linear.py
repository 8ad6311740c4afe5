"""Incremental detokenizing stays linear on byte tokens that never form a character (issue 54):
a model that repeats a lone UTF-8 byte token ends its text in U+FFFD after every token, and the
decoder's window only grew, so each token decoded every pending token again (``1 + 2 + … + n``:
4× the tokens cost about 16× the work). Now what is settled is emitted and the window moves on.
Checked by counting the tokens handed to ``decode``, not by a clock; and the text still equals a
full decode on random byte-token streams (lone and invalid bytes, emoji split across tokens) for
both tokenizer classes, the byte tokenizer and the byte-level BPE."""

import random

import pytest

from llminfra.engine.sequence import IncrementalDetokenizer
from llminfra.model.bpe_tokenizer import BPETokenizer
from llminfra.model.gguf_file import GGUFFile
from llminfra.model.pretrained import gguf_tokenizer, pretrained_path
from llminfra.model.tokenizer import ByteTokenizer

EMOJI = "🚀👩‍💻한글 ok. "


@pytest.fixture(scope="module")
def bpe():
    return gguf_tokenizer(GGUFFile(pretrained_path("smollm2-135m")).metadata)


class Counting:
    """A decode that counts its calls and the tokens it is handed."""

    def __init__(self, tok):
        self.tok, self.calls, self.tokens = tok, 0, 0

    def __call__(self, ids):
        self.calls += 1
        self.tokens += len(ids)
        return self.tok.decode(ids)


def feed(tok, ids, rng, max_chunk=3):
    """Feed ``ids`` in random chunks; after each, the text equals a full decode."""
    count = Counting(tok)
    d, i, emitted = IncrementalDetokenizer(count), 0, ""
    while i < len(ids):
        n = rng.randint(1, max_chunk)
        emitted += d.add(ids[i:i + n])
        i += n
        assert d.text == tok.decode(ids[:i]), i
        assert d.text.startswith(emitted)
    return count


def byte_tokens(tok, rng, n):
    """Random stream of a tokenizer's single-byte tokens (ASCII, lone continuation and lead
    bytes, 0xFF) mixed with an emoji text's bytes split anywhere."""
    if isinstance(tok, ByteTokenizer):
        of_byte = list(range(256))
    else:                                 # the BPE's byte tokens that alone are no character
        of_byte = [i for i in range(tok.vocab_size) if tok.decode([i]) == "\ufffd"]
    out = []
    while len(out) < n:
        k = rng.random()
        if k < 0.4:
            out += tok.encode(EMOJI)
        elif k < 0.7:
            out += [rng.choice(of_byte)] * rng.randint(1, 12)         # a lone byte, repeated
        else:
            out += [rng.choice(of_byte) for _ in range(rng.randint(1, 6))]
    return out[:n]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_text_equals_a_full_decode_on_random_byte_tokens(kind, seed, bpe):
    tok = ByteTokenizer() if kind == "byte" else bpe
    assert isinstance(tok, ByteTokenizer if kind == "byte" else BPETokenizer)
    rng = random.Random(seed)
    feed(tok, byte_tokens(tok, rng, 300), rng)


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_an_emoji_split_across_tokens_waits_then_comes_whole(kind, bpe):
    tok = ByteTokenizer() if kind == "byte" else bpe
    ids = tok.encode("a🚀b" * 3)
    d = IncrementalDetokenizer(tok.decode)
    parts = [d.add([t]) for t in ids]
    assert "".join(parts) == tok.decode(ids) and "\ufffd" not in "".join(parts)


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_work_is_linear_in_the_tokens_of_a_lone_byte_run(kind, bpe):
    """n tokens of one lone byte (U+FFFD each): the tokens decoded stay under 6 n, and 4× the
    tokens cost 4× the work (it was n²/2: 16×)."""
    tok = ByteTokenizer() if kind == "byte" else bpe
    lone = 0x80 if kind == "byte" else next(i for i in range(tok.vocab_size)
                                            if tok.decode([i]) == "\ufffd")
    work = {}
    for n in (200, 800):
        count = Counting(tok)
        d = IncrementalDetokenizer(count)
        for _ in range(n):
            d.add([lone])
        assert d.text == "\ufffd" * n
        assert count.tokens <= 6 * n and count.calls <= 3 * n, (n, count.tokens, count.calls)
        work[n] = count.tokens
    assert work[800] <= 4.5 * work[200], work


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_work_is_linear_on_random_streams(kind, bpe):
    tok = ByteTokenizer() if kind == "byte" else bpe
    rng = random.Random(7)
    work = {}
    for n in (500, 2000):
        ids = byte_tokens(tok, rng, n)
        work[n] = feed(tok, ids, random.Random(1), max_chunk=1).tokens
        assert work[n] <= 12 * n, (n, work[n])
    assert work[2000] <= 4.5 * work[500], work
