"""The scheduler: which sequences run in the next step, and how many tokens each brings.

Three policies (chapter 05 compares them on one workload):

* ``static`` — a batch is formed from the waiting queue and runs until ALL of it finishes;
  nothing joins meanwhile. The batch keeps its shape: a member that finishes (length, stop
  string, EOS) is reported at once but stays in the batch as a *padding row* — it keeps its KV
  blocks and every later step computes one more token for it, which is thrown away — until the
  batch's last member is done; then all its rows are released together. That is what the
  baselines of the iteration-level papers do (request-level batching in Yu et al. 2022, Orca,
  OSDI '22, §2.2 and §3.1; the FasterTransformer baseline of Kwon et al. 2023, vLLM,
  arXiv:2309.06180, §6), and what HF Transformers' ``generate`` on a batch does: the step's
  tensors have a fixed batch dimension, so an early finisher is not removed but padded. On a GPU a
  decode step costs about the same at any batch size, so this matters little there; on a CPU,
  where a step's time grows with the batch, letting the batch shrink would flatter static
  batching. Admission reserves the worst case: a row may grow to its prompt plus the largest
  ``max_tokens`` of the batch (capped by the context), as servers without paging reserved
  (vLLM, arXiv:2309.06180, §3). An aborted member is not padded: it frees its blocks at once.
* ``dynamic`` — the same, but a batch starts only once ``max_num_seqs`` requests wait or the
  oldest has waited ``dynamic_window_s`` (the "dynamic batching" of Triton Inference Server).
* ``continuous`` — iteration-level scheduling (Yu et al. 2022, Orca, OSDI '22, §4.2): at every
  step finished sequences leave and waiting ones join, as long as the KV blocks and the token
  budget allow.

``max_num_seqs`` bounds the running *sequences*, not requests: a request with n > 1 counts n
(its sequence 0 is admitted only when it and the siblings that will fork from it all fit).

Every step has a token budget, ``max_num_batched_tokens``. Running sequences are served first
(one token per decode), then swapped-out ones come back, then waiting ones are admitted in
arrival order, then padding rows (one token each, while the budget lasts). With
``enable_chunked_prefill`` a prompt is cut into chunks that fit the budget
(at most ``max_prefill_chunk_tokens`` per sequence per step), so a long prompt no longer stalls
the decodes of everyone else (Agrawal et al. 2024, Sarathi-Serve, arXiv:2403.02310, §4); without
it a prompt is run whole. Admission is bounded by free KV blocks. When a running sequence needs
a block and none is free, the latest-arrived running sequence is *preempted*: its blocks are
freed and it is either recomputed later or swapped to CPU memory
(:mod:`llminfra.kvcache.offload`; vLLM, arXiv:2309.06180, §4.5). A padding row is never
preempted and never causes a preemption: when it would pass the context, or take a block the
real members may still need, it is simply no longer computed; and should a real member find no
block (a request bigger than the pool, running alone, preempts its own forks), the padding rows
give theirs back and leave the batch before anyone is preempted or kept swapped out.

The scheduler only decides and keeps the block accounts; it never runs the model, so the
simulator (:mod:`llminfra.engine.simulator`) drives the very same code with a step-time model.
Taught in chapter 05.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from llminfra.engine.sequence import Sequence, SequenceStatus
from llminfra.kvcache.block_table import blocks_needed
from llminfra.kvcache.offload import swap_in, swap_out
from llminfra.kvcache.paged_cache import PagedKVCache
from llminfra.kvcache.prefix_cache import PrefixCachingAllocator

POLICIES = ("static", "dynamic", "continuous")
PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling limits; validated here. ``max_seq_len`` is the model's context;
    ``max_num_seqs`` bounds the running sequences (a request with n > 1 counts n)."""

    max_seq_len: int
    policy: str = "continuous"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True
    max_prefill_chunk_tokens: int | None = None
    preemption: str = "recompute"
    dynamic_window_s: float = 0.05
    enable_prefix_caching: bool = False

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r}; allowed: {POLICIES}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption {self.preemption!r}; allowed: {PREEMPTION_MODES}")
        for name in ("max_seq_len", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        cap = self.max_prefill_chunk_tokens
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"max_prefill_chunk_tokens must be None or an int >= 1, got {cap!r}")
        w = self.dynamic_window_s
        if (isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w)
                or w < 0):
            raise ValueError(f"dynamic_window_s must be a finite number >= 0 (seconds), got "
                             f"{w!r}")


