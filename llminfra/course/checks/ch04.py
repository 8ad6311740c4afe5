"""Answer checkers for chapter 04 (``solutions/04_kv_cache_and_paged_attention.ipynb``): a block
allocator with reference counts (allocate / free / fork), the slot mapping, and the waste of a
contiguous cache reserved at the maximum length.

Each checker draws fresh random cases, compares the learner's answer with the package's
(:mod:`llminfra.kvcache`) and names the usual mistake when the wrong answer matches it.

Design: Kwon et al., 2023 (vLLM, arXiv:2309.06180), §3.1 (reservation waste), §4.2 (block
tables, slot = block · B + offset), §4.4 (reference counts for shared blocks).
"""

from __future__ import annotations

import numbers
import random

from llminfra.course.checking import CheckFailed, fresh_rng, run_checks
from llminfra.kvcache.block_allocator import BlockAllocator, BlockPoolExhausted
from llminfra.kvcache.block_table import slot_mapping
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
                    "the FRONT of the free list, and put freed blocks at its END")
        if isinstance(e, list):
            return (f"reference counts became {g}, expected {e}: allocate sets 1, fork (incref) "
                    "adds 1, free subtracts 1 and returns the block to the free list only at 0")
        if isinstance(e, tuple) and e[0] == "free list":
            return f"free list is {g[1]}, expected {e[1]} (first in, first out)"
    return ""


def check_block_allocator(allocator_cls) -> int:
    """Drive the learner's class and the package's ``BlockAllocator`` through the same random
    operations; every returned id, reference count and the final free list must agree."""
    if not isinstance(allocator_cls, type):
        raise CheckFailed("check_block_allocator wants a class, got "
                          f"{type(allocator_cls).__name__}")
    rng = fresh_rng()
    cases = []
    for _ in range(8):
        n = rng.randint(1, 6)
        cases.append(((n, rng.choice([4, 16]), _random_ops(rng, n, rng.randint(4, 25))), {}))

    def learner(num_blocks, block_size, ops):
        return drive(allocator_cls, num_blocks, block_size, ops)

    def reference(num_blocks, block_size, ops):
        return drive(BlockAllocator, num_blocks, block_size, ops)

    return run_checks("block allocator", learner, reference, cases, hint=_allocator_hint)


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
    }
    for text, w in wrong.items():
        if w == got:
            return text
    return "expected slot = block_ids[p // block_size] * block_size + p % block_size"


def check_slot_mapping(fn) -> int:
    """``fn(block_ids, positions, block_size) -> list of slots`` against the package's."""
    rng = fresh_rng()
    cases = []
    for _ in range(10):
        B = rng.choice([2, 3, 4, 8, 16])
        n_blocks = rng.randint(2, 6)
        block_ids = rng.sample(range(40), n_blocks)
        positions = sorted(rng.sample(range(n_blocks * B), rng.randint(1, n_blocks * B)))
        cases.append(((block_ids, positions, B), {}))
    return run_checks("slot_mapping", fn, slot_mapping, cases, hint=_slot_hint)


# ----------------------------------------------------------- contiguous waste
def _waste_hint(args, kwargs, expected, got) -> str:
    lengths, max_len = args
    if not isinstance(got, numbers.Real):
        return f"return a share between 0 and 1 (a float), got {type(got).__name__}"
    if abs(got - (1 - expected)) < 1e-9:
        return "you returned the utilisation (used / reserved); the waste is 1 minus it"
    if abs(got - (1 - sum(lengths) / (len(lengths) * max(lengths)))) < 1e-9:
        return "each request reserves max_seq_len slots, not the longest request's length"
    if abs(got - (len(lengths) * max_len - sum(lengths))) < 1e-9:
        return "return a share of the reserved slots (between 0 and 1), not a count"
    return "expected 1 - sum(lengths) / (len(lengths) * max_seq_len)"


def check_contiguous_waste(fn) -> int:
    """``fn(lengths, max_seq_len) -> share of reserved slots left empty`` against the package's."""
    rng = fresh_rng()
    cases = []
    for _ in range(10):
        max_len = rng.choice([512, 1024, 2048, 4096])
        lengths = [rng.randint(1, max_len // 2) for _ in range(rng.randint(1, 12))]
        cases.append(((lengths, max_len), {}))
    return run_checks("contiguous_waste", fn, contiguous_waste, cases, rel=1e-9, abs_=1e-12,
                      hint=_waste_hint)
