"""Tiles for the Triton FlashAttention, chosen by timing (a small autotune).

A FlashAttention kernel's speed depends on its tile: BLOCK_M query rows and BLOCK_N keys per
step, the warps that share the work and the pipeline stages that prefetch the next key block.
No one tile is best everywhere (the first GPU run measured 0.44–0.72 of SDPA with one fixed
tile, and up to 0.65 / 0.70 / 0.79 with the best of a sweep at d = 128 / d = 128 causal /
d = 64). So, as Triton's own ``triton.autotune`` does, :func:`tuned_tiles` times a few
candidates once per (device, head dim, causal, dtype) and keeps the fastest for the process.

Candidates (block_m, block_n, num_warps, num_stages) are :data:`TILES`: the sweep's winners
and their neighbours. Chapter 06.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: (block_m, block_n, num_warps, num_stages) candidates
TILES = ((128, 64, 4, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 3), (128, 32, 4, 3),
         (64, 32, 4, 2))

#: the tile chosen per (device name, d, causal, dtype): the process's memory of its autotune
_CHOSEN: dict[tuple, tuple[int, int, int, int]] = {}


def cuda_time_s(fn: Callable[[], object], repeats: int = 5) -> float:
    """Best seconds of ``fn()`` on the current CUDA stream (events around each call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def tune_tiles(run: Callable[[tuple], object], candidates=TILES,
               time_s: Callable[[Callable[[], object]], float] = cuda_time_s) -> dict:
    """Time ``run(tile)`` for every candidate tile; the fastest and every timing. A tile that
    fails to compile or launch (too much shared memory on a smaller GPU) is left out, with its
    error."""
    times, errors = {}, {}
    for tile in candidates:
        try:
            times[tile] = time_s(lambda: run(tile))
        except Exception as err:  # noqa: BLE001 - a tile this device cannot run
            errors[tile] = f"{type(err).__name__}: {err}"
    if not times:
        raise RuntimeError(f"no tile ran: {errors}")
    return {"best": min(times, key=times.get), "times_s": times, "errors": errors}


def _key(q: torch.Tensor, causal: bool) -> tuple:
    return torch.cuda.get_device_name(q.device), q.shape[-1], bool(causal), q.dtype


def tuned_tiles(q: torch.Tensor, causal: bool, run: Callable[[tuple], object]) -> tuple:
    """The tile for q's device, head dim, dtype and ``causal``: timed once with ``run`` (on
    these inputs), then remembered."""
    key = _key(q, causal)
    if key not in _CHOSEN:
        _CHOSEN[key] = tune_tiles(run)["best"]
    return _CHOSEN[key]


def chosen_tile(q: torch.Tensor, causal: bool) -> tuple | None:
    """The tile :func:`tuned_tiles` chose for inputs like ``q``, or None before it ran."""
    return _CHOSEN.get(_key(q, causal))