@dataclass
class SchedulerOutput:
    """One step's decision: ``scheduled`` (sequence, new tokens) pairs in priority order, the
    sequences preempted / swapped in while deciding, and the ``padding`` rows (finished members
    of a static batch that the step computes one discarded token for)."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    swapped_in: list[Sequence] = field(default_factory=list)
    padding: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Σ new tokens of the step, one per padding row included (they are computed too)."""
        return sum(n for _, n in self.scheduled) + len(self.padding)

    @property
    def has_prefill(self) -> bool:
        """True when some scheduled sequence reads more than one token."""
        return any(s.is_prefill for s, _ in self.scheduled)


class Scheduler:
    """Queues (``waiting``, ``running``, ``swapped``), the ``padding`` rows of a static batch,
    and the block accounts of a :class:`~llminfra.kvcache.PagedKVCache`. ``schedule(now)``
    decides a step; the caller runs it (``cache.prepare_step`` then the model, padding rows
    included), then calls :meth:`finish` for finished ones."""

    def __init__(self, config: SchedulerConfig, cache: PagedKVCache):
        if config.enable_prefix_caching and not isinstance(cache.allocator,
                                                           PrefixCachingAllocator):
            raise ValueError("enable_prefix_caching needs a cache built with a "
                             "PrefixCachingAllocator")
        self.config, self.cache = config, cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.padding: list[Sequence] = []
        self.num_preemptions = 0

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
        batch's last real member finishes (module docstring)."""
        self.running.remove(seq)
        seq.set_status(status)
        if self.config.policy == "continuous" or status is SequenceStatus.FINISHED_ABORTED:
            self._release(seq)
        else:
            self.padding.append(seq)
        self._end_batch_if_done()

    def abort(self, seq: Sequence,
              status: SequenceStatus = SequenceStatus.FINISHED_ABORTED) -> None:
        """Drop a sequence from whichever queue holds it, free what it holds, and finish it
        with ``status`` (aborted, or failed: ``FINISHED_ERROR``)."""
        for queue in (self.waiting, self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)
        self._release(seq)
        seq.swapped = None
        seq.set_status(status)
        self._end_batch_if_done()

    def _end_batch_if_done(self) -> None:
        """Once no real member runs or is swapped out, the padding rows go too, at once (so no
        block is held when :meth:`has_unfinished` turns False)."""
        if not self.running and not self.swapped:
            self._drop_padding()

    def _drop_padding(self) -> None:
        """Release every padding row: its batch is over, or a real member needs the blocks they
        hold (only when the batch outgrew its reservation: a request bigger than the pool)."""
        for seq in self.padding:
            self._release(seq)
        self.padding = []

    def _release(self, seq: Sequence) -> None:
        if seq.cache_seq is not None:
            self.cache.free(seq.cache_seq)
            seq.cache_seq = None

    # ------------------------------------------------------------- accounting
    def _new_blocks(self, seq: Sequence, n: int) -> int:
        """Blocks the cache must hand out for ``n`` more tokens of ``seq`` (copy-on-write of a
        shared last block included)."""
        B = self.cache.block_size
        if seq.cache_seq is None:
            return blocks_needed(n, B)
        table = self.cache.tables[seq.cache_seq]
        need = blocks_needed(table.num_tokens + n, B) - len(table.blocks)
        if n and table.num_tokens % B and self.cache.allocator.ref_count(table.blocks[-1]) > 1:
            need += 1
        return need

    def _chunk(self, seq: Sequence, budget: int, out: SchedulerOutput) -> int:
        """New tokens ``seq`` may bring this step under the remaining ``budget`` (0 = none)."""
        n = seq.num_uncomputed_tokens
        if n <= 1 or n <= budget and not self.config.enable_chunked_prefill:
            return max(0, min(n, budget))
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
            self._form_static_batch(now)
        budget = self._schedule_running(self.config.max_num_batched_tokens, out)
        if not out.preempted:
            budget = self._swap_in(budget, out)        # swapped-out members come back first
            if self.config.policy == "continuous" and not self.swapped:
                self._admit(budget, out)
        if self.padding and out.scheduled:
            self._schedule_padding(budget, out)
        return out

    def _free(self) -> int:
        return self.cache.allocator.num_free - self._promised_blocks

    def _schedule_running(self, budget: int, out: SchedulerOutput) -> int:
        self._promised_blocks = 0
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            n = self._chunk(seq, budget, out)
            if n == 0:
                i += 1
                continue
            need = self._new_blocks(seq, n)
            if need > self._free():
                self._drop_padding()                        # finished rows give way first
            while need > self._free() and self.running[-1] is not seq:
                self._preempt(self.running[-1], out)      # latest arrival goes first
            if need > self._free():
                self._preempt(seq, out)                     # it was the latest itself
                continue
            out.scheduled.append((seq, n))
            budget -= n
            self._promised_blocks += need
            i += 1
        return budget

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.num_preemptions += 1
        if self.config.preemption == "swap":
            seq.swapped = swap_out(self.cache, seq.cache_seq)
            seq.cache_seq = None
            self.swapped.appendleft(seq)
        else:
            self._release(seq)
            seq.num_computed_tokens = 0
            self.waiting.appendleft(seq)
        seq.set_status(SequenceStatus.PREEMPTED)
        out.preempted.append(seq)
        self._end_batch_if_done()                # a recomputed member leaves its batch

    def _has_room(self, seq: Sequence) -> bool:
        """``max_num_seqs`` holds with ``seq`` admitted: running sequences, each with the
        siblings that will still fork from it (:attr:`Sequence.group_size`), plus its own."""
        running = sum(s.group_size for s in self.running)
        return running + seq.group_size <= self.config.max_num_seqs

    def _swap_in(self, budget: int, out: SchedulerOutput) -> int:
        while self.swapped and budget > 0 and self._has_room(self.swapped[0]):
            seq = self.swapped[0]
            held = seq.swapped.num_tokens
            n = self._chunk(seq, budget, out)
            if n == 0 or blocks_needed(held + n, self.cache.block_size) > self._free():
                if n and self.padding:
                    self._drop_padding()                    # finished rows give way first
                    continue
                break
            self.swapped.popleft()
            seq.cache_seq = swap_in(self.cache, seq.swapped)
            seq.swapped = None
            seq.set_status(SequenceStatus.RUNNING)
            self.running.append(seq)
            out.swapped_in.append(seq)
            self._promised_blocks += self._new_blocks(seq, n)
            out.scheduled.append((seq, n))
            budget -= n
        return budget

    def _match_prefix(self, seq: Sequence) -> None:
        if self.config.enable_prefix_caching and seq.cache_seq is None:
            seq.cache_seq, seq.num_computed_tokens = self.cache.add_prefix_sequence(
                seq.token_ids())

    def _admit(self, budget: int, out: SchedulerOutput) -> None:
        while self.waiting and budget > 0 and self._has_room(self.waiting[0]):
            seq = self.waiting[0]
            self._match_prefix(seq)
            n = self._chunk(seq, budget, out)
            need = self._new_blocks(seq, n)
            if n == 0 or need > self._free():
                self._release(seq)                         # give matched prefix blocks back
                seq.num_computed_tokens = 0
                break
            self.waiting.popleft()
            if seq.cache_seq is None:
                seq.cache_seq = self.cache.add_sequence()
            seq.set_status(SequenceStatus.RUNNING)
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
            self._promised_blocks += need

    # ---------------------------------------------------------------- padding
    def _schedule_padding(self, budget: int, out: SchedulerOutput) -> None:
        """One discarded token for each padding row, while the budget lasts, the context has
        room and a block is free beyond what the batch's real members may still take (so a
        padding row never causes a preemption)."""
        spare = min(self._free(), self.cache.allocator.num_free - self._members_outstanding())
        for seq in self.padding:
            if budget < 1:
                break
            need = self._new_blocks(seq, 1)
            held = self.cache.tables[seq.cache_seq].num_tokens
            if held + 1 > self.config.max_seq_len or need > spare:
                continue
            out.padding.append(seq)
            budget -= 1
            spare -= need
            self._promised_blocks += need

    def _members_outstanding(self) -> int:
        """Blocks the batch's real members may still take: each running one's worst case
        (prompt + max_tokens, capped by the context) less what its table holds (+1 for a shared
        last block it would copy), and the whole worst case of each pending fork and of each
        swapped-out member. Counted from the tables before this step's reservation, so the
        running members' blocks of this step are in it."""
        B, L = self.cache.block_size, self.config.max_seq_len
        total = 0
        for seq in self.running:
            worst = blocks_needed(seq.reserve_tokens(L), B)
            blocks = self.cache.tables[seq.cache_seq].blocks
            shared = bool(blocks) and self.cache.allocator.ref_count(blocks[-1]) > 1
            total += max(0, worst - len(blocks)) + int(shared)
            if seq.index == 0:
                total += worst * len(seq.request.forks_pending)
        return total + sum(blocks_needed(s.reserve_tokens(L), B) for s in self.swapped)

    # ---------------------------------------------------- static and dynamic
    def batch_ready(self, now: float) -> bool:
        """Dynamic batching: enough sequences wait to fill ``max_num_seqs`` (siblings
        counted), or the oldest waited the window."""
        if not self.waiting:
            return False
        if self.config.policy != "dynamic":
            return True
        return (sum(s.group_size for s in self.waiting) >= self.config.max_num_seqs
                or now - self.waiting[0].arrival_time >= self.config.dynamic_window_s)

    def next_event_time(self, now: float) -> float | None:
        """When an idle dynamic scheduler will start its batch (for the simulator's clock)."""
        if self.config.policy == "dynamic" and self.waiting and not self.running:
            return max(now, self.waiting[0].arrival_time + self.config.dynamic_window_s)
        return None

    def _batch_reserve(self, batch: list[Sequence]) -> int:
        """Blocks a static batch may hold at its largest. Its rows are padded until the longest
        member is done, so row i may grow to ``p_i + M`` tokens — ``p_i`` what it holds now
        (its prompt, for a fresh request), ``M`` the most tokens any member has still to
        generate (the batch's largest ``max_tokens``) — capped by the context, times 1 + its
        pending forks: ``Σ_i blocks_needed(min(p_i + M, max_seq_len)) · (1 + forks_i)``."""
        M = max(s.max_tokens - len(s.output_token_ids) for s in batch)
        return sum(blocks_needed(min(s.num_tokens + M, self.config.max_seq_len),
                                 self.cache.block_size) * (1 + len(s.request.forks_pending))
                   for s in batch)

    def _form_static_batch(self, now: float) -> None:
        """Admit a batch whose rows, padding included, all fit the free blocks at their largest
        (:meth:`_batch_reserve`); a request needing more than the whole pool alone still runs,
        alone."""
        if not self.batch_ready(now):
            return
        while self.waiting and self._has_room(self.waiting[0]):
            seq = self.waiting[0]
            if self.running and (self._batch_reserve(self.running + [seq])
                                 > self.cache.allocator.num_free):
                break
            self.waiting.popleft()
            seq.cache_seq = self.cache.add_sequence()
            seq.num_computed_tokens = 0
            seq.set_status(SequenceStatus.RUNNING)
            self.running.append(seq)
