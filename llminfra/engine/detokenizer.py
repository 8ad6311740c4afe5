"""Incremental detokenization: each step decodes a few tokens, not the whole completion again.

A streamed completion of ``n`` tokens decoded from scratch after every token costs
``1 + 2 + … + n = O(n²)`` token look-ups; the engine only needs what the newest tokens add.
Two things make "decode just the new tokens" wrong, and the rule below handles both:

* a token can be part of a character: a byte-level BPE token may end inside a Korean syllable
  or an emoji (three or four UTF-8 bytes), so the new token's bytes alone decode to U+FFFD;
* a tokenizer may render a token differently depending on what precedes it.

So the decoder keeps two offsets into the token ids (the scheme of Hugging Face's
text-generation-inference and of vLLM's ``detokenize_incrementally``, in our words):
``prefix_offset`` — where a short window of already-emitted tokens starts, decoded again only
as context — and ``read_offset`` — the first token whose text has not been emitted. After new
tokens arrive::

    before = decode(ids[prefix_offset:read_offset])     # context, already emitted
    after  = decode(ids[prefix_offset:])                 # context + new tokens
    if after is longer and does not end in U+FFFD:       # every new character is complete
        emit after[len(before):]; prefix_offset, read_offset = read_offset, len(ids)

otherwise the new tokens wait for the next one. :attr:`IncrementalDetokenizer.text` is the
emitted text plus the pending tail as it decodes now (U+FFFD where a character is unfinished),
so it always equals ``decode(ids)`` — a test checks it on random ids with Korean and emoji.
Taught in chapter 05.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """The text of a growing list of token ids, decoded a few tokens at a time.

    ``decode`` maps token ids to text (the tokenizer's ``decode``). Feed new ids with
    :meth:`add`; read :attr:`text` (everything so far) at any time.
    ``d = IncrementalDetokenizer(tok.decode); d.add([72, 105]); d.text == tok.decode([72, 105])``.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self.ids: list[int] = []
        self.emitted = ""                 # text of ids[:read_offset], final
        self.prefix_offset = 0
        self.read_offset = 0
        self._tail = ""                   # what ids[read_offset:] add, as they decode now

    def add(self, new_ids: Sequence[int]) -> str:
        """Take ``new_ids``; return the text they completed (may be ``""`` while a character
        is unfinished)."""
        if not new_ids:
            return ""
        self.ids.extend(int(t) for t in new_ids)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT) \
                and after.startswith(before):
            delta = after[len(before):]
            self.emitted += delta
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self._tail = ""
            return delta
        self._tail = after[len(before):] if after.startswith(before) else \
            self._decode(self.ids)[len(self.emitted):]
        return ""

    @property
    def text(self) -> str:
        """All the text so far: emitted text plus the pending tail (``decode(ids)``)."""
        return self.emitted + self._tail
