"""How much memory block sharing saves: parallel sampling, beam search, a shared system prompt.

All three run on the real allocator and block tables (fork = ref count + 1, copy-on-write of a
shared last block). The saving is the vLLM paper's measure (Kwon et al., 2023, arXiv:2309.06180,
§6.3, Fig. 15): "the number of blocks we saved by sharing divided by the number of total blocks
without sharing", summed over every decoding step:

    saving = 1 - Σ_t blocks in use(t) / Σ_t Σ_seq blocks_needed(len_seq(t))

* **parallel sampling** (n outputs of one prompt): the prompt's blocks are shared, every sample
  writes its own output blocks;
* **beam search** (width W): at every step each of the W new beams continues a parent beam
  chosen among the W old ones. The parents here come from a random draw, not from a model:
  the beam of rank r (0 = best) is chosen with probability ∝ 2^-r, so good beams have several
  children and weak ones die. This is our stand-in for real scores; beams that share a parent
  share every block up to the fork;
* **prefix caching**: every request starts with the same system prompt, served with a
  :class:`~llminfra.kvcache.prefix_cache.PrefixCachingAllocator`.

Taught in chapter 04.
"""

from __future__ import annotations

import torch

from llminfra.kvcache.blocks import BlockAllocator, BlockTable, blocks_needed
from llminfra.kvcache.prefix_cache import PrefixCachingAllocator, match_prefix, register_prefix
from llminfra.kvcache.trace import Request


def _logical_blocks(tables: list[BlockTable], block_size: int) -> int:
    return sum(blocks_needed(t.num_tokens, block_size) for t in tables)


def parallel_sampling_blocks(prompt_len: int, output_lens: list[int],
                             block_size: int = 16) -> tuple[int, int]:
    """``(Σ_t blocks used with sharing, Σ_t blocks without)`` for one prompt and n samples.

    Sample i stops after ``output_lens[i]`` tokens. Worked by hand, B = 4, prompt 8, two samples
    of 1 token: one step, sharing holds 2 prompt blocks + 2 private = 4 blocks, without sharing
    2 · 3 = 6.
    """
    alloc = BlockAllocator(blocks_needed(prompt_len + max(output_lens), block_size)
                           * len(output_lens) + 1, block_size)
    parent = BlockTable(alloc)
    parent.append(prompt_len)
    samples = [parent] + [parent.fork() for _ in output_lens[1:]]
    used = without = 0
    for step in range(max(output_lens)):
        live = [t for t, n in zip(samples, output_lens) if n > step]
        for t in live:
            t.append(1)
        used += alloc.num_used
        without += _logical_blocks(live, block_size)
        for t, n in zip(samples, output_lens):
            if n == step + 1:
                t.free()
    return used, without


def beam_search_blocks(prompt_len: int, output_len: int, width: int, generator: torch.Generator,
                       block_size: int = 16) -> tuple[int, int]:
    """``(Σ_t blocks used with sharing, Σ_t blocks without)`` for a simulated beam search.

    Parents drawn with probability ∝ 2^-rank from ``generator`` (see the module docstring).
    """
    alloc = BlockAllocator(blocks_needed(prompt_len + output_len, block_size) * 2 * width + 2,
                           block_size)
    root = BlockTable(alloc)
    root.append(prompt_len)
    beams = [root] + [root.fork() for _ in range(width - 1)]
    weights = torch.tensor([2.0 ** -r for r in range(width)], dtype=torch.float64)
    used = without = 0
    for _ in range(output_len):
        parents = torch.multinomial(weights, width, replacement=True, generator=generator)
        new = [beams[int(p)].fork() for p in parents.tolist()]
        for t in beams:
            t.free()
        for t in new:
            t.append(1)
        beams = new
        used += alloc.num_used
        without += _logical_blocks(beams, block_size)
    for t in beams:
        t.free()
    return used, without


def sharing_saving(pairs: list[tuple[int, int]]) -> float:
    """``1 - Σ used / Σ without`` over several requests' ``(used, without)`` pairs."""
    used = sum(u for u, _ in pairs)
    without = sum(w for _, w in pairs)
    return 1.0 - used / without if without else 0.0


def prefix_cache_run(trace: list[Request], system_prompt_len: int, generator: torch.Generator,
                     num_blocks: int, block_size: int = 16, concurrency: int = 8) -> dict:
    """Serve ``trace`` (each prompt = a shared system prompt + its own tokens), prefix-cached.

    Up to ``concurrency`` requests run at once; each generates its output, one token per step.
    Returns the token-level hit rate (prompt tokens found in the cache / prompt tokens) and the
    memory saved ``1 - Σ_t blocks in use / Σ_t blocks without sharing``.
    """
    alloc = PrefixCachingAllocator(num_blocks, block_size)
    system = torch.randint(0, 256, (system_prompt_len,), generator=generator).tolist()
    pending, running = list(trace), []
    hit_tokens = prompt_tokens = used = without = 0
    while pending or running:
        while pending and len(running) < concurrency:
            req = pending.pop(0)
            own = torch.randint(0, 256, (req.prompt_len,), generator=generator).tolist()
            tokens = system + own
            table, n_cached = match_prefix(alloc, tokens)
            table.append(len(tokens) - n_cached)
            register_prefix(alloc, table, tokens)
            hit_tokens, prompt_tokens = hit_tokens + n_cached, prompt_tokens + len(tokens)
            running.append([table, req.output_len])
        for item in running:
            item[0].append(1)
            item[1] -= 1
        used += alloc.num_used
        without += _logical_blocks([t for t, _ in running], block_size)
        for item in [x for x in running if x[1] <= 0]:
            item[0].free()
            running.remove(item)
    return {"hit_rate": hit_tokens / prompt_tokens, "memory_saved": 1.0 - used / without,
            "evictable_blocks_left": alloc.num_evictable}
