"""Answer checkers for chapter 04 (``solutions/04_kv_cache_and_paged_attention.ipynb``): a block
allocator with reference counts (allocate / free / fork), the slot mapping, and the waste of a
contiguous cache reserved at the maximum length.

Each checker builds named cases from one seed — for the allocator always an exhausted pool, a
block freed and handed out again in first-in-first-out order, and a forked (shared) block freed
by one holder; for the slot mapping a descending table of three blocks (no block at its own
index) of 4 to 16 tokens each, every position in it; for the waste one request alone — compares
the learner's answer with the package's (:mod:`llminfra.kvcache`) and names the usual mistake
the wrong answer matches. A slot mapping may be a list, tuple, NumPy array or tensor.

Design: Kwon et al., 2023 (vLLM, arXiv:2309.06180), §3.1 (reservation waste), §4.2 (block
tables, slot = block · B + offset), §4.4 (reference counts for shared blocks).
"""

from __future__ import annotations

import random

from llminfra.course.checking import Case, CheckFailed, checker, run_checks, seeded
from llminfra.kvcache.blocks import BlockAllocator, BlockPoolExhausted, slot_mapping
from llminfra.kvcache.contiguous import contiguous_waste


# ------------------------------------------------------------------ allocator
def _random_ops(rng: random.Random, num_blocks: int, n_ops: int) -> list[tuple]:
    """Random operations; ``drive`` applies free / fork to a block that is in use, and enough
    allocations come first that the pool is sometimes exhausted."""
    ops = [("allocate",)] * rng.randint(1, num_blocks + 1)
    for _ in range(n_ops):
        kind = rng.choice(["allocate", "free", "fork"])
        ops.append((kind,) if kind == "allocate" else (kind, rng.randrange(num_blocks)))
    return ops


def drive(allocator_cls, num_blocks: int, block_size: int, ops: list[tuple]) -> list:
    """Run ``ops`` on a fresh ``allocator_cls(num_blocks, block_size)``; record what happens.

    ``("allocate",)`` records the id returned (or ``"exhausted"`` when
    :class:`BlockPoolExhausted` is raised); ``("free", i)`` / ``("fork", i)`` apply to the i-th
    *currently used* block in ascending id order (skipped if none). After every op the record
    gets the list of reference counts; at the end, the free list.
    """
    a = allocator_cls(num_blocks, block_size)
    log = []
    for op in ops:
        used = [b for b in range(num_blocks) if a.ref_count(b) > 0]
        if op[0] == "allocate":
            try:
                log.append(("allocate", a.allocate()))
            except BlockPoolExhausted:
                log.append(("allocate", "exhausted"))
            except (IndexError, KeyError, ValueError, RuntimeError) as e:
                if used and len(used) < num_blocks:
                    raise
                raise CheckFailed(f"allocate() on a pool with no free block raised "
                                  f"{type(e).__name__}: {e}; raise BlockPoolExhausted instead "
                                  "(the caller then preempts, swaps or waits)") from None
        elif used:
            b = used[op[1] % len(used)]
            (a.free if op[0] == "free" else a.incref)(b)
            log.append((op[0], b))
        log.append([a.ref_count(b) for b in range(num_blocks)])
    log.append(("free list", list(a.free_list())))
    return log


def _allocator_hint(args, kwargs, expected, got) -> str:
    for e, g in zip(expected, got):
        if e == g:
            continue
        if e == ("allocate", "exhausted"):
            return "when no block is free, allocate must raise BlockPoolExhausted"
        if isinstance(e, tuple) and e[0] == "allocate":
            return (f"allocate returned {g[1]!r}, expected block {e[1]}: hand out the block at "
                    "the FRONT of the free list, and put freed blocks at its END (first in, "
                    "first out: not the lowest or highest free id, not the last one freed)")
        if isinstance(e, list):
            return (f"reference counts became {g}, expected {e}: allocate sets 1, fork (incref) "
                    "adds 1, free subtracts 1 and returns the block to the free list only at 0")
        if isinstance(e, tuple) and e[0] == "free list":
            told = f"free list is {g[1]}, expected {e[1]} (first in, first out)"
            if isinstance(g[1], list) and sorted(g[1]) == sorted(e[1]) and g[1] != e[1] and \
                    g[1] in (sorted(g[1]), sorted(g[1], reverse=True)):
                told += (": yours is sorted by id; a freed block goes to the END of the list, "
                         "in the order blocks were freed (a deque, not a sorted list or heap)")
            return told
    return ""


def _fixed_ops(num_blocks: int) -> list[tuple]:
    """Exhaust the pool; free blocks 1, 0 and 2 in that order (free list [1, 0, 2]: its front
    is neither the lowest nor the highest id, so a sorted list or a heap, popped from either
    end, hands out another block); allocate twice (1, then 0); fork block 0 and free it once
    (still used), then again (back to the free list, after 2). The free list ends as [2, 0]:
    descending, so a list kept sorted shows there too. ``num_blocks`` ≥ 3."""
    # ("free", i) frees the i-th used block in ascending order: 1, then 0, then 2
    return ([("allocate",)] * (num_blocks + 1) + [("free", 1), ("free", 0), ("free", 0),
                                                  ("allocate",), ("allocate",), ("fork", 0),
                                                  ("free", 0), ("free", 0)])


