"""Serve a request trace in a fixed KV budget and measure where the memory goes.

One step = every running request stores the K/V of one more token. Requests wait in a FCFS
queue and are admitted while memory allows (all of them arrive at once: the server is under
full load, the regime of the vLLM paper's throughput experiments). Two designs:

* **contiguous** (:func:`simulate_contiguous`): at admission a request reserves one stretch of
  ``reserve(request)`` slots in a flat address space (first fit). ``"max"`` reserves
  ``max_seq_len`` (Orca "Max"), ``"pow2"`` the next power of two ≥ prompt + output (Orca
  "Pow2"), ``"oracle"`` exactly prompt + output (Orca "Oracle") — Kwon et al., 2023,
  arXiv:2309.06180, §6.1 baselines and Fig. 2;
* **paged** (:func:`simulate_paged`): blocks of ``block_size`` slots from a real
  :class:`~llminfra.kvcache.blocks.BlockAllocator`, one more when the last is full; if
  none is free the newest request is preempted and recomputed later (vLLM §4.5).

At every step while requests are waiting, the budget splits into (summed over steps):

* ``token`` — slots holding K/V of tokens so far;
* ``reserved`` — slots reserved for tokens the request will still produce (contiguous);
* ``internal`` — slots allocated that no token will ever use (beyond the final length; the
  unused tail of a paged sequence's last block);
* ``external`` — free slots that add up to enough for the next request but are split into holes
  too small for it (contiguous only: paging has none by construction);
* ``free`` — free slots too few for the next request.

``utilization = token / (token + reserved + internal)`` (the share of *allocated* memory that
holds real tokens), the quantity the paper reports as 20.4–38.2 % for earlier systems.

Taught in chapter 04.
"""

from __future__ import annotations

from collections import deque

from llminfra.calc.memory import kv_budget
from llminfra.kvcache.blocks import BlockAllocator, BlockPoolExhausted, BlockTable, blocks_needed
from llminfra.kvcache.trace import DEFAULT_MAX_SEQ_LEN, Request

PARTS = ("token", "reserved", "internal", "external", "free")

#: the vLLM paper's figures (Kwon et al., 2023, arXiv:2309.06180), beside which chapter 04 and
#: ``python -m llminfra bench kvcache`` put this module's measurements and :mod:`.sharing`'s
PAPER = {
    "token_share_earlier_systems": [0.204, 0.382],   # Fig. 2: Orca Max .. Orca Oracle
    "token_share_vllm": 0.963,                        # Fig. 2 (under 4 % waste, §1)
    "parallel_sampling_saving_alpaca": [0.061, 0.098],   # §6.3, Fig. 15
    "beam_search_saving_alpaca": [0.376, 0.552],          # §6.3, Fig. 15 ("up to 55 %")
    "parallel_sampling_saving_sharegpt": [0.162, 0.305],  # §6.3 text
    "beam_search_saving_sharegpt": [0.443, 0.663],        # §6.3 text
}


def kv_budget_tokens(model: str = "opt-13b", gpu: str = "a100-40gb", dtype: str = "fp16",
                     context: int = DEFAULT_MAX_SEQ_LEN) -> int:
    """KV tokens that fit beside the weights — the fixed budget a trace is served in:
    :func:`llminfra.calc.memory.kv_budget`'s ``kv_budget_tokens`` (the same answer chapter 02
    gives). The default is the paper's setting (Fig. 2).

    OPT-13B fp16 on an A100-40GB (42,949,672,960 bytes), context 2048:
    (38,654,705,664 - 25,706,946,560 - 293,802,368) // 819,200 = 15,446 tokens.
    """
    return kv_budget(model, gpu, dtype, context=context).kv_budget_tokens


class FirstFitArena:
    """A flat range of ``size`` slots handing out contiguous stretches, first fit."""

    def __init__(self, size: int):
        self.size = size
        self.holes: list[tuple[int, int]] = [(0, size)]      # (start, length), sorted

    def allocate(self, n: int) -> int | None:
        """Start of a stretch of ``n`` slots, or None if no hole is big enough."""
        for i, (start, length) in enumerate(self.holes):
            if length >= n:
                self.holes[i:i + 1] = [(start + n, length - n)] if length > n else []
                return start
        return None

    def free(self, start: int, n: int) -> None:
        """Return ``[start, start + n)`` and merge it with neighbouring holes."""
        holes = sorted(self.holes + [(start, n)])
        merged = [holes[0]]
        for s, length in holes[1:]:
            ps, pl = merged[-1]
            if ps + pl == s:
                merged[-1] = (ps, pl + length)
            else:
                merged.append((s, length))
        self.holes = merged

    @property
    def free_slots(self) -> int:
        """Total free slots, in all holes."""
        return sum(length for _, length in self.holes)


