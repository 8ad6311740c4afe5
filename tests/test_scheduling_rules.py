"""The closed-form scheduling rules agree with what the real engine schedules."""

import pytest

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import load_tiny
from llminfra.sim.scheduling_rules import admit_fcfs, chunked_prefill_plan


@pytest.fixture(scope="module")
def tiny(one_thread):
    return load_tiny()


def _prefill_rows(engine, seqs, prompt_lens):
    """Step the engine; per step, the prompt tokens each sequence computed (until all done)."""
    rows = []
    while any(s.num_computed_tokens < p for s, p in zip(seqs, prompt_lens)):
        before = [s.num_computed_tokens for s in seqs]
        engine.step()
        rows.append([min(s.num_computed_tokens, p) - min(b, p)
                     for s, b, p in zip(seqs, before, prompt_lens)])
    return rows


@pytest.mark.parametrize("prompts,budget", [([10, 3], 8), ([40, 25, 7], 16), ([100], 32),
                                            ([5, 5, 5, 5], 12)])
def test_chunked_prefill_plan_matches_the_engine(tiny, prompts, budget):
    engine = LLMEngine(*tiny, num_blocks=64, max_num_seqs=len(prompts),
                       max_num_batched_tokens=budget, enable_chunked_prefill=True)
    for i, p in enumerate(prompts):
        engine.add_request([65 + i] * p, SamplingParams(max_tokens=50))
    seqs = [s for r in engine.requests.values() for s in r.seqs]
    assert _prefill_rows(engine, seqs, prompts) == chunked_prefill_plan(prompts, budget)


def test_admission_matches_the_engine(tiny):
    """Three waiting prompts, a pool of 6 blocks of 16: the first (40 tokens, 3 blocks) and the
    second (20, 2 blocks) fit; the third (30, 2 blocks) does not (1 block left)."""
    prompts = [40, 20, 30]
    assert admit_fcfs(prompts, free_blocks=6, block_size=16, num_running=0, max_num_seqs=8,
                      max_num_batched_tokens=512) == 2
    engine = LLMEngine(*tiny, num_blocks=6, block_size=16, max_num_seqs=8,
                       max_num_batched_tokens=512, enable_chunked_prefill=False)
    for i, p in enumerate(prompts):
        engine.add_request([70 + i] * p, SamplingParams(max_tokens=2))
    engine.step()
    assert engine.stats()["num_running"] == 2 and engine.stats()["num_waiting"] == 1
