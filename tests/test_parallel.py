"""Tensor and pipeline parallelism in one process (SimulatedWorld): sharded == unsharded.

The real multi-process runs (gloo) are in ``test_parallel_dist.py``.
"""

import copy

import pytest
import torch
from torch import nn

from llminfra.model.cache import DenseKVCache
from llminfra.model.config import ModelConfig
from llminfra.model.generate import generate
from llminfra.model.transformer import Transformer
from llminfra.parallel.megatron import apply_tensor_parallel, make_mlp, parallel_mlp
from llminfra.parallel.pipeline import (StageEvent, bubble_fraction, gpipe_schedule,
                                        measured_bubble, pipeline_forward, split_layers,
                                        split_micro_batches)
from llminfra.parallel.tensor_parallel import (ColumnParallelLinear, RowParallelLinear,
                                               shard_cols, shard_rows)
from llminfra.parallel.world import SimulatedWorld, run_simulated
from llminfra.parallel.workers import mlp_case, tp_mlp_step


def test_shards_by_hand():
    """W = [[0 1 2 3], [4 5 6 7]]: rank 1 of 2 holds row [4 5 6 7] (column parallel) and
    columns [[2 3], [6 7]] (row parallel)."""
    W = torch.arange(8.0).view(2, 4)
    assert shard_rows(W, 1, 2).tolist() == [[4, 5, 6, 7]]
    assert shard_cols(W, 1, 2).tolist() == [[2, 3], [6, 7]]
    with pytest.raises(ValueError, match="3 ranks"):
        shard_cols(W, 0, 3)


def _linear_case(world, make, full, x, w):
    layer = make(copy.deepcopy(full), world)
    x = x.clone().requires_grad_()
    y = layer(x)
    (y * w).sum().backward()
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


def _column(lin, world):
    return ColumnParallelLinear.from_linear(lin, world, gather_output=True)


def _row(lin, world):
    return RowParallelLinear.from_linear(lin, world, input_is_parallel=False)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("kind", ["column", "row"])
def test_linear_layers_match_unsharded(gen, n, kind):
    """Column: 9 -> 6 (6 outputs split over 1, 2, 3); row: 12 -> 7 (12 inputs split)."""
    full = nn.Linear(9, 6) if kind == "column" else nn.Linear(12, 7)
    with torch.no_grad():
        for p in full.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(2, 3, full.in_features, generator=gen)
    w = torch.randn(2, 3, full.out_features, generator=gen)
    xr = x.clone().requires_grad_()
    (full(xr) * w).sum().backward()
    y = full(x).detach()
    make = _column if kind == "column" else _row
    outs = run_simulated(_linear_case, n, make, full, x, w)
    for y_r, dx_r, *_ in outs:
        torch.testing.assert_close(y_r, y)
        torch.testing.assert_close(dx_r, xr.grad)
    if kind == "column":
        torch.testing.assert_close(torch.cat([o[2] for o in outs]), full.weight.grad)
        torch.testing.assert_close(torch.cat([o[3] for o in outs]), full.bias.grad)
    else:
        torch.testing.assert_close(torch.cat([o[2] for o in outs], dim=1), full.weight.grad)
        for o in outs:  # the bias is added once, after the sum: its gradient is the full one
            torch.testing.assert_close(o[3], full.bias.grad)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_megatron_mlp_forward_and_backward(n):
    seed = torch.Generator().seed() % 2**31
    mlp, x, w = mlp_case(seed)
    xr = x.clone().requires_grad_()
    y = mlp(xr)
    (y * w).sum().backward()
    outs = run_simulated(tp_mlp_step, n, seed)
    for o in outs:
        torch.testing.assert_close(o["y"], y.detach())
        torch.testing.assert_close(o["dx"], xr.grad)
    torch.testing.assert_close(torch.cat([o["dw1"] for o in outs]), mlp.w1.weight.grad)
    torch.testing.assert_close(torch.cat([o["dw2"] for o in outs], dim=1), mlp.w2.weight.grad)


