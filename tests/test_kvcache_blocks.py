"""Block allocator, block tables, slot mapping, copy-on-write, prefix cache: unit tests and
property tests under random workloads."""

import pytest
from hypothesis import given, settings, strategies as st

from llminfra.kvcache import (BlockAllocator, BlockPoolExhausted, BlockTable,
                              PrefixCachingAllocator, blocks_needed, match_prefix,
                              prefix_block_hashes, register_prefix, slot_mapping)


def test_slot_mapping_by_hand():
    """blocks [7, 2], B = 4: positions 0, 3, 4, 6 -> 7·4+0, 7·4+3, 2·4+0, 2·4+2."""
    assert slot_mapping([7, 2], [0, 3, 4, 6], 4) == [28, 31, 8, 10]
    with pytest.raises(ValueError, match="outside"):
        slot_mapping([7, 2], [8], 4)


def test_blocks_needed_by_hand():
    """ceil(n / B): 0 tokens -> 0 blocks, 16 -> 1, 17 -> 2 (B = 16); B = 0 is an error."""
    assert [blocks_needed(n, 16) for n in (0, 16, 17)] == [0, 1, 2]
    with pytest.raises(ValueError, match="block_size"):
        blocks_needed(5, 0)
    with pytest.raises(ValueError, match="num_tokens"):
        blocks_needed(-1, 4)


def test_allocator_counts_and_errors():
    a = BlockAllocator(3, 4)
    b0, b1 = a.allocate(), a.allocate()
    assert (b0, b1, a.num_free, a.num_used) == (0, 1, 1, 2)
    a.incref(b0)
    assert a.ref_count(b0) == 2
    assert a.free(b0) is False and a.free(b0) is True
    with pytest.raises(ValueError, match="double free"):
        a.free(b0)
    with pytest.raises(ValueError, match="is free"):
        a.incref(b0)
    with pytest.raises(ValueError, match="outside"):
        a.ref_count(3)
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(0, 4)
    a.check_invariants()


def test_exhausted_pool_says_what_to_do():
    a = BlockAllocator(2, 4)
    a.allocate(), a.allocate()
    with pytest.raises(BlockPoolExhausted) as e:
        a.allocate()
    msg = str(e.value)
    assert "preempt" in msg and "swap" in msg and "wait" in msg


def test_table_append_is_all_or_nothing():
    a = BlockAllocator(3, 4)
    t = BlockTable(a)
    t.append(9)                                   # 3 blocks
    with pytest.raises(BlockPoolExhausted, match="preempt"):
        t.append(4)
    assert t.num_tokens == 9 and len(t.blocks) == 3
    a.check_invariants()


def test_fork_copies_only_the_partial_last_block():
    """Prompt of 6 tokens, B = 4: blocks [0, 1], block 1 half full. The child's first append
    copies block 1 into a fresh block 2; block 0 stays shared (ref count 2)."""
    a = BlockAllocator(8, 4)
    parent = BlockTable(a)
    parent.append(6)
    child = parent.fork()
    assert a.ref_count(0) == 2 and a.ref_count(1) == 2
    slots, copies = child.append(1)
    assert copies == [(1, 2)] and child.blocks == [0, 2] and slots == [2 * 4 + 2]
    assert a.ref_count(1) == 1 and a.ref_count(0) == 2
    _, copies = parent.append(1)                  # parent owns block 1 alone now: no copy
    assert copies == [] and parent.blocks == [0, 1]


# ---------------------------------------------------------------- property test
ops = st.lists(st.tuples(st.sampled_from(["new", "append", "fork", "free"]),
                         st.integers(0, 50), st.integers(1, 9)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops=ops, num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 2, 3, 4, 8]))
def test_random_workload_invariants(ops, num_blocks, block_size):
    """Blocks conserved, ref counts >= 0, a written block is never shared, every sequence reads
    back exactly its own tokens, and freeing everything returns every block."""
    a = BlockAllocator(num_blocks, block_size)
    store: dict[int, tuple] = {}                  # slot -> (token written)
    seqs: list[tuple[BlockTable, list]] = []
    counter = iter(range(10**6))
    for op, pick, n in ops:
        target = seqs[pick % len(seqs)] if seqs else None
        try:
            if op == "new" or target is None:
                seqs.append((BlockTable(a), []))
                target, op = seqs[-1], "append"
            if op == "append":
                slots, copies = target[0].append(n)
                for src, dst in copies:
                    for i in range(block_size):
                        if src * block_size + i in store:
                            store[dst * block_size + i] = store[src * block_size + i]
                for s in slots:
                    assert a.ref_count(s // block_size) == 1, "wrote into a shared block"
                    store[s] = next(counter)
                    target[1].append(store[s])
            elif op == "fork":
                seqs.append((target[0].fork(), list(target[1])))
            elif op == "free":
                target[0].free()
                seqs.remove(target)
        except BlockPoolExhausted:
            pass
        a.check_invariants()
        for table, tokens in seqs:
            assert [store[s] for s in table.slots()] == tokens
    for table, _ in seqs:
        table.free()
    assert a.num_free == num_blocks and all(r == 0 for r in a.ref_counts())


# ---------------------------------------------------------------- prefix cache
def test_prefix_hash_depends_on_the_whole_prefix():
    h1 = prefix_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    h2 = prefix_block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(h1) == 2 and h1[0] != h2[0] and h1[1] != h2[1]   # same 2nd block, other prefix
    assert prefix_block_hashes([1, 2, 3], 4) == []


def test_prefix_hit_and_lru_eviction():
    a = PrefixCachingAllocator(4, 2)
    t1, n = match_prefix(a, [1, 2, 3, 4, 5])
    assert n == 0
    t1.append(5)
    register_prefix(a, t1, [1, 2, 3, 4, 5])
    blocks = list(t1.blocks)
    t1.free()
    assert a.num_evictable == 2 and a.num_free == 4
    t2, n = match_prefix(a, [1, 2, 3, 4, 9])
    assert n == 4 and t2.blocks == blocks[:2]
    t2.free()
    fresh = [a.allocate() for _ in range(3)]      # free list (2) first, then the LRU block
    assert blocks[0] in fresh and blocks[1] not in fresh
    a.check_invariants()


@settings(max_examples=40, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1,
                        max_size=8), num_blocks=st.integers(4, 12), keep=st.integers(0, 3))
