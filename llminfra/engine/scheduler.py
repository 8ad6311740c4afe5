"""The scheduler: which sequences run in the next step, how many tokens each brings, and what
becomes of them once the model has run.

The invariant everything follows from: there is no prefill phase and no decode phase. A
sequence has tokens (prompt, then generated, then any speculative drafts) and a count of
*computed* tokens (those whose K/V are in the cache); a step lets each scheduled sequence's
computed tokens catch up with its tokens by as many as the budget gives it. A fresh prompt is
far behind (a prefill), a sequence that just sampled is one behind (a decode); a long prompt
catches up over several steps (chunked prefill), a cached prefix starts it ahead (prefix
caching), a preempted one falls back to zero (recompute), and drafts put it several tokens
behind, all verified in one pass (speculative decoding). This is the accounting of vLLM V1's
scheduler, in our words.

Policies: ``continuous`` — iteration-level scheduling (Yu et al. 2022, Orca, OSDI '22, §4.2):
at every step finished sequences leave and waiting ones join, as the KV blocks and the token
budget allow; ``static`` and ``dynamic``, the request-level baselines, in :mod:`.static_batch`.

``max_num_seqs`` bounds the running *sequences*, not requests: a request with n > 1 counts n
(its sequence 0 is admitted only when it and the siblings that will fork from it all fit).

Every step has a token budget, ``max_num_batched_tokens``. Running sequences are served first,
then swapped-out ones come back, then waiting ones are admitted in arrival order, then padding
rows (one token each, while the budget lasts). With ``enable_chunked_prefill`` a prompt is cut
into chunks that fit the budget (at most ``max_prefill_chunk_tokens`` per sequence per step), so
a long prompt no longer stalls the decodes of everyone else (Agrawal et al. 2024, Sarathi-Serve,
arXiv:2403.02310, §4); without it a prompt is run whole. Speculative drafts ride along only
where the budget has room for them. Admission is bounded by free KV blocks, as the cache counts
them (:meth:`~llminfra.kvcache.PagedKVCache.can_append`). When a running sequence needs a block
and none is free, the latest-arrived running sequence is *preempted*: its blocks are freed and it
is either recomputed later or swapped to CPU memory (:mod:`llminfra.kvcache.offload`; vLLM,
arXiv:2309.06180, §4.5).

After the model has run, :meth:`Scheduler.update_from_output` is the one place a step's result
is written: computed tokens advance (rejected drafts' slots go back to the pool), full blocks
join the prefix cache, ``n > 1`` siblings fork, sampled tokens are appended, stops and length
are checked, finished sequences are freed (vLLM V1's ``update_from_output``, nano-vllm's
``postprocess``; :mod:`.scheduler_update`, which :class:`Scheduler` inherits). Every field of
a running :class:`~llminfra.engine.sequence.Sequence` is written here (its state, computed
tokens, cache sequence, drafts, output tokens and log-probabilities) — the rest of the engine
asks the scheduler's verbs (``add``, ``start``, ``adopt``, ``set_drafts``, ``finish``,
``abort``); ``tests/test_repository_rules.py`` keeps it so. The simulator
(:mod:`llminfra.sim.simulator`) drives this same code with a step-time model. Taught in
chapter 05.
"""

from __future__ import annotations

from collections import deque

from collections.abc import Callable, Collection, Mapping
from collections.abc import Sequence as Sequence_

from llminfra.engine.scheduler_io import (POLICIES, PREEMPTION_MODES,  # noqa: F401
                                          SchedulerConfig, SchedulerOutput)
from llminfra.engine.sequence import Sequence, SequenceStatus
from llminfra.engine.static_batch import StaticBatches
from llminfra.engine.scheduler_update import StepUpdate
from llminfra.kvcache.blocks import blocks_needed
from llminfra.kvcache.offload import swap_in, swap_out
from llminfra.kvcache.paged_cache import PagedKVCache
from llminfra.kvcache.prefix_cache import PrefixCachingAllocator

