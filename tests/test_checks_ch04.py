"""Chapter 04 checkers: each passes on the package's own answer and fails, with the right
diagnosis, on the usual wrong answers."""

from collections import deque

import pytest

from llminfra.course.checking import CheckFailed, NotAttempted
from llminfra.course.checks import ch04
from llminfra.kvcache import BlockAllocator, BlockPoolExhausted, contiguous_waste, slot_mapping


class LifoAllocator(BlockAllocator):
    """Wrong: hands out the most recently freed block first."""

    def allocate(self):
        if not self._free:
            raise BlockPoolExhausted("empty")
        b = self._free.pop()
        self._ref[b] = 1
        return b


class NoRefCount:
    """Wrong: fork does not add a holder, free always returns the block."""

    def __init__(self, num_blocks, block_size):
        self.free_ids, self.ref = deque(range(num_blocks)), [0] * num_blocks

    def allocate(self):
        if not self.free_ids:
            raise BlockPoolExhausted("empty")
        b = self.free_ids.popleft()
        self.ref[b] = 1
        return b

    def incref(self, b):
        pass

    def free(self, b):
        self.ref[b] = 0
        self.free_ids.append(b)

    def ref_count(self, b):
        return self.ref[b]

    def free_list(self):
        return list(self.free_ids)


class ReturnsNone(NoRefCount):
    """Wrong: returns None instead of raising when the pool is empty."""

    def incref(self, b):
        self.ref[b] += 1

    def free(self, b):
        self.ref[b] -= 1
        if self.ref[b] == 0:
            self.free_ids.append(b)

    def allocate(self):
        if not self.free_ids:
            return None
        return super().allocate()


def test_checkers_pass_on_the_package():
    assert ch04.check_block_allocator(BlockAllocator) == 8
    assert ch04.check_slot_mapping(slot_mapping) == 10
    assert ch04.check_contiguous_waste(contiguous_waste) == 10


