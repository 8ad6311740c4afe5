"""The scheduler's rules in closed form, on plain numbers: first-come-first-served admission
under a block budget, latency metrics from timestamps, and the step plan of chunked prefill.

The engine applies these rules to live requests; here they are pure functions over lengths and
counts, so chapter 05 can state them, the exercises can be graded against them, and a test can
tie them to what :class:`~llminfra.engine.LLMEngine` actually schedules.

* Admission (continuous batching; Yu et al., 2022, *Orca*, OSDI '22, iteration-level
  scheduling; Kwon et al., 2023, vLLM, arXiv:2309.06180, §4.5): at each step the scheduler
  takes waiting requests **in arrival order** while (a) the running batch has fewer than
  ``max_num_seqs`` requests, (b) the prompt's blocks ``⌈P / B⌉`` fit in the free blocks, and
  (c) the prompt tokens of the step stay within ``max_num_batched_tokens``. It stops at the first
  request that does not fit, even if a later, smaller one would (no overtaking: FCFS fairness).
* TTFT = t(first token) − t(arrival); time per output token (TPOT) =
  (t(last token) − t(first token)) / (n − 1), undefined for n < 2.
* Chunked prefill (Agrawal et al., 2024, *Sarathi-Serve*, arXiv:2403.02310): every step
  has a budget of ``max_num_batched_tokens``; running decodes take one token each first, the
  rest goes to prefills in arrival order, a prompt cut into chunks across steps; a prompt whose
  prefill is done decodes from the next step on.

Taught in chapter 05.
"""

from __future__ import annotations

from llminfra.engine.metrics import tpot, ttft

from llminfra.kvcache.blocks import blocks_needed  # ⌈tokens / block_size⌉


def admit_fcfs(waiting_prompt_lens: list[int], *, free_blocks: int, block_size: int,
               num_running: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """How many requests at the head of the waiting queue are admitted this step.

    Worked example: waiting prompts [20, 40, 5], B = 16, 4 free blocks, 1 running,
    ``max_num_seqs`` 4, budget 64 tokens: the first needs 2 blocks (2 left, 20 tokens); the
    second needs 3 > 2 — stop. Admitted: 1 (the third would fit, but does not overtake).
    """
    admitted, blocks, tokens = 0, free_blocks, 0
    for p in waiting_prompt_lens:
        need = blocks_needed(p, block_size)
        if (num_running + admitted >= max_num_seqs or need > blocks
                or tokens + p > max_num_batched_tokens):
            break
        admitted, blocks, tokens = admitted + 1, blocks - need, tokens + p
    return admitted


def ttft_tpot(arrival_s: float, token_times_s: list[float]) -> tuple[float, float | None]:
    """``(TTFT, TPOT)`` in seconds from a request's arrival and its tokens' times.

    Arrival 0.0, tokens at [0.5, 0.6, 0.8]: TTFT 0.5, TPOT (0.8 − 0.5) / 2 = 0.15.
    One token: TPOT is ``None``.
    """
    if not token_times_s:
        raise ValueError("a request with no tokens has no TTFT")
    return (ttft(arrival_s, token_times_s[0]),
            tpot(token_times_s[0], token_times_s[-1], len(token_times_s)))


def chunked_prefill_plan(prompt_lens: list[int], max_num_batched_tokens: int,
                         num_decodes: int = 0) -> list[list[int]]:
    """Prefill tokens per step and prompt: row s, column i = tokens of prompt i run in step s.

    ``num_decodes`` requests are decoding from the start; each prompt joins them (one token a
    step) after its last chunk. Worked example: prompts [10, 3], budget 8, 2 decodes ->
    step 1: 2 decode + 6 of prompt 0; step 2: 2 decode + 4 (prompt 0 done) + 2 of prompt 1;
    step 3: 3 decode + 1 -> ``[[6, 0], [4, 2], [0, 1]]``.
    """
    if any((not isinstance(p, int)) or p < 1 for p in prompt_lens):
        raise ValueError(f"prompt lengths must be positive ints, got {prompt_lens}")
    if max_num_batched_tokens <= num_decodes + len(prompt_lens):
        raise ValueError(f"max_num_batched_tokens {max_num_batched_tokens} must exceed the "
                         f"decodes it may have to carry ({num_decodes} + {len(prompt_lens)})")
    left = list(prompt_lens)
    plan = []
    decoding = num_decodes
    while any(left):
        budget = max_num_batched_tokens - decoding
        row = [0] * len(left)
        for i, rem in enumerate(left):
            take = min(rem, budget)
            row[i], budget = take, budget - take
        left = [rem - take for rem, take in zip(left, row)]
        decoding += sum(1 for take, rem in zip(row, left) if take and rem == 0)
        plan.append(row)
    return plan

