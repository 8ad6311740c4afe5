"""Context parallelism (chapter 11): ring attention and decode CP == naive attention on the whole
sequence, on threads for 1-4 ranks and once on real gloo processes; bytes and work per rank
measured against the formulas; bad input refused with a message."""

import math
import multiprocessing

import pytest
import torch

from llminfra.attention import naive_attention
from llminfra.attention.online_softmax import merge_partials
from llminfra.parallel.context_parallel import (causal_balance_report, context_parallel_selfcheck,
                                                decode_cp_case, decode_cp_report, draw_qkv,
                                                ring_attention_case, ring_attention_report)
from llminfra.parallel.decode_context_parallel import (cache_shard_positions,
                                                       decode_context_parallel,
                                                       decode_cp_bytes_per_step, shard_kv_cache)
from llminfra.parallel.launch import launch
from llminfra.parallel.ring_attention import (LAYOUTS, causal_tiles_per_rank,
                                              ring_activation_bytes_per_rank, ring_attention,
                                              ring_bytes_sent_per_rank, ring_kv_bytes_per_rank,
                                              shard_positions, shard_sequence, unshard_sequence)
from llminfra.parallel.world import SimulatedWorld, run_simulated

TOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny matrices on a shared 2-core CPU: one torch thread."""


def _seed(gen) -> int:
    return int(torch.randint(0, 2**31 - 1, (1,), generator=gen))


def _partial(s, v):
    """(o, lse) of scores s (..., T, m) over values v (..., m, d), the plain way."""
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1, keepdim=True)


# --- merge_partials -------------------------------------------------------------------------

def test_merge_partials_worked_example():
    """scores [0] values [1] with scores [0] values [3] → o = 2, lse = log 2."""
    o, lse = merge_partials(torch.tensor([[1.0]]), torch.tensor([[0.0]]),
                            torch.tensor([[3.0]]), torch.tensor([[0.0]]))
    assert o.item() == pytest.approx(2.0) and lse.item() == pytest.approx(math.log(2))


def test_merge_partials_equals_softmax_over_union(gen):
    s, v = torch.randn(3, 5, 11, generator=gen) * 4, torch.randn(3, 11, 7, generator=gen)
    o_a, lse_a = _partial(s[..., :4], v[:, :4])
    o_b, lse_b = _partial(s[..., 4:], v[:, 4:])
    o, lse = merge_partials(o_a, lse_a, o_b, lse_b)
    o_full, lse_full = _partial(s, v)
    assert torch.allclose(o, o_full, atol=1e-6) and torch.allclose(lse, lse_full, atol=1e-6)


def test_merge_partials_with_empty_changes_nothing(gen):
    o_a, lse_a = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 3, 1, generator=gen)
    empty_o, empty_lse = torch.zeros_like(o_a), torch.full_like(lse_a, float("-inf"))
    for o, lse in (merge_partials(o_a, lse_a, empty_o, empty_lse),
                   merge_partials(empty_o, empty_lse, o_a, lse_a)):
        assert torch.allclose(o, o_a) and torch.allclose(lse, lse_a)
    o, lse = merge_partials(empty_o, empty_lse, empty_o, empty_lse)
    assert torch.equal(o, empty_o) and torch.isinf(lse).all()


# --- layouts --------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("P,T", [(1, 5), (2, 9), (3, 29), (4, 64), (4, 8)])
def test_layout_partitions_the_sequence(layout, P, T, gen):
    pos = torch.cat([shard_positions(T, r, P, layout) for r in range(P)])
    assert sorted(pos.tolist()) == list(range(T))
    sizes = [len(shard_positions(T, r, P, layout)) for r in range(P)]
    assert max(sizes) - min(sizes) <= (2 if layout == "zigzag" else 1)
    x = torch.randn(2, 3, T, 4, generator=gen)
    parts = [shard_sequence(x, r, P, layout) for r in range(P)]
    assert torch.equal(unshard_sequence(parts, layout), x)


def test_layout_examples():
    assert shard_positions(8, 0, 2, "contiguous").tolist() == [0, 1, 2, 3]
    assert shard_positions(8, 0, 2, "zigzag").tolist() == [0, 1, 6, 7]
    assert shard_positions(8, 1, 2, "zigzag").tolist() == [2, 3, 4, 5]
    assert shard_positions(8, 0, 2, "striped").tolist() == [0, 2, 4, 6]


def test_layout_bad_input():
    with pytest.raises(ValueError, match="tokens must be an int >= 8 for layout 'zigzag'"):
        shard_positions(7, 0, 4, "zigzag")
    with pytest.raises(ValueError, match=r"tokens must be an int >= 4"):
        shard_positions(3, 0, 4, "contiguous")
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_positions(8, 0, 2, "diagonal")
    with pytest.raises(ValueError, match="rank must be"):
        shard_positions(8, 2, 2, "contiguous")


# --- ring attention == full attention --------------------------------------------------------

@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_ring_attention_equals_full(P, gen):
    """Every layout, causal and not, an awkward length (not divisible by P or 2P), GQA 6:2."""
    for layout in LAYOUTS:
        for causal in (False, True):
            T = 2 * P + int(torch.randint(1, 20, (1,), generator=gen))
            seed = _seed(gen)
            res = run_simulated(ring_attention_case, P, T, 6, 2, 8, causal, layout, seed, 2)
            q, k, v = draw_qkv(2, 6, 2, T, 8, seed)
            out = unshard_sequence([r["out"] for r in res], layout)
            err = (out - naive_attention(q, k, v, causal)).abs().max().item()
            assert err <= TOL, f"P={P} {layout} causal={causal} T={T} seed={seed}: {err}"
            assert max(r["max_abs_err"] for r in res) <= TOL


def test_ring_attention_float64_and_multi_query(gen):
    seed, T, P = _seed(gen), 13, 3
    res = run_simulated(ring_attention_case, P, T, 4, 1, 5, True, "zigzag", seed, 1,
                        torch.float64)
    assert max(r["max_abs_err"] for r in res) <= 1e-12
    assert res[0]["out"].dtype == torch.float64


def test_ring_attention_bfloat16_close(gen):
    res = run_simulated(ring_attention_case, 2, 21, 4, 2, 16, True, "contiguous", _seed(gen), 1,
                        torch.bfloat16)
    assert max(r["max_abs_err"] for r in res) <= 2e-2  # bf16 output rounding (8 mantissa bits)


class _CountingWorld(SimulatedWorld):
    """Counts the point-to-point calls the ring makes."""

    def __init__(self, inner):
        super().__init__(inner.rank, inner.size, inner._m)
        self.calls = []

    def isend(self, x, dst):
        self.calls.append(("isend", dst))
        return super().isend(x, dst)

    def irecv(self, shape, dtype, src, device="cpu"):
        self.calls.append(("irecv", src))
        return super().irecv(shape, dtype, src, device)

    def recv(self, shape, dtype, src, device="cpu"):
        self.calls.append(("recv", src))  # blocking recv: also what irecv's wait() calls here
        return super().recv(shape, dtype, src, device)


def _ring_calls(world, q, k, v, T):
    cw = _CountingWorld(world)
    ring_attention(cw, shard_sequence(q, world.rank, world.size),
                   shard_sequence(k, world.rank, world.size),
                   shard_sequence(v, world.rank, world.size), T, True)
    return cw.calls


def test_ring_posts_nonblocking_transfers_to_neighbours(gen):
    """P − 1 isend to rank r+1 and irecv from rank r-1, both posted before the block is used
    (the wait, the simulated world's recv, comes after)."""
    P, T = 4, 12
    q, k, v = draw_qkv(1, 2, 2, T, 4, _seed(gen))
    for r, calls in enumerate(run_simulated(_ring_calls, P, q, k, v, T)):
        prev, nxt = (r - 1) % P, (r + 1) % P
        assert calls == [("isend", nxt), ("irecv", prev), ("recv", prev)] * (P - 1)


def _ring_bad_shard(world, q, k, v):
    return ring_attention(world, q[:, :, :2], k[:, :, :2], v[:, :, :2], 9, False)


def test_ring_bad_input(gen):
    q, k, v = draw_qkv(1, 2, 1, 9, 4, _seed(gen))
    with pytest.raises(RuntimeError, match="must hold 5 of the 9 tokens"):
        run_simulated(_ring_bad_shard, 2, q, k, v)
    world = SimulatedWorld.group(1)[0]
    with pytest.raises(ValueError, match="causal must be True or False"):
        ring_attention(world, q, k, v, 9, causal="yes")
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        ring_attention(world, q[:, :1], torch.cat([k, k], 1), torch.cat([v, v], 1), 9)


# --- memory, traffic, work -------------------------------------------------------------------

@pytest.mark.parametrize("P,T,layout", [(2, 16, "contiguous"), (4, 64, "zigzag"),
                                        (3, 24, "striped")])
def test_ring_bytes_match_formulas_divisible(P, T, layout):
    """2·T/P·H_kv·d·bytes per rank held; (P−1)× that sent. T=64, P=4, H_kv=2, d=16, fp32:
    2·16·2·16·4 = 4096 bytes held, 3·4096 = 12,288 sent; activations with H=4 (n = 16):
    Q 4·16·16·4 + O 4·16·16·4 + lse 4·16·4 + scores 4·16·16·4 = 12,544 bytes."""
    df = ring_attention_report(P, T, 4, 2, 16, True, layout)
    assert (df["KV bytes held (measured)"] == df["KV bytes (formula)"]).all()
    assert (df["bytes sent (measured)"] == df["bytes sent (formula)"]).all()
    assert (df["activation bytes (counted)"] == df["activation bytes (formula)"]).all()
    assert (df["max |ring − full|"] <= TOL).all()
    assert ring_kv_bytes_per_rank(64, 4, 2, 16, 4) == 4096
    assert ring_bytes_sent_per_rank(64, 4, 2, 16, 4) == 12288
    assert ring_activation_bytes_per_rank(64, 4, 4, 16, 4) == 12544


def test_ring_bytes_uneven_within_one_token():
    """T = 29 on 3 ranks: each rank within one token's K/V (2·H_kv·d·4 bytes) of the formula,
    and all ranks together send exactly (P − 1) × all K/V."""
    P, T, H_kv, d = 3, 29, 2, 16
    df = ring_attention_report(P, T, 4, H_kv, d, False, "contiguous")
    one_token = 2 * H_kv * d * 4
    assert ((df["KV bytes held (measured)"] - df["KV bytes (formula)"]).abs() < one_token).all()
    assert df["bytes sent (measured)"].sum() == (P - 1) * 2 * T * H_kv * d * 4


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_causal_tiles_measured_equal_formula(P):
    for layout in ("contiguous", "zigzag"):
        df = ring_attention_report(P, 4 * P, 2, 1, 4, True, layout)
        assert df["score tiles"].tolist() == causal_tiles_per_rank(P, layout)
        assert df["score tiles"].sum() == 2 * P * P + P
    noncausal = ring_attention_report(P, 4 * P, 2, 1, 4, False, "contiguous")
    assert (noncausal["score tiles"] == 4 * P).all()


def test_tile_size_choice():
    """Tiles of one token count the unmasked scores exactly; a bad tile size is refused."""
    df = ring_attention_report(3, 10, 2, 1, 4, True, "zigzag", tile_tokens=1)
    assert (df["score tiles"] == df["scores computed"]).all()
    assert df["score tiles (formula)"].isna().all()  # formula only for the default tile
    with pytest.raises(RuntimeError, match="tile_tokens must be a positive int"):
        ring_attention_report(2, 8, tile_tokens=0)


def test_causal_balance_contiguous_vs_zigzag():
    df = causal_balance_report(4, 64)
    by = df.groupby("layout")["work / mean work"].max()
    assert by["zigzag"] == pytest.approx(1.0)
    assert by["contiguous"] == pytest.approx(904 / 520)  # rank 3: 4 blocks, rank 0: one
    assert by["striped"] < 1.1
    totals = df.groupby("layout")["scores computed"].sum()
    assert (totals == 64 * 65 // 2).all()  # T(T+1)/2 (query, key) pairs: nothing lost


# --- decode context parallelism ---------------------------------------------------------------

@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_decode_cp_equals_full(P, gen):
    for layout, interleave in (("interleaved", 1), ("interleaved", 3), ("contiguous", 1)):
        S, seed = int(torch.randint(P, 40, (1,), generator=gen)), _seed(gen)
        res = run_simulated(decode_cp_case, P, S, 6, 3, 8, layout, seed, 2, torch.float32,
                            interleave)
        assert max(r["max_abs_err"] for r in res) <= TOL, f"P={P} {layout} S={S} seed={seed}"
        assert all(torch.equal(r["out"], res[0]["out"]) for r in res)  # every rank: same bits
        assert sum(r["stats"]["cache_tokens_held"] for r in res) == S


def test_decode_cp_empty_shard(gen):
    """3 cached tokens on 4 ranks: rank 3 holds nothing and its empty partial merges as nothing."""
    df = decode_cp_report(4, 3, layout="contiguous", seed=_seed(gen))
    assert df["cache tokens held"].tolist() == [1, 1, 1, 0]
    assert (df["max |cp − full|"] <= TOL).all()


def test_cache_shard_examples():
    assert cache_shard_positions(10, 0, 3).tolist() == [0, 3, 6, 9]
    assert cache_shard_positions(10, 2, 3).tolist() == [2, 5, 8]
    assert cache_shard_positions(8, 1, 2, interleave_tokens=2).tolist() == [2, 3, 6, 7]
    with pytest.raises(ValueError, match="layout must be one of"):
        cache_shard_positions(8, 0, 2, "zigzag")
    with pytest.raises(ValueError, match="interleave_tokens must be a positive int"):
        cache_shard_positions(8, 0, 2, interleave_tokens=0)


def test_decode_cp_bytes_do_not_grow_with_context():
    """Worked example of the docstring: 32·129·4 = 16,512 bytes per partial."""
    f = decode_cp_bytes_per_step(8, 1_000_000, 32, 8, 128, 2)
    assert f["partial_bytes"] == 16_512 and f["allgather_bytes_sent"] == 7 * 16_512
    assert f["kv_allgather_bytes_sent"] == 3_584_000_000
    short, long = decode_cp_report(3, 9), decode_cp_report(3, 90)
    assert (short["partial bytes (measured)"] == long["partial bytes (measured)"]).all()
    assert (long["partial bytes (measured)"] == long["partial bytes (formula)"]).all()
    assert (long["KV bytes held (measured)"] == long["KV bytes (formula)"]).all()


def _decode_bad(world, q, k, v):
    return decode_context_parallel(world, q, k, v)


def test_decode_cp_bad_input(gen):
    q, k, v = draw_qkv(1, 3, 2, 6, 4, _seed(gen))
    with pytest.raises(RuntimeError, match="multiple of key/value heads"):
        run_simulated(_decode_bad, 1, q[:, :, -1:], k, v)
    with pytest.raises(ValueError, match="ranks must be one of"):
        decode_cp_report(2, 8, ranks="gpus")
    assert shard_kv_cache(k, 1, 2).shape == (1, 2, 3, 4)


# --- real processes ---------------------------------------------------------------------------

@pytest.mark.slow
def test_real_processes_equal_threads():
    """One gloo launch of 3 ranks runs every case; same errors bound and same counters as the
    simulated ranks (on this process's CPU kernels, as they: make test gives the processes it
    starts ATen's plainest, conftest.py's split_cpu_capability)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ATEN_CPU_CAPABILITY", raising=False)
        dist = launch(context_parallel_selfcheck, 3, 7, timeout_s=150)
    assert not multiprocessing.active_children()
    sim = run_simulated(context_parallel_selfcheck, 3, 7)
    for rank, (d, s) in enumerate(zip(dist, sim)):
        for cd, cs in zip(d, s):
            assert cd["case"] == cs["case"]
            assert cd["max_abs_err"] <= TOL, f"rank {rank} {cd['case']}: {cd['max_abs_err']}"
            assert cd["stats"] == cs["stats"], f"rank {rank} {cd['case']}"