def test_prefix_cache_invariants(prompts, num_blocks, keep):
    """Random prompts over a 4-letter alphabet (many shared prefixes), at most ``keep`` alive
    at once, LRU eviction under pressure. The "K/V" of position p is modelled as the prefix
    tokens[:p + 1] (what real K/V depend on): every hit must hold exactly that."""
    a = PrefixCachingAllocator(num_blocks, 2)
    store: dict[int, tuple] = {}
    live = []
    for tokens in prompts:
        try:
            table, n = match_prefix(a, tokens)
            slots, _ = table.append(len(tokens) - n)
        except BlockPoolExhausted:
            table.free()
            continue
        for p, slot in zip(range(n, len(tokens)), slots):
            store[slot] = tuple(tokens[:p + 1])
        assert [store[s] for s in table.slots()] == [tuple(tokens[:p + 1])
                                                     for p in range(len(tokens))]
        register_prefix(a, table, tokens)
        live.append(table)
        if len(live) > keep:
            live.pop(0).free()
        a.check_invariants()
    for t in live:
        t.free()
    assert a.num_free == num_blocks and all(r == 0 for r in a.ref_counts())


# ---------------------------------------------------------------- hardening (issue 13)
def test_blocks_needed_and_append_want_integers():
    """blocks_needed(5, 2.5) used to return 2.0 and append(2.5) a raw TypeError."""
    for bad in ((5, 2.5), (2.5, 4), (True, 4), (5, "4")):
        with pytest.raises(ValueError, match="integer"):
            blocks_needed(*bad)
    t = BlockTable(BlockAllocator(4, 2))
    for bad in (2.5, "3", None, True):
        with pytest.raises(ValueError, match="integer"):
            t.append(bad)
    assert t.blocks == [] and t.num_tokens == 0


def test_failed_append_on_a_fork_changes_nothing():
    """All or nothing must count the copy-on-write block. B = 4, pool of 3 blocks: the parent
    holds 6 tokens in blocks [0, 1] (block 1 half full), the child shares both; one block is
    free. The child appending 3 tokens needs a copy of block 1 (2 slots left there) AND one
    new block for the 7th..9th positions' overflow: 2 > 1 free, so it must fail and leave the
    tables, reference counts and free list exactly as they were."""
    a = BlockAllocator(3, 4)
    parent = BlockTable(a)
    parent.append(6)
    child = parent.fork()
    before = (list(child.blocks), child.num_tokens, list(a.ref_counts()), a.num_free)
    with pytest.raises(BlockPoolExhausted, match="2 more blocks"):
        child.append(3)
    assert (child.blocks, child.num_tokens, a.ref_counts(), a.num_free) == before
    assert parent.blocks == [0, 1] and parent.num_tokens == 6
    a.check_invariants()
    slots, copies = child.append(2)     # fits: the copy of block 1 takes the free block
    assert copies == [(1, 2)] and slots == [2 * 4 + 2, 2 * 4 + 3]


def test_fully_cached_block_aligned_prompt_leaves_the_last_token_to_compute():
    """Prompt of 4 tokens, B = 2, both blocks cached: match_prefix must hand back only the
    first block (2 tokens), so the model still runs the last prompt token and gets logits
    for the next one; the last block stays in the cache for others."""
    a = PrefixCachingAllocator(4, 2)
    prompt = [5, 6, 7, 8]
    t1, n = match_prefix(a, prompt)
    t1.append(len(prompt) - n)
    register_prefix(a, t1, prompt)
    t2, n = match_prefix(a, prompt)
    assert n == 2 and t2.blocks == t1.blocks[:1]
    slots, _ = t2.append(len(prompt) - n)
    assert len(slots) == 2 and t2.num_tokens == 4
    assert (a.hits, a.queries) == (1, 2)          # each call looked up the first block only
    t1.free(), t2.free()
    a.check_invariants()