class Scheduler(StepUpdate):
    """Queues (``waiting``, ``running``, ``swapped``), the ``padding`` rows of a static batch,
    and the block accounts of a :class:`~llminfra.kvcache.PagedKVCache`. ``schedule(now)``
    decides a step; the caller runs it (``cache.prepare_step`` then the model, padding rows
    included) and hands the sampled tokens to :meth:`update_from_output`.

    ``stop_token_ids`` end a sequence (unless its params ignore EOS); ``decode`` (token ids ->
    text) is needed only by requests with stop strings."""

    def __init__(self, config: SchedulerConfig, cache: PagedKVCache,
                 stop_token_ids: Collection[int] = (),
                 decode: Callable[[list[int]], str] | None = None):
        if config.enable_prefix_caching and not isinstance(cache.allocator,
                                                           PrefixCachingAllocator):
            raise ValueError("enable_prefix_caching needs a cache built with a "
                             "PrefixCachingAllocator")
        self.config, self.cache = config, cache
        self.stop_token_ids, self.decode = frozenset(stop_token_ids), decode
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.batches = StaticBatches(self)
        self.num_preemptions = 0
        self._promised_blocks = 0

    padding = property(lambda self: self.batches.padding,
                       doc="Finished members of a static batch still held (:mod:`.static_batch`).")

    # ------------------------------------------------------------------ queues
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (state WAITING)."""
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        """True while any sequence waits, runs or is swapped out."""
        return bool(self.waiting or self.running or self.swapped)

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """Retire a running sequence: set its finished state and free its blocks — or, under
        static and dynamic batching, keep it (and its blocks) as a padding row until the
        batch's last real member finishes (:mod:`.static_batch`)."""
        self.running.remove(seq)
        seq.set_status(status)
        seq.spec_token_ids = []
        if self.config.policy == "continuous" or status is SequenceStatus.FINISHED_ABORTED:
            self.release(seq)
        else:
            self.batches.keep_as_padding(seq)
        self._end_batch_if_done()

    def abort(self, seq: Sequence,
              status: SequenceStatus = SequenceStatus.FINISHED_ABORTED) -> None:
        """Drop a sequence from whichever queue holds it, free what it holds, and finish it
        with ``status`` (aborted, or failed: ``FINISHED_ERROR``)."""
        for queue in (self.waiting, self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)
        self.release(seq)
        seq.swapped = None
        seq.spec_token_ids = []
        seq.set_status(status)
        self._end_batch_if_done()

    def _end_batch_if_done(self) -> None:
        """Once no real member runs or is swapped out, the padding rows go too, at once (so no
        block is held when :meth:`has_unfinished` turns False). Continuous batching holds no
        padding row, so it has nothing to drop."""
        if self.padding and not self.running and not self.swapped:
            self.batches.drop_padding()

    def adopt(self, seq: Sequence, num_computed_tokens: int, fill: Callable[[int], None],
              output_token_ids: Sequence_[int] = (),
              output_logprobs: list | None = None) -> None:
        """Run ``seq`` (just :meth:`add`-ed) from K/V computed elsewhere, a handed-off request:
        ``fill(cache_seq)`` writes its first ``num_computed_tokens`` tokens into a new cache
        sequence, then it gets the tokens (and log-probabilities) generated so far and runs
        (next step: a decode). If ``fill`` raises, nothing is kept."""
        self.waiting.remove(seq)
        seq.cache_seq = self.cache.add_sequence()
        try:
            fill(seq.cache_seq)
        except BaseException:
            self.release(seq)
            raise
        for token in output_token_ids:          # as update_from_output appends them
            seq.append_output(int(token), self.decode, False)
        if output_logprobs is not None:
            seq.output_logprobs = list(output_logprobs)
        self.start(seq, seq.cache_seq, num_computed_tokens)

    def start(self, seq: Sequence, cache_seq: int | None = None,
              num_computed_tokens: int = 0) -> None:
        """``seq`` runs from now on, on ``cache_seq`` (None: a new, empty cache sequence) with
        ``num_computed_tokens`` of its tokens in the cache; the caller has taken it off its
        queue (a static batch's admission, :mod:`.static_batch`, calls this too)."""
        seq.cache_seq = self.cache.add_sequence() if cache_seq is None else cache_seq
        seq.num_computed_tokens = num_computed_tokens
        seq.set_status(SequenceStatus.RUNNING)
        self.running.append(seq)

    def set_drafts(self, drafts: Mapping[Sequence, list[int]]) -> None:
        """Give each sequence its draft tokens for the next step (speculative decoding: what
        the engine's :class:`~llminfra.engine.spec_decode.Speculator` proposed)."""
        for seq, tokens in drafts.items():
            seq.spec_token_ids = tokens

    def release(self, seq: Sequence) -> None:
        """Give ``seq``'s blocks back to the pool (if it holds any)."""
        if seq.cache_seq is not None:
            self.cache.free(seq.cache_seq)
            seq.cache_seq = None

    # ------------------------------------------------------------- accounting
    def free_blocks(self) -> int:
        """Free blocks not yet promised to a sequence of the step being decided."""
        return self.cache.num_free_blocks - self._promised_blocks

    def promise(self, blocks: int) -> None:
        """Count ``blocks`` as taken by the step being decided."""
        self._promised_blocks += blocks

    def _chunk(self, seq: Sequence, budget: int, out: SchedulerOutput) -> int:
        """New tokens ``seq`` may bring this step under the remaining ``budget`` (0 = none):
        a prompt chunk, or its one uncomputed token plus as many drafts as the budget has
        room for."""
        n = seq.num_uncomputed_tokens
        if n <= 1:
            return max(0, min(n + len(seq.spec_token_ids), budget))
        if n <= budget and not self.config.enable_chunked_prefill:
            return n
        if self.config.enable_chunked_prefill:
            cap = self.config.max_prefill_chunk_tokens or budget
            return max(0, min(n, budget, cap))
        # unchunked, a prompt longer than the whole budget runs alone, in a step of its own
        alone = not out.scheduled and budget == self.config.max_num_batched_tokens
        return n if alone and n > self.config.max_num_batched_tokens else 0

    # --------------------------------------------------------------- schedule
    def schedule(self, now: float) -> SchedulerOutput:
        """Decide the next step at time ``now`` (see the module docstring)."""
        out = SchedulerOutput()
        if self.config.policy != "continuous" and not self.running and not self.swapped:
            self.batches.form(now)
        budget = self._schedule_running(self.config.max_num_batched_tokens, out)
        if not out.preempted:
            budget = self._swap_in(budget, out)        # swapped-out members come back first
            if self.config.policy == "continuous" and not self.swapped:
                self._admit(budget, out)
        if self.padding and out.scheduled:
            self.batches.schedule_padding(budget, out)
        out.caught = {s: s.num_computed_tokens + n - s.num_tokens for s, n in out.scheduled
                      if s.num_computed_tokens + n >= s.num_tokens}
        return out

    def _schedule_running(self, budget: int, out: SchedulerOutput) -> int:
        self._promised_blocks = 0
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            n = self._chunk(seq, budget, out)
            if n == 0:
                i += 1
                continue
            need = self.cache.blocks_to_append(seq.cache_seq, n)
            if need > self.free_blocks():
                self.batches.drop_padding()                 # finished rows give way first
            while need > self.free_blocks() and self.running[-1] is not seq:
                self._preempt(self.running[-1], out)      # latest arrival goes first
            if need > self.free_blocks():
                self._preempt(seq, out)                     # it was the latest itself
                continue
            out.scheduled.append((seq, n))
            budget -= n
            self.promise(need)
            i += 1
        return budget

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.num_preemptions += 1
        seq.spec_token_ids = []
        if self.config.preemption == "swap":
            seq.swapped = swap_out(self.cache, seq.cache_seq)
            seq.cache_seq = None
            self.swapped.appendleft(seq)
        else:
            self.release(seq)
            seq.num_computed_tokens = 0
            self.waiting.appendleft(seq)
        seq.set_status(SequenceStatus.PREEMPTED)
        out.preempted.append(seq)
        self._end_batch_if_done()                # a recomputed member leaves its batch

    def has_room(self, seq: Sequence) -> bool:
        """``max_num_seqs`` holds with ``seq`` admitted: running sequences, each with the
        siblings that will still fork from it (:attr:`Sequence.group_size`), plus its own."""
        running = sum(s.group_size for s in self.running)
        return running + seq.group_size <= self.config.max_num_seqs

    def _swap_in(self, budget: int, out: SchedulerOutput) -> int:
        while self.swapped and budget > 0 and self.has_room(self.swapped[0]):
            seq = self.swapped[0]
            held = seq.swapped.num_tokens
            n = self._chunk(seq, budget, out)
            if n == 0 or blocks_needed(held + n, self.cache.block_size) > self.free_blocks():
                if n and self.padding:
                    self.batches.drop_padding()             # finished rows give way first
                    continue
                break
            self.swapped.popleft()
            seq.cache_seq = swap_in(self.cache, seq.swapped)
            seq.swapped = None
            seq.set_status(SequenceStatus.RUNNING)
            self.running.append(seq)
            out.swapped_in.append(seq)
            self.promise(self.cache.blocks_to_append(seq.cache_seq, n))
            out.scheduled.append((seq, n))
            budget -= n
        return budget

    def _admit(self, budget: int, out: SchedulerOutput) -> None:
        while self.waiting and budget > 0 and self.has_room(self.waiting[0]):
            seq = self.waiting[0]
            if self.config.enable_prefix_caching and seq.cache_seq is None:
                seq.cache_seq, seq.num_computed_tokens = self.cache.add_prefix_sequence(
                    seq.token_ids())
            n = self._chunk(seq, budget, out)
            if n == 0 or not self.cache.can_append(seq.cache_seq, n, self._promised_blocks):
                self.release(seq)                          # give matched prefix blocks back
                seq.num_computed_tokens = 0
                break
            need = self.cache.blocks_to_append(seq.cache_seq, n)
            self.waiting.popleft()
            self.start(seq, seq.cache_seq, seq.num_computed_tokens)
            out.scheduled.append((seq, n))
            budget -= n
            self.promise(need)
