"""Byte-level tokenizer: one token id per UTF-8 byte, 256 ids, no merges, no special tokens.

A byte tokenizer never meets an unknown word and needs no training or vocabulary file, which
keeps the tiny model self-contained; its cost is ~3-4x more tokens than a BPE tokenizer on
English text (losses are therefore reported in nats per byte). Byte-level models: e.g. Xue
et al. 2022, ByT5, arXiv:2105.13626.

Taught in chapter 01.
"""

from __future__ import annotations

from collections.abc import Iterable

from llminfra.model.config import BYTE_VOCAB_SIZE


class ByteTokenizer:
    """``encode(str) -> list[int]`` (the UTF-8 bytes) and ``decode(list[int]) -> str``.

    Worked example: ``encode("hé") == [104, 195, 169]`` ('é' is two bytes in UTF-8);
    ``decode`` replaces byte sequences that are not valid UTF-8 with U+FFFD, so any model
    output can be shown.
    """

    vocab_size: int = BYTE_VOCAB_SIZE
    #: no end-of-sequence token: generation ends on length or a stop string
    eos_token_id = None
    stop_token_ids: frozenset = frozenset()

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids in [0, 256)."""
        if not isinstance(text, str):
            raise ValueError(f"encode wants a str, got {type(text).__name__}")
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """The text whose UTF-8 bytes are ``ids`` (invalid sequences become U+FFFD)."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got {bad[:5]}")
        return bytes(ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        """Chat ``messages`` (``[{"role", "content"}, …]``) as one prompt: a ``<|role|>`` line
        before each message, then ``<|assistant|>`` (the tiny model was never trained on chat;
        this only gives the server a prompt). ``[system "Be brief", user "Hi"]`` ->
        ``"<|system|>\\nBe brief\\n<|user|>\\nHi\\n<|assistant|>\\n"``."""
        role = {"developer": "system"}
        out = [f"<|{role.get(m['role'], m['role'])}|>\n{m['content']}\n" for m in messages]
        return "".join(out) + ("<|assistant|>\n" if add_generation_prompt else "")
