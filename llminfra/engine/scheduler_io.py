"""What goes into the scheduler and what comes out of it: its limits (:class:`SchedulerConfig`,
validated once, here) and one step's decision (:class:`SchedulerOutput`: the sequences that run,
with how many new tokens each, and those preempted, swapped in or padded on the way).
:class:`~llminfra.engine.scheduler.Scheduler` makes the decision. Taught in chapter 05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llminfra.engine.sequence import Sequence

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
    #: the scheduled sequences that catch up this step (logits at their last token and at each
    #: draft), with their drafts to verify: computed once, here, for the runner and the update
    caught: dict[Sequence, int] = field(default_factory=dict)

    @property
    def num_batched_tokens(self) -> int:
        """Σ new tokens of the step, one per padding row included (they are computed too)."""
        return sum(n for _, n in self.scheduled) + len(self.padding)

    @property
    def has_prefill(self) -> bool:
        """True when some scheduled sequence reads more than one token."""
        return any(s.is_prefill for s, _ in self.scheduled)
