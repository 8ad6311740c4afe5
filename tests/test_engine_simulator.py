"""The simulator runs the engine's own scheduler: same steps as the real engine on the same
workload; a hand-worked timeline; the roofline step-time model end to end; the overhead fit."""

import itertools
import math

import pytest
import torch

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import ByteTokenizer, ModelConfig, Transformer
from llminfra.sim.simulator import (Simulator, fit_overhead_s, kv_blocks_for,
                                    roofline_step_time)
from llminfra.sim.workload import WorkloadRequest, serving_workload

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=64)


def test_hand_worked_timeline():
    """1 s per step. A: prompt 4, output 3, at t=0. B: prompt 6, output 1, at t=0.5, budget 8.
    Step 1 [0,1): A's prompt (4) -> A token 1 at t=1. Step 2 [1,2): A decode + B's prompt (6)
    -> A token 2, B token 1 (B done) at t=2. Step 3 [2,3): A decode -> A done at t=3."""
    sim = Simulator(lambda batch: 1.0, num_blocks=8, block_size=4, max_seq_len=64,
                    max_num_batched_tokens=8)
    res = sim.run([WorkloadRequest(0.0, 4, 3), WorkloadRequest(0.5, 6, 1)])
    a, b = res.metrics
    assert (a.ttft_s, a.e2e_s, a.token_times) == (1.0, 3.0, [1.0, 2.0, 3.0])
    assert (b.ttft_s, b.e2e_s) == (1.5, 1.5)
    assert [batch for _, batch, _ in res.steps] == [[(4, 4)], [(1, 5), (6, 6)], [(1, 6)]]


@pytest.mark.parametrize("policy, chunked", [("continuous", True), ("continuous", False),
                                             ("static", True)])
def test_simulator_takes_the_engines_steps(one_thread, gen, policy, chunked):
    """The same workload through the real engine and the simulator gives the same sequence of
    step batches: it is the same scheduler."""
    work = serving_workload(7, gen, max_seq_len=60, scale=0.1)
    model = Transformer(CFG).eval()
    ticks = itertools.count()
    engine = LLMEngine(model, ByteTokenizer(), num_blocks=16, block_size=4, max_num_seqs=4,
                       max_num_batched_tokens=16, policy=policy, enable_chunked_prefill=chunked,
                       clock=lambda: float(next(ticks)))
    engine.step_log = []
    for r in work:
        prompt = torch.randint(0, 256, (r.prompt_len,), generator=gen).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=r.output_len), arrival_time=0.0)
    while engine.has_unfinished_requests():
        engine.step()
    sim = Simulator(lambda batch: 1.0, num_blocks=16, block_size=4, max_seq_len=60,
                    max_num_seqs=4, max_num_batched_tokens=16, policy=policy,
                    enable_chunked_prefill=chunked)
    res = sim.run([WorkloadRequest(0.0, r.prompt_len, r.output_len) for r in work])
    assert [b for _, b, _ in res.steps] == [b for b, _ in engine.step_log]
    assert res.num_preemptions == engine.stats()["num_preemptions"]


def test_llama_2_13b_on_an_a100_continuous_beats_static(gen):
    work = serving_workload(32, gen, rate_per_s=math.inf, max_seq_len=4096)
    blocks = kv_blocks_for("llama-2-13b", "a100-80gb")
    step = roofline_step_time("llama-2-13b", "a100-80gb", overhead_s=2e-3)
    thr = {}
    for policy in ("static", "continuous"):
        res = Simulator(step, num_blocks=blocks, max_seq_len=4096, max_num_seqs=8,
                        max_num_batched_tokens=2048, policy=policy).run(work)
        assert len(res.metrics) == 32 and all(m.finished_time for m in res.metrics)
        thr[policy] = sum(m.num_output_tokens for m in res.metrics) / res.duration_s
    assert thr["continuous"] > thr["static"]
    tp4 = roofline_step_time("llama-3-70b", "h100", tensor_parallel=4)
    assert tp4([(1, 1000)] * 8) > 0 and kv_blocks_for("llama-3-70b", "h100",
                                                       tensor_parallel=4) > 0
    sim = Simulator.for_gpu("llama-3-70b", "h100", tensor_parallel=4, max_num_seqs=64,
                            max_num_batched_tokens=2048, max_seq_len=4096)
    res = sim.run(work[:8])
    assert all(m.ttft_s > 0 for m in res.metrics) and res.steps[0][2] == pytest.approx(
        tp4(res.steps[0][1]))


def test_fit_overhead_recovers_a_constant():
    """Steps measured as roofline + 3 ms: the fit finds 3 ms and zero residual."""
    base = lambda batch: 1e-3 * sum(n for n, _ in batch)
    measured = [([(k, k)], 1e-3 * k + 3e-3) for k in (1, 5, 9)]
    fit = fit_overhead_s(measured, base)
    assert fit["overhead_s"] == pytest.approx(3e-3) and fit["residual_rms_s"] < 1e-12
    with pytest.raises(ValueError):
        fit_overhead_s([], base)


def test_simulator_refuses_requests_that_never_fit():
    sim = Simulator(lambda b: 1.0, num_blocks=2, block_size=4, max_seq_len=64)
    with pytest.raises(ValueError, match="does not fit"):
        sim.run([WorkloadRequest(0.0, 6, 5)])
