"""The scheduler's second half: writing a step's result, once the model has run.

:meth:`StepUpdate.update_from_output` is the one place a step's result is written (vLLM V1's
``update_from_output``, nano-vllm's ``postprocess``): computed tokens advance (rejected drafts'
slots go back to the pool), full blocks join the prefix cache, ``n > 1`` siblings fork, sampled
tokens are appended, stops and length are checked (:func:`check_stop`), finished sequences are
retired. :class:`~llminfra.engine.scheduler.Scheduler` inherits it; its first half, deciding a
step, is :mod:`llminfra.engine.scheduler`.

The stop rules, in the order :func:`check_stop` checks them after each new token:

1. **structured output** — the request's JSON grammar (:mod:`.structured`) advances by the
   token; a complete JSON value ends the sequence (``"stop"``);
2. **stop strings** — the first stop string in the decoded text ends it (``"stop"``); the text
   up to it is what the request returns (:func:`~llminfra.engine.sampling_params.stop_at`);
3. **stop tokens** — the tokenizer's end of sequence or the chat's end of turn, unless the
   request ignores EOS (``"stop"``);
4. **length** — ``max_tokens`` generated, or the model's context full (``"length"``).

vLLM checks the same rules in its ``StopChecker``. Taught in chapter 05.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from llminfra.engine.sampling_params import stop_at
from llminfra.engine.scheduler_io import SchedulerOutput
from llminfra.engine.sequence import Sequence, SequenceStatus


class StepUpdate:
    """What the :class:`~llminfra.engine.scheduler.Scheduler` does after a step (a mixin: it
    uses the scheduler's ``cache``, ``config``, ``decode``, ``stop_token_ids``, ``start`` and
    ``finish``)."""

    def update_from_output(self, out: SchedulerOutput,
                           sampled: Mapping[Sequence, list[int] | Exception],
                           logprobs: Mapping[Sequence, tuple] | None = None,
                           ) -> dict[Sequence, int | Exception]:
        """Write the step's result. ``sampled[seq]``: the tokens ``seq`` gets this step — one
        sampled token, or the accepted drafts followed by one more (speculative decoding) —
        or the exception its sampling raised; sequences whose computed tokens have not caught
        up (a prompt chunk) are absent. Siblings of an ``n > 1`` request that fork now are
        keys too. ``logprobs[seq]``: the log-probabilities of its sampled token, where its
        request asked for them. Returns, per sequence of ``sampled``, the number of tokens
        appended or the exception that stopped it (the caller fails that request)."""
        for seq, entry in (logprobs or {}).items():
            seq.output_logprobs.append(entry)
        result: dict[Sequence, int | Exception] = {}
        B = self.cache.block_size
        for seq, n in out.scheduled:
            if seq.status.is_finished:
                continue
            tokens = sampled.get(seq)
            drafts = out.caught.get(seq, 0)
            accepted = min(drafts, len(tokens) - 1) if isinstance(tokens, list) else 0
            before = seq.num_computed_tokens
            seq.num_computed_tokens += n - drafts + accepted
            kept, seq.spec_token_ids = seq.spec_token_ids[:accepted], []
            if drafts > accepted:                      # the rejected drafts' slots go back
                self.cache.truncate(seq.cache_seq, seq.num_computed_tokens)
            if self.config.enable_prefix_caching and seq.num_computed_tokens // B > before // B:
                self.cache.cache_prefix(seq.cache_seq, (seq.token_ids() + kept)
                                        [:seq.num_computed_tokens])
            if tokens is not None and seq.index == 0 and seq.request.forks_pending:
                self._fork_siblings(seq)
        for seq, tokens in sampled.items():
            if seq.status.is_finished:                 # a sibling failed earlier
                continue
            result[seq] = tokens if isinstance(tokens, Exception) else self._append(seq, tokens)
        return result

    def _fork_siblings(self, seq: Sequence) -> None:
        """Parallel sampling (n > 1): when sequence 0 has just read its prompt, its siblings
        share its blocks (:meth:`PagedKVCache.fork`, copy-on-write on their first own token,
        Kwon et al. 2023, arXiv:2309.06180, §4.4); the caller sampled their first tokens from
        the same logits."""
        forks, seq.request.forks_pending = seq.request.forks_pending, []
        for sib in forks:
            self.start(sib, self.cache.fork(seq.cache_seq), seq.num_computed_tokens)

    def _append(self, seq: Sequence, tokens: list[int]) -> int | Exception:
        """Append ``tokens`` one by one until the sequence stops (stop string, stop token,
        ``max_tokens``, context); retire it then. The count appended, or the exception a
        stop-string check raised."""
        for k, token in enumerate(tokens, 1):
            seq.append_output(int(token), self.decode, int(token) in self.stop_token_ids
                              and not seq.params.ignore_eos)
            try:
                status = check_stop(seq, int(token), self.stop_token_ids, self.decode,
                                    self.config.max_seq_len)
            except Exception as err:  # noqa: BLE001 - the caller fails this request
                return err
            if status is not None:
                self.finish(seq, status)
                return k
        return len(tokens)


def check_stop(seq: Sequence, token: int, stop_token_ids: Collection[int],
               decode: Callable | None, max_seq_len: int) -> SequenceStatus | None:
    """The status ``seq`` finishes with now that ``token`` is its newest output token, or
    None while it goes on. ``decode`` (token ids -> text) is needed by stop strings only;
    ``ValueError`` when a request has stop strings and there is none."""
    if seq.grammar is not None:                # structured output: the JSON goes on
        seq.grammar.advance(token)
    if seq.grammar is not None and seq.grammar.finished():
        return SequenceStatus.FINISHED_STOPPED
    stops = seq.params.stop_strings
    if stops:
        if decode is None:
            raise ValueError("stop strings need the scheduler's decode (token ids -> text)")
        text = seq.detok.text if seq.detok is not None else ""
        end = stop_at(text, stops)
        if end is not None:
            seq.stop_text = text[:end]
            return SequenceStatus.FINISHED_STOPPED
    if not seq.params.ignore_eos and token in stop_token_ids:
        return SequenceStatus.FINISHED_STOPPED
    if len(seq.output_token_ids) >= seq.max_tokens or seq.num_tokens > max_seq_len:
        return SequenceStatus.FINISHED_LENGTH
    return None
