"""The proposers of speculative decoding: who guesses the drafts that
:mod:`llminfra.engine.spec_decode` verifies. Each has ``propose(seq, k)`` (up to ``k`` draft
tokens), ``backlog(seq)`` (tokens it has yet to read) and ``free(seq)``.

:class:`PromptLookup` is the n-gram match of Saxena 2023, "prompt lookup decoding": find the
sequence's last n tokens earlier in its own tokens and propose what followed them; free, and
good where the output copies the input. :class:`DraftModel` runs a smaller or cheaper model with
the same tokenizer, e.g. an int4 copy of the target through
:class:`~llminfra.runner.fast_decode.FastDecoder`. Both draft deterministically (q = one-hot(d)).
Taught in chapter 05.
"""

from __future__ import annotations

import torch

from llminfra.engine.sequence import Sequence


class PromptLookup:
    """Propose what followed the last occurrence of the sequence's final n tokens (n from
    ``max_n`` down to ``min_n``) in its own earlier tokens; nothing if there is none. A single
    token (n = 1) matches too often by chance ("the", ",") to be worth a verification on a CPU,
    so n starts at 2 by default."""

    def __init__(self, min_n: int = 2, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seq: Sequence, k: int) -> list[int]:
        """Up to ``k`` draft tokens for ``seq``."""
        ids = seq.token_ids()
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            tail = ids[-n:]
            for start in range(len(ids) - n - 1, -1, -1):    # latest match first
                if ids[start:start + n] == tail:
                    return ids[start + n:start + n + k]
        return []

    def backlog(self, seq: Sequence) -> int:
        """Tokens to read before proposing: none (it reads the tokens as they are)."""
        return 0

    def free(self, seq: Sequence) -> None:
        """Nothing is kept per sequence."""


class DraftModel:
    """Greedy drafts from a :class:`~llminfra.runner.fast_decode.FastDecoder` (same tokenizer as
    the target). Each sequence gets its own draft K/V cache; what it holds is kept across steps
    and only the tokens the draft has not seen (or saw differently) are fed again."""

    def __init__(self, decoder):
        self.decoder = decoder
        self._state: dict[int, tuple[tuple[torch.Tensor, torch.Tensor], list[int]]] = {}

    def propose(self, seq: Sequence, k: int) -> list[int]:
        """``k`` greedy draft tokens for ``seq`` (fewer where the draft's context ends)."""
        ids = seq.token_ids()
        dec = self.decoder
        cache, seen = self._state.get(seq.seq_id, (None, []))
        if cache is None:             # room for the prompt, max_tokens and one draft more
            cache = dec.new_cache(min(dec.max_len,
                                      len(seq.prompt_token_ids) + seq.max_tokens + 1))
        k = min(k, cache[0].shape[3] - len(ids) + 1)
        if k <= 0:
            return []
        same = 0
        for a, b in zip(seen, ids[:-1]):                # keep at least the last token to feed
            if a != b:
                break
            same += 1
        device = dec.embedding.device
        logits = dec.forward(torch.tensor(ids[same:], device=device), same, cache)
        drafts: list[int] = []
        for i in range(k):
            drafts.append(int(logits.argmax()))
            if i < k - 1:
                logits = dec.forward(torch.tensor(drafts[-1:], device=device), len(ids) + i,
                                     cache)
        self._state[seq.seq_id] = (cache, ids + drafts[:-1])
        return drafts

    def backlog(self, seq: Sequence) -> int:
        """Tokens of ``seq`` the draft model has not read yet (all, before its first draft)."""
        seen = self._state.get(seq.seq_id, (None, []))[1]
        return max(0, seq.num_tokens - len(seen))

    def free(self, seq: Sequence) -> None:
        """Forget ``seq``'s draft cache."""
        self._state.pop(seq.seq_id, None)
