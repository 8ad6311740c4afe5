"""Traces, the serving simulation, sharing savings, offload costs and the bench's keys."""

import math

import pytest
import torch

from llminfra.kvcache import (Request, contiguous_waste, recompute_time_s, request_trace,
                              swap_time_s, trace_summary)
from llminfra.kvcache.sharing import (beam_search_blocks, parallel_sampling_blocks,
                                      prefix_cache_run, sharing_saving)
from llminfra.kvcache.simulate import FirstFitArena, simulate_contiguous, simulate_paged


def test_trace_is_reproducible_and_matches_the_paper_means():
    a = request_trace(3000, torch.Generator().manual_seed(7))
    b = request_trace(3000, torch.Generator().manual_seed(7))
    assert a == b
    s = trace_summary(a)
    # vLLM Fig. 11 means 161.31 / 337.99; clipping to 2048 tokens trims the tail a little
    assert 140 < s["prompt_mean"] < 180 and 300 < s["output_mean"] < 370
    assert all(r.prompt_len >= 1 and r.output_len >= 1 and r.total_len <= 2048 for r in a)
    with pytest.raises(KeyError, match="sharegpt"):
        request_trace(3, torch.Generator(), "nope")


def test_contiguous_waste_by_hand():
    """[100, 412] in 1024-slot reservations: 1 - 512 / 2048 = 0.75."""
    assert contiguous_waste([100, 412], 1024) == 0.75
    with pytest.raises(ValueError, match="outside"):
        contiguous_waste([2000], 1024)


def test_first_fit_arena_merges_holes():
    a = FirstFitArena(10)
    x, y, z = a.allocate(3), a.allocate(3), a.allocate(3)
    assert (x, y, z) == (0, 3, 6) and a.allocate(2) is None
    a.free(0, 3)
    a.free(6, 3)
    assert a.holes == [(0, 3), (6, 4)]          # 7 slots free, but in two holes:
    assert a.allocate(5) is None and a.free_slots == 7   # external fragmentation
    a.free(3, 3)
    assert a.holes == [(0, 10)]


def test_simulation_by_hand():
    """Three requests of 2 + 2 tokens, budget 8 slots, max length 4: contiguous-max admits two
    (4 slots each, exactly their final length: no internal waste) while the third waits; paging
    with B = 2 admits all three at once (a 2-token prompt takes one block of the four)."""
    trace = [Request(2, 2)] * 3
    r = simulate_contiguous(trace, 8, "max", max_seq_len=4)
    assert r["max_running"] == 2 and r["steady_steps"] >= 1
    fr = r["fractions"]
    assert math.isclose(sum(fr.values()), 1.0)
    assert fr["external"] == 0.0 and fr["internal"] == 0.0          # reserved 4 = final 4
    p = simulate_paged(trace, 8, block_size=2)
    assert p["max_running"] == 3 and math.isclose(sum(p["fractions"].values()), 1.0)


def test_requests_larger_than_the_budget_are_refused():
    """44 tokens need 11 blocks of 4; a 32-token budget has 8. Contiguous and paged both say
    so (paged would otherwise preempt the lone request and re-admit it for ever)."""
    with pytest.raises(ValueError, match="budget"):
        simulate_paged([Request(4, 40)], 32, block_size=4)
    with pytest.raises(ValueError, match="budget"):
        simulate_contiguous([Request(4, 40)], 32, "oracle")


def test_paged_beats_contiguous_on_a_trace():
    trace = request_trace(60, torch.Generator().manual_seed(3))
    c = simulate_contiguous(trace, 8192, "max")
    p = simulate_paged(trace, 8192, 16)
    assert c["fractions"]["token"] < 0.45 < 0.9 < p["fractions"]["token"]
    assert p["max_running"] > c["max_running"]


def test_parallel_sampling_blocks_by_hand():
    """B = 4, prompt 8, two 1-token samples: 2 shared + 2 private blocks = 4 vs 2 · 3 = 6."""
    assert parallel_sampling_blocks(8, [1, 1], block_size=4) == (4, 6)
    assert parallel_sampling_blocks(5, [1], block_size=4) == (2, 2)   # n = 1 saves nothing