def _ops_name(num_blocks: int, block_size: int, ops: list[tuple], what: str) -> str:
    return f"{num_blocks} blocks of {block_size} tokens, {len(ops)} operations ({what})"


@checker
def check_block_allocator(allocator_cls, seed: int | None = None) -> int:
    """Drive the learner's class and the package's ``BlockAllocator`` through the same
    operations; every returned id, reference count and the final free list must agree. Case 1
    is fixed (exhaustion, FIFO reuse, fork then free); the rest are random."""
    if not isinstance(allocator_cls, type):
        raise CheckFailed("check_block_allocator wants a class, got "
                          f"{type(allocator_cls).__name__}")
    seed, rng = seeded(seed)
    n = rng.randint(3, 6)
    ops = _fixed_ops(n)
    cases = [Case(_ops_name(n, 16, ops, "exhaust, free, reuse in FIFO order (not sorted), "
                                        "fork, free twice"),
                  (n, 16, ops))]
    for _ in range(7):
        n = rng.randint(1, 6)
        ops = _random_ops(rng, n, rng.randint(4, 25))
        bs = rng.choice([4, 16])
        cases.append(Case(_ops_name(n, bs, ops, "random"), (n, bs, ops)))

    def learner(num_blocks, block_size, ops):
        return drive(allocator_cls, num_blocks, block_size, ops)

    def reference(num_blocks, block_size, ops):
        return drive(BlockAllocator, num_blocks, block_size, ops)

    return run_checks("block allocator", learner, reference, cases, hint=_allocator_hint,
                      seed=seed, replay="ch04.check_block_allocator", owner=allocator_cls)


# --------------------------------------------------------------- slot mapping
def _slot_hint(args, kwargs, expected, got) -> str:
    blocks, positions, B = args
    wrong = {
        "you forgot to multiply the block id by block_size":
            [blocks[p // B] + p % B for p in positions],
        "you used the logical block index p // B instead of looking it up in the block table":
            [(p // B) * B + p % B for p in positions],
        "you swapped the offset: use p % block_size inside the block":
            [blocks[p // B] * B + p // B for p in positions],
        "multiply the block id by block_size (tokens per block), not by the number of blocks "
        "in the table": [blocks[p // B] * len(blocks) + p % B for p in positions],
    }
    for text, w in wrong.items():
        if w == got:
            return text
    return "expected slot = block_ids[p // block_size] * block_size + p % block_size"


@checker
def check_slot_mapping(fn, seed: int | None = None) -> int:
    """``fn(block_ids, positions, block_size) -> slots`` (any sequence, array or tensor)
    against the package's; every case has positions in at least two blocks. Case 1: a block
    table in descending order (no id is its index, the blocks are not one contiguous run),
    block_size above the table's length, every position of its three blocks."""
    seed, rng = seeded(seed)
    B = rng.choice([4, 8, 16])
    block_ids = sorted(rng.sample(range(8, 40), 3), reverse=True)
    cases = [Case(f"block table {block_ids} (descending, no block at its own index), block_size "
                  f"{B}, all {3 * B} positions", (block_ids, list(range(3 * B)), B))]
    for _ in range(9):
        B = rng.choice([2, 3, 4, 8, 16])
        n_blocks = rng.randint(2, 6)
        block_ids = rng.sample(range(40), n_blocks)
        positions = sorted(set(rng.sample(range(n_blocks * B), rng.randint(1, n_blocks * B)))
                           | {rng.randrange(B), B + rng.randrange(B)})
        cases.append(Case(f"block table {block_ids}, block_size {B}, {len(positions)} positions",
                          (block_ids, positions, B)))
    return run_checks("slot_mapping", fn, slot_mapping, cases, hint=_slot_hint, seed=seed,
                      replay="ch04.check_slot_mapping")


# ----------------------------------------------------------- contiguous waste
def _waste_hint(args, kwargs, expected, got) -> str:
    lengths, max_len = args
    if abs(got - (1 - expected)) < 1e-9:
        return "you returned the utilisation (used / reserved); the waste is 1 minus it"
    if abs(got - (1 - sum(lengths) / (len(lengths) * max(lengths)))) < 1e-9:
        return "each request reserves max_seq_len slots, not the longest request's length"
    if abs(got - (len(lengths) * max_len - sum(lengths))) < 1e-9:
        return "return a share of the reserved slots (between 0 and 1), not a count"
    return "expected 1 - sum(lengths) / (len(lengths) * max_seq_len)"


@checker
def check_contiguous_waste(fn, seed: int | None = None) -> int:
    """``fn(lengths, max_seq_len) -> share of reserved slots left empty`` against the
    package's; one request alone and several of different lengths in every run."""
    seed, rng = seeded(seed)
    cases = []
    for k in range(10):
        max_len = rng.choice([512, 1024, 2048, 4096])
        lengths = [rng.randint(1, max_len // 2) for _ in range(1 if k == 0 else rng.randint(2, 12))]
        cases.append(Case(f"{len(lengths)} request(s) of lengths {lengths}, max_seq_len {max_len}",
                          (lengths, max_len)))
    return run_checks("contiguous_waste", fn, contiguous_waste, cases, rel=1e-9, abs_=1e-12,
                      hint=_waste_hint, seed=seed, replay="ch04.check_contiguous_waste")