def _reserve(req: Request, policy: str, max_seq_len: int) -> int:
    if policy == "max":
        return max_seq_len
    if policy == "oracle":
        return req.total_len
    if policy == "pow2":
        return min(max_seq_len, 1 << (req.total_len - 1).bit_length())
    raise ValueError(f"unknown reservation policy {policy!r}; choose 'max', 'pow2' or 'oracle'")


def _result(parts: dict, steps: int, running_sum: int, peak: int, extra: dict) -> dict:
    allocated = parts["token"] + parts["reserved"] + parts["internal"]
    total = sum(parts.values())
    return {"utilization": parts["token"] / allocated if allocated else 0.0,
            "fractions": {k: (v / total if total else 0.0) for k, v in parts.items()},
            "steady_steps": steps, "mean_running": running_sum / steps if steps else 0.0,
            "max_running": peak, **extra}


def simulate_contiguous(trace: list[Request], budget_tokens: int, policy: str = "max",
                        max_seq_len: int = 2048) -> dict:
    """Serve ``trace`` with contiguous reservations; return utilisation and the memory split."""
    arena, waiting = FirstFitArena(budget_tokens), deque(trace)
    running: list[list] = []                   # [request, tokens so far, start, reserved]
    parts, steps, running_sum, peak = dict.fromkeys(PARTS, 0), 0, 0, 0
    while waiting or running:
        for r in running:
            r[1] += 1
        for r in [r for r in running if r[1] >= r[0].total_len]:
            arena.free(r[2], r[3])
            running.remove(r)
        while waiting:
            need = _reserve(waiting[0], policy, max_seq_len)
            if need > budget_tokens:
                raise ValueError(f"a request reserves {need} slots, more than the budget "
                                 f"{budget_tokens}")
            start = arena.allocate(need)
            if start is None:
                break
            req = waiting.popleft()
            running.append([req, req.prompt_len, start, need])
        peak = max(peak, len(running))
        if not waiting:
            continue
        steps, running_sum = steps + 1, running_sum + len(running)
        for req, n, _, res in running:
            parts["token"] += n
            parts["reserved"] += req.total_len - n
            parts["internal"] += res - req.total_len
        fragmented = arena.free_slots >= _reserve(waiting[0], policy, max_seq_len)
        parts["external" if fragmented else "free"] += arena.free_slots
    return _result(parts, steps, running_sum, peak, {"design": f"contiguous-{policy}"})


def _grow_or_preempt(running: list, waiting: deque) -> int:
    """Every running request stores one more token; when the pool is empty the newest request
    is preempted (blocks freed, back to the head of the queue). Returns the preemptions."""
    preempted = 0
    for item in list(running):
        while item in running:
            try:
                item[1].append(1)
                break
            except BlockPoolExhausted:  # never alone: _refuse_oversized ran first
                victim = running.pop()
                victim[1].free()
                waiting.appendleft(victim[0])
                preempted += 1
    return preempted


def _refuse_oversized(trace: list[Request], alloc: BlockAllocator) -> None:
    """A request that needs more blocks than the whole pool could never finish: say so now."""
    for r in trace:
        if blocks_needed(r.total_len, alloc.block_size) > alloc.num_blocks:
            raise ValueError(f"a request of {r.total_len} tokens needs more than the pool's "
                             f"{alloc.num_blocks} blocks of {alloc.block_size}: raise the budget")


def simulate_paged(trace: list[Request], budget_tokens: int, block_size: int = 16) -> dict:
    """Serve ``trace`` with paged blocks (on-demand, preempt-newest); return the memory split."""
    alloc = BlockAllocator(budget_tokens // block_size, block_size)
    _refuse_oversized(trace, alloc)
    waiting: deque = deque(trace)
    running: list[tuple[Request, BlockTable]] = []
    parts, steps, running_sum, peak, preempted = dict.fromkeys(PARTS, 0), 0, 0, 0, 0
    while waiting or running:
        preempted += _grow_or_preempt(running, waiting)
        for item in [x for x in running if x[1].num_tokens >= x[0].total_len]:
            item[1].free()
            running.remove(item)
        while waiting and blocks_needed(waiting[0].prompt_len + 1, block_size) <= alloc.num_free:
            table = BlockTable(alloc)
            table.append(waiting[0].prompt_len)
            running.append((waiting.popleft(), table))
        peak = max(peak, len(running))
        if not waiting:
            continue
        steps, running_sum = steps + 1, running_sum + len(running)
        for _, table in running:
            parts["token"] += table.num_tokens
            parts["internal"] += len(table.blocks) * block_size - table.num_tokens
        parts["free"] += alloc.num_free * block_size + budget_tokens % block_size
    return _result(parts, steps, running_sum, peak,
                   {"design": f"paged-{block_size}", "preemptions": preempted})