@pytest.mark.parametrize("attempt", range(3))
@pytest.mark.parametrize("wrong, message", [
    (NoRefCount, "reference counts became"),
    (ReturnsNone, "must raise BlockPoolExhausted"),
])
def test_allocator_diagnoses(attempt, wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ch04.check_block_allocator(wrong)


@pytest.mark.parametrize("seed", range(5))
def test_lifo_allocator_fails_on_the_fixed_case(seed):
    """Case 1 frees two blocks and allocates again: LIFO reuse shows in every run."""
    with pytest.raises(CheckFailed, match=r"case 1 of 8[\s\S]*allocate returned"):
        ch04.check_block_allocator(LifoAllocator, seed=seed)


class IndexErrorWhenEmpty(ReturnsNone):
    def allocate(self):
        b = self.free_ids.popleft()
        self.ref[b] = 1
        return b


def test_allocator_raising_the_wrong_error_when_empty():
    with pytest.raises(CheckFailed, match="raised IndexError.*raise BlockPoolExhausted instead"):
        ch04.check_block_allocator(IndexErrorWhenEmpty)


@pytest.mark.parametrize("convert", [
    lambda xs: __import__("torch").tensor(xs), lambda xs: __import__("numpy").array(xs),
    lambda xs: __import__("numpy").array(xs, dtype="int32"), tuple])
def test_slot_mapping_any_sequence_type(convert):
    """A tensor or NumPy array of the right slots was rejected or crashed the checker."""
    assert ch04.check_slot_mapping(lambda b, p, B: convert(slot_mapping(b, p, B))) == 10


def test_slot_mapping_wrong_tensor_gets_the_hint():
    import torch
    with pytest.raises(CheckFailed, match="multiply the block id"):
        ch04.check_slot_mapping(lambda b, p, B: torch.tensor([b[i // B] + i % B for i in p]))


def test_allocator_checker_wants_a_class():
    with pytest.raises(CheckFailed, match="wants a class"):
        ch04.check_block_allocator(BlockAllocator(2, 2))


@pytest.mark.parametrize("wrong, message", [
    (lambda b, p, B: [b[i // B] + i % B for i in p], "multiply the block id"),
    (lambda b, p, B: [i for i in p], "logical block index"),
    (lambda b, p, B: [b[i // B] * B + i // B for i in p], "offset"),
])
def test_slot_mapping_diagnoses(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ch04.check_slot_mapping(wrong)


@pytest.mark.parametrize("wrong, message", [
    (lambda ls, m: sum(ls) / (len(ls) * m), "utilisation"),
    (lambda ls, m: 1 - sum(ls) / (len(ls) * max(ls)), "not the longest request"),
    (lambda ls, m: len(ls) * m - sum(ls), "not a count"),
])
def test_contiguous_waste_diagnoses(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ch04.check_contiguous_waste(wrong)


def test_stub_fails_with_not_implemented():
    def stub(*args):
        raise NotImplementedError("your code here")
    with pytest.raises(NotAttempted, match="not implemented"):
        ch04.check_slot_mapping(stub)

    class StubAllocator:
        def __init__(self, num_blocks, block_size):
            raise NotImplementedError("your code here")
    with pytest.raises(NotAttempted):
        ch04.check_block_allocator(StubAllocator)


@pytest.mark.parametrize("check", [ch04.check_slot_mapping, ch04.check_contiguous_waste])
def test_forgotten_return_is_a_check_failure(check):
    """A body without ``return`` gives None: the checker must say so, not crash in a hint."""
    with pytest.raises(CheckFailed, match="returned None"):
        check(lambda *args: None)


# ---- every branch has a fixed case: a wrong answer that ignores one fails on every seed, there
SEEDS = range(8)


class MinIdAllocator(BlockAllocator):
    """Wrong: hands out the lowest free id (a heap or a sorted list), not the oldest freed."""

    def allocate(self):
        if not self._free:
            raise BlockPoolExhausted("empty")
        b = min(self._free)
        self._free.remove(b)
        self._ref[b] = 1
        return b


class FreeAlwaysReturns(ReturnsNone):
    """Wrong: counts holders, but every free puts the block back on the free list."""

    def allocate(self):
        return NoRefCount.allocate(self)

    def free(self, b):
        self.ref[b] -= 1
        self.free_ids.append(b)


class FreeToFront(ReturnsNone):
    """Wrong: a freed block goes to the FRONT of the free list (a stack)."""

    def allocate(self):
        return NoRefCount.allocate(self)

    def free(self, b):
        self.ref[b] -= 1
        if self.ref[b] == 0:
            self.free_ids.appendleft(b)


class SortedPopLast(LifoAllocator):
    """Wrong: keeps the free list sorted (bisect.insort) and pops its end, the highest id."""

    def _release(self, block_id):
        import bisect
        free = list(self._free)
        bisect.insort(free, block_id)
        self._free = deque(free)


class SortedFreeList(BlockAllocator):
    """Wrong: hands blocks out first in, first out, but reports its free list sorted by id."""

    def free_list(self):
        return sorted(self._free)


@pytest.mark.parametrize("wrong, message", [
    (LifoAllocator, "allocate returned"), (MinIdAllocator, "allocate returned"),
    (SortedPopLast, "allocate returned"),
    (SortedFreeList, r"free list is \[0, 2\], expected \[2, 0\].*yours is sorted"),
    (FreeToFront, "allocate returned"), (NoRefCount, "reference counts became"),
    (FreeAlwaysReturns, r"free list is \[2, 0, 0\], expected \[2, 0\]"),
    (ReturnsNone, "must raise BlockPoolExhausted"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_allocator_slips_fail_every_run_at_case_1(wrong, message, seed):
    """Case 1 exhausts the pool, frees blocks 1, 0 and 2, allocates twice (FIFO gives 1, then
    0), forks block 0 and frees it twice (free list [2, 0]): each branch of the allocator, and
    FIFO order against a sorted list or heap popped from either end, in every run."""
    assert ch04.check_block_allocator(BlockAllocator, seed=seed) == 8
    with pytest.raises(CheckFailed, match=message) as e:
        ch04.check_block_allocator(wrong, seed=seed)
    assert "case 1 of 8: " in str(e.value) and "exhaust, free, reuse in FIFO order" in str(e.value)


@pytest.mark.parametrize("wrong, message", [
    (lambda b, p, B: [b[i // B] + i % B for i in p], "multiply the block id"),
    (lambda b, p, B: list(p), "logical block index"),
    (lambda b, p, B: [b[i // B] * B + i // B for i in p], "offset"),
    (lambda b, p, B: [b[i // B] * len(b) + i % B for i in p], "not by the number of blocks"),
    (lambda b, p, B: [b[0] * B + i for i in p], "expected slot"),
    (lambda b, p, B: [min(b) * B + i for i in p], "expected slot"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_slot_mapping_slips_fail_every_run_at_case_1(wrong, message, seed):
    """Case 1's table is descending, its ids are not their indices and block_size exceeds its
    length: an identity table, a table read as one contiguous run from its first (or lowest)
    block, or a product with the table's length cannot pass it."""
    with pytest.raises(CheckFailed, match=message) as e:
        ch04.check_slot_mapping(wrong, seed=seed)
    assert "case 1 of 10: block table" in str(e.value) and "descending" in str(e.value)


@pytest.mark.parametrize("wrong, message", [
    (lambda ls, m: 1 - sum(ls) / (len(ls) * max(ls)), "not the longest request"),
    (lambda ls, m: sum(ls) / (len(ls) * m), "utilisation"),
    (lambda ls, m: len(ls) * m - sum(ls), "not a count"),
])
@pytest.mark.parametrize("seed", SEEDS)
def test_contiguous_waste_slips_fail_every_run_at_case_1(wrong, message, seed):
    """Case 1 is one request shorter than max_seq_len: sized by the longest request it would
    waste nothing."""
    with pytest.raises(CheckFailed, match=message) as e:
        ch04.check_contiguous_waste(wrong, seed=seed)
    assert "case 1 of 10: 1 request(s)" in str(e.value)
