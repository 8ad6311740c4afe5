"""Static and dynamic batches: the request-level baselines that continuous batching replaced.

A static batch is formed from the waiting queue and runs until ALL of it finishes; nothing joins
meanwhile. The batch keeps its shape: a member that finishes (length, stop string, EOS) is
reported at once but stays in the batch as a *padding row* — it keeps its KV blocks and every
later step computes one more token for it, which is thrown away — until the batch's last member
is done; then all its rows are released together. That is what the baselines of the
iteration-level papers do (request-level batching in Yu et al. 2022, Orca, OSDI '22, §2.2 and
§3.1; the FasterTransformer baseline of Kwon et al. 2023, vLLM, arXiv:2309.06180, §6), and what
HF Transformers' ``generate`` on a batch does: the step's tensors have a fixed batch dimension,
so an early finisher is not removed but padded. On a GPU a decode step costs about the same at
any batch size, so this matters little there; on a CPU, where a step's time grows with the
batch, letting the batch shrink would flatter static batching. Admission reserves the worst
case: a row may grow to its prompt plus the largest ``max_tokens`` of the batch (capped by the
context), as servers without paging reserved (vLLM, arXiv:2309.06180, §3). An aborted member is
not padded: it frees its blocks at once. A *dynamic* batch is the same, but starts only once
``max_num_seqs`` requests wait or the oldest has waited ``dynamic_window_s`` (the "dynamic
batching" of Triton Inference Server).

A padding row is never preempted and never causes a preemption: when it would pass the context,
or take a block the real members may still need, it is simply no longer computed; and should a
real member find no block (a request bigger than the pool, running alone, preempts its own
forks), the padding rows give theirs back and leave the batch before anyone is preempted or kept
swapped out.

:class:`StaticBatches` is the :class:`~llminfra.engine.scheduler.Scheduler`'s delegate for the
two policies; under ``continuous`` it never forms a batch and holds no padding row. Taught in
chapter 05.
"""

from __future__ import annotations

from llminfra.engine.sequence import Sequence
from llminfra.kvcache.blocks import blocks_needed


class StaticBatches:
    """Batch formation, worst-case reservation and the padding rows of one scheduler (which
    it reads and whose queues it fills; it imports nothing of it)."""

    def __init__(self, scheduler):
        self.s = scheduler
        self.padding: list[Sequence] = []

    def keep_as_padding(self, seq: Sequence) -> None:
        """A finished member stays in the batch (its blocks held) until the batch ends."""
        self.padding.append(seq)

    def drop_padding(self) -> None:
        """Release every padding row: its batch is over, or a real member needs the blocks they
        hold (only when the batch outgrew its reservation: a request bigger than the pool)."""
        for seq in self.padding:
            self.s.release(seq)
        self.padding = []

    def schedule_padding(self, budget: int, out) -> None:
        """One discarded token for each padding row, while the budget lasts, the context has
        room and a block is free beyond what the batch's real members may still take (so a
        padding row never causes a preemption)."""
        s = self.s
        spare = min(s.free_blocks(), s.cache.num_free_blocks - self._members_outstanding())
        for seq in self.padding:
            if budget < 1:
                break
            need = s.cache.blocks_to_append(seq.cache_seq, 1)
            if s.cache.seq_len(seq.cache_seq) + 1 > s.config.max_seq_len or need > spare:
                continue
            out.padding.append(seq)
            budget -= 1
            spare -= need
            s.promise(need)

    def _members_outstanding(self) -> int:
        """Blocks the batch's real members may still take: each running one's worst case
        (prompt + max_tokens, capped by the context) less what its table holds (+1 for a shared
        last block it would copy), and the whole worst case of each pending fork and of each
        swapped-out member. Counted from the tables before this step's reservation, so the
        running members' blocks of this step are in it."""
        s = self.s
        B, L = s.cache.block_size, s.config.max_seq_len
        total = 0
        for seq in s.running:
            worst = blocks_needed(seq.reserve_tokens(L), B)
            held = len(s.cache.block_table(seq.cache_seq))
            total += max(0, worst - held) + int(s.cache.last_block_shared(seq.cache_seq))
            if seq.index == 0:
                total += worst * len(seq.request.forks_pending)
        return total + sum(blocks_needed(q.reserve_tokens(L), B) for q in s.swapped)

    def batch_ready(self, now: float) -> bool:
        """Dynamic batching: enough sequences wait to fill ``max_num_seqs`` (siblings
        counted), or the oldest waited the window."""
        s = self.s
        if not s.waiting:
            return False
        if s.config.policy != "dynamic":
            return True
        return (sum(q.group_size for q in s.waiting) >= s.config.max_num_seqs
                or now - s.waiting[0].arrival_time >= s.config.dynamic_window_s)

    def next_event_time(self, now: float) -> float | None:
        """When an idle dynamic scheduler will start its batch (for the simulator's clock)."""
        s = self.s
        if s.config.policy == "dynamic" and s.waiting and not s.running:
            return max(now, s.waiting[0].arrival_time + s.config.dynamic_window_s)
        return None

    def batch_reserve(self, batch: list[Sequence]) -> int:
        """Blocks a static batch may hold at its largest. Its rows are padded until the longest
        member is done, so row i may grow to ``p_i + M`` tokens — ``p_i`` what it holds now
        (its prompt, for a fresh request), ``M`` the most tokens any member has still to
        generate (the batch's largest ``max_tokens``) — capped by the context, times 1 + its
        pending forks: ``Σ_i blocks_needed(min(p_i + M, max_seq_len)) · (1 + forks_i)``."""
        M = max(q.max_tokens - len(q.output_token_ids) for q in batch)
        return sum(blocks_needed(min(q.num_tokens + M, self.s.config.max_seq_len),
                                 self.s.cache.block_size) * (1 + len(q.request.forks_pending))
                   for q in batch)

    def form(self, now: float) -> None:
        """Admit a batch whose rows, padding included, all fit the free blocks at their largest
        (:meth:`batch_reserve`); a request needing more than the whole pool alone still runs,
        alone."""
        s = self.s
        if not self.batch_ready(now):
            return
        while s.waiting and s.has_room(s.waiting[0]):
            seq = s.waiting[0]
            if s.running and self.batch_reserve(s.running + [seq]) > s.cache.num_free_blocks:
                break
            s.waiting.popleft()
            s.start(seq)