def test_uneven_sizes_raise_clear_errors():
    mlp = make_mlp(8, 10)
    world = SimulatedWorld.group(4)[0]
    with pytest.raises(ValueError, match="ffn_dim.*10.*4 ranks"):
        parallel_mlp(mlp, world)
    model = Transformer(ModelConfig(vocab_size=16, dim=24, n_layers=1, n_heads=6, n_kv_heads=3,
                                    ffn_dim=32, max_seq_len=8))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="key/value heads of 3 .* 2 ranks"):
        apply_tensor_parallel(model, SimulatedWorld.group(2)[0])
    assert isinstance(model.layers[0].attention.wq, nn.Linear)  # untouched
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def _tp_logits_and_tokens(world, model, tokens, prompt):
    m = apply_tensor_parallel(copy.deepcopy(model), world)
    with torch.no_grad():
        logits = m(tokens)
    new = generate(m, prompt, 6, cache=DenseKVCache(m.config.n_layers))
    return logits, new


@pytest.mark.parametrize("n", [2, 4])
def test_tensor_parallel_model_equals_plain(gen, n):
    cfg = ModelConfig(vocab_size=40, dim=32, n_layers=2, n_heads=8, n_kv_heads=4, ffn_dim=36,
                      max_seq_len=32)
    model = Transformer(cfg, generator=gen).eval()
    tokens = torch.randint(0, 40, (2, 11), generator=gen)
    prompt = tokens[0, :5].tolist()
    with torch.no_grad():
        ref = model(tokens)
    ref_new = generate(model, prompt, 6, cache=DenseKVCache(cfg.n_layers))
    for logits, new in run_simulated(_tp_logits_and_tokens, n, model, tokens, prompt):
        torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
        assert new == ref_new


def test_simulated_rank_error_reaches_caller():
    def fn(world):
        if world.rank == 1:
            raise KeyError("boom")
        return world.all_reduce(torch.ones(2))  # rank 0 waits here: must be released
    with pytest.raises(RuntimeError, match="rank 1 raised KeyError"):
        run_simulated(fn, 3, timeout_s=20)


def test_simulated_rank_error_releases_a_waiting_receiver():
    """Stage 0 fails before sending: stage 1, blocked in recv, is released at once and the
    caller sees stage 0's error, not a timeout."""
    import time

    def fn(world):
        if world.rank == 0:
            raise KeyError("boom on stage 0")
        return world.recv((2,), torch.float32, 0)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 0 raised KeyError"):
        run_simulated(fn, 2, timeout_s=20)
    assert time.monotonic() - t0 < 10


def test_simulated_collectives():
    def fn(world):
        x = torch.full((2,), float(world.rank + 1))
        if world.rank == 0:
            world.send(torch.arange(3.0), 1)
        got = world.recv((3,), torch.float32, 0) if world.rank == 1 else None
        return world.all_reduce(x), world.all_gather(x[:1], dim=0), got
    outs = run_simulated(fn, 3)
    for s, g, _ in outs:
        assert s.tolist() == [6.0, 6.0] and g.tolist() == [1.0, 2.0, 3.0]
    assert outs[1][2].tolist() == [0.0, 1.0, 2.0]


def test_bubble_formula_by_hand():
    """p = 3, m = 4: makespan 6 t, busy 4 t per stage -> 1 - 12/18 = 1/3 = (3-1)/(4+3-1)."""
    assert bubble_fraction(3, 4) == pytest.approx(1 / 3)
    assert bubble_fraction(1, 5) == 0.0
    for p, m in ((2, 1), (4, 8), (3, 7)):
        events = gpipe_schedule(p, m, 0.01)
        assert measured_bubble(events, p) == pytest.approx(bubble_fraction(p, m))
    with pytest.raises(ValueError):
        bubble_fraction(0, 3)
    with pytest.raises(ValueError, match="stage_time_s"):
        gpipe_schedule(2, 3, 0.0)
    with pytest.raises(ValueError, match="positive length"):
        measured_bubble([StageEvent(0, 0, 1.0, 1.0)], 1)