def test_beam_search_saves_more_than_parallel_sampling():
    g = torch.Generator().manual_seed(0)
    trace = request_trace(15, g, "alpaca")
    par = sharing_saving([parallel_sampling_blocks(r.prompt_len, [r.output_len] * 4)
                          for r in trace])
    beam = sharing_saving([beam_search_blocks(r.prompt_len, r.output_len, 4, g) for r in trace])
    assert 0 < par < beam < 1
    assert beam_search_blocks(10, 5, 1, g)[0] == beam_search_blocks(10, 5, 1, g)[1]


def test_prefix_cache_run_hits_the_system_prompt():
    g = torch.Generator().manual_seed(5)
    r = prefix_cache_run(request_trace(20, g, "alpaca"), 64, g, num_blocks=200, block_size=16)
    assert 0.5 < r["hit_rate"] < 1 and 0 < r["memory_saved"] < 1


def test_offload_costs_by_hand():
    """Swap: 1000 tokens · 524,288 B · 2 / 25e9 B/s = 0.04194 s.
    Recompute: 2 · 6.74e9 · 1000 / 312e12 = 0.0432 s."""
    assert math.isclose(swap_time_s(1000, 524_288, 25e9), 0.04194304)
    assert math.isclose(recompute_time_s(1000, 6.74e9, 312e12), 0.043205128205, rel_tol=1e-9)
    with pytest.raises(ValueError):
        swap_time_s(10, 0, 1e9)


def test_bench_quick_has_the_keys_and_meets_the_targets():
    from llminfra.bench.kvcache import format_table, run
    from llminfra.kvcache.simulate import kv_budget_tokens
    # (38,654,705,664 - 25,706,946,560 - 293,802,368) // 819,200: calc.memory.kv_budget's answer
    assert kv_budget_tokens() == 15_446
    r = run(quick=True)
    for key in ("contiguous_utilization", "paged_utilization", "parallel_sampling_saving",
                "beam_search_saving", "prefix_hit_rate", "max_concurrent_requests",
                "fragmentation", "memory_saved", "environment"):
        assert key in r
    assert set(r["paged_utilization"]) == {"8", "16", "32"}
    assert set(r["beam_search_saving"]) == {"2", "4", "6"}
    assert r["paged_utilization"]["16"] >= 0.96 and r["contiguous_utilization"] <= 0.40
    assert r["max_concurrent_requests"]["contiguous-max"] == 15_446 // 2048
    assert "paged-16" in format_table(r)


def test_plots_draw_the_numbers():
    from matplotlib.figure import Figure

    from llminfra.kvcache.simulate import PAPER
    from llminfra.plots.kvcache import plot_memory_split, plot_sharing
    split = {"a": {"token": 0.2, "reserved": 0.1, "internal": 0.6, "external": 0.05,
                   "free": 0.05},
             "b": {"token": 0.97, "reserved": 0.0, "internal": 0.02, "external": 0.0,
                   "free": 0.01}}
    ax = plot_memory_split(split, Figure().add_subplot())
    widths = [p.get_width() for p in ax.patches]
    assert widths[:5] == pytest.approx([0.2, 0.1, 0.6, 0.05, 0.05]) and widths[5] == 0.97
    result = {"parallel_sampling_saving": {"2": 0.05, "4": 0.08},
              "beam_search_saving": {"2": 0.4, "4": 0.6}}
    ax = plot_sharing(result, PAPER, Figure().add_subplot())
    assert list(ax.lines[1].get_ydata()) == [0.4, 0.6]


def test_a_prompt_larger_than_the_pool_is_refused_not_looped():
    """A 40-token request in a 32-token pool can never be admitted: a ValueError, no hang."""
    with pytest.raises(ValueError, match="raise the budget"):
        simulate_paged([Request(40, 2)], budget_tokens=32, block_size=16)
