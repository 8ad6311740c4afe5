"""Weights on 2 MB pages: what a decode step that streams all of them asks of the TLB.

A decode step at batch 1 reads every weight once: SmolLM2-135M's int4 matrices are 84 MB,
21,000 pages of 4 kB, more than the second-level TLB maps (some 2,000 entries), so every new
page costs a page walk on top of its cache misses. Linux backs anonymous memory with 2 MB pages
where the program asks (``madvise(MADV_HUGEPAGE)``; ``/sys/kernel/mm/transparent_hugepage``
says ``madvise`` on most distributions, ``always`` on some): 42 pages. PyTorch's allocator does
not ask, so :class:`Arena` holds the weights in memory that does: the w4a8 codes and scales
(:func:`llminfra.kernels.w4a8.w4a8_linear`) and the fp32 panels
(:mod:`llminfra.kernels.f32_skinny`). What that buys depends on the TLB and on how many cores
share the misses: most on one thread, little once a second core's misses hide the page walks;
chapter 12 measures it on the machine running it. Where the kernel gives no huge page (a
``never`` setting, macOS: Python's ``mmap`` has no ``MADV_HUGEPAGE`` there) the arena is
ordinary memory and the same bits. Chapters 08 and 12.
"""

from __future__ import annotations

import mmap

import torch

#: the size of a huge page on x86-64 and most arm64 kernels
HUGE_PAGE = 2 << 20
#: memory asked for at a time; a larger tensor gets a mapping of its own size
CHUNK = 16 << 20
#: each tensor starts on a cache line
ALIGN = 64


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class Arena:
    """Copies of tensors in anonymous memory advised to use huge pages (:data:`HUGE_PAGE`),
    allocated :data:`CHUNK` at a time and never freed while a copy lives (each copy holds its
    mapping). ``huge`` is False where Python's ``mmap`` cannot advise it (not Linux): the
    copies are then in ordinary pages."""

    huge = hasattr(mmap, "MADV_HUGEPAGE")

    def __init__(self):
        self._map: mmap.mmap | None = None
        self._used = self._size = 0

    def _grow(self, nbytes: int) -> None:
        self._size = max(CHUNK, _round_up(nbytes, HUGE_PAGE))
        self._map = mmap.mmap(-1, self._size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if self.huge:
            self._map.madvise(mmap.MADV_HUGEPAGE)
        self._used = 0

    def empty(self, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A 1-D tensor of ``numel`` values of ``dtype`` in the arena (uninitialised: zeros)."""
        nbytes = numel * dtype.itemsize
        if not nbytes:
            return torch.empty(0, dtype=dtype)
        if self._map is None or self._used + nbytes > self._size:
            self._grow(nbytes)
        out = torch.frombuffer(self._map, dtype=torch.uint8, count=nbytes, offset=self._used)
        self._used = _round_up(self._used + nbytes, ALIGN)
        return out.view(dtype)

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of the CPU tensor ``t`` (same dtype, shape and values) in the
        arena."""
        if t.device.type != "cpu":
            raise ValueError(f"the arena holds CPU tensors, got one on {t.device}")
        out = self.empty(t.numel(), t.dtype).view(t.shape)
        out.copy_(t)
        return out