def test_split_layers_and_micro_batches():
    assert [list(r) for r in split_layers(10, 4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    with pytest.raises(ValueError, match="5 stages"):
        split_layers(4, 5)
    with pytest.raises(ValueError, match="micro-batches"):
        split_micro_batches(torch.zeros(6, 2), 4)


@pytest.mark.parametrize("p,m", [(2, 3), (4, 2)])
def test_pipeline_forward_equals_plain(gen, p, m):
    cfg = ModelConfig(vocab_size=30, dim=16, n_layers=5, n_heads=2, n_kv_heads=1, ffn_dim=24,
                      max_seq_len=16)
    model = Transformer(cfg, generator=gen).eval()
    tokens = torch.randint(0, 30, (2 * m, 7), generator=gen)
    with torch.no_grad():
        ref = model(tokens)
    outs = run_simulated(lambda w: pipeline_forward(w, model, tokens, m), p)
    torch.testing.assert_close(outs[-1][0], ref)
    assert all(o[0] is None for o in outs[:-1])
    events = [e for _, ev in outs for e in ev]
    assert sorted((e.stage, e.micro_batch) for e in events) == [(s, i) for s in range(p)
                                                               for i in range(m)]
    for s in range(1, p):  # a stage starts micro-batch i only after the stage before ended it
        for i in range(m):
            before = next(e for e in events if e.stage == s - 1 and e.micro_batch == i)
            after = next(e for e in events if e.stage == s and e.micro_batch == i)
            assert after.start_s >= before.end_s


def test_data_parallel_split_and_merge():
    from llminfra.parallel.data_parallel import merge_results, split_requests
    assert split_requests(5, 2) == [[0, 2, 4], [1, 3]]
    assert split_requests(2, 3) == [[0], [1], []]
    assert merge_results([{0: "a", 2: "c"}, {1: "b"}], 3) == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"requests \[1\]"):
        merge_results([{0: "a"}], 2)
    with pytest.raises(ValueError):
        split_requests(3, 0)


def test_data_parallel_replicas_answer_like_one_process(gen):
    from llminfra.parallel.data_parallel import merge_results, replica_serve, serving_throughput
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 5, 2)]
    outs = run_simulated(replica_serve, 2, prompts, 4)
    from llminfra.parallel.workers import tiny_model
    ref_model = tiny_model()
    expected = [generate(ref_model, p, 4, cache=DenseKVCache(ref_model.config.n_layers))
                for p in prompts]
    assert merge_results([o["answers"] for o in outs], 3) == expected
    stats = serving_throughput(outs)
    assert stats["tokens"] == 12 and stats["replicas"] == 2


def test_bench_bubbles_of_an_ideal_timeline_equal_the_formula():
    """The bench's reduction over ranks and repeats, fed GPipe's ideal schedule."""
    from llminfra.bench.parallel import _bubbles
    p = 3
    ranks = [{"pipe_all": {m: [[(e.stage, e.micro_batch, e.start_s, e.end_s)
                                 for e in gpipe_schedule(p, m, 0.5) if e.stage == s]]
                           for m in (1, 4)}} for s in range(p)]
    assert _bubbles(ranks) == pytest.approx({"m=1": bubble_fraction(p, 1),
                                             "m=4": bubble_fraction(p, 4)})


# ---- hardening (issue 13) -------------------------------------------------------------------
@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("shapes,dtypes", [
    (((1,), (1, 1, 1)), (torch.float32, torch.float32)),   # used to broadcast to [2, 2, 2]
    (((2,), (3,)), (torch.float32, torch.float32)),
    (((2,), (2,)), (torch.float32, torch.float64)),
])
def test_simulated_collectives_need_one_shape_and_dtype(op, shapes, dtypes):
    """torch.distributed requires every rank's tensor to have the same shape and dtype; the
    simulated world must refuse what the real one refuses, naming each rank's shape."""
    def fn(world):
        x = torch.ones(shapes[world.rank], dtype=dtypes[world.rank])
        return getattr(world, op)(x)
    with pytest.raises(RuntimeError, match=r"raised ValueError: .*same shape and dtype.*rank 1"):
        run_simulated(fn, 2, timeout_s=20)
