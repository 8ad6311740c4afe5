"""Mixture-of-experts MLP: routing by hand, grouped == naive on random inputs, capacity drops,
the config fields, and a MoE model that runs through the engine token for token."""

import math

import pytest
import torch

from llminfra.calc.params import param_count
from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import (ByteTokenizer, DenseKVCache, ModelConfig, MoEFeedForward,
                            RouterOutput, Transformer, expert_capacity, generate, route,
                            tiny_moe_config, tiny_moe_model)
from llminfra.model.moe import SwiGLUExpert, capacity_mask


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


def test_softmax_gating_by_hand():
    """Logits (1, 3, 2, 0), k = 2 -> experts 1 and 2, g = softmax(3, 2) = (0.731, 0.269)."""
    r = route(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2, "softmax")
    assert isinstance(r, RouterOutput)
    assert r.expert_ids.tolist() == [[1, 2]]
    torch.testing.assert_close(r.weights, torch.tensor([[1 / (1 + math.e ** -1),
                                                         1 / (1 + math.e)]]))
    assert r.tokens_per_expert.tolist() == [0, 1, 1, 0] and r.capacity is None


def test_sigmoid_gating_by_hand():
    """DeepSeek-V3: s = sigmoid(logits), top-2 of s, g = s / Σ s over the chosen two."""
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    r = route(logits, 2, "sigmoid")
    s = torch.sigmoid(torch.tensor([3.0, 2.0]))
    assert r.expert_ids.tolist() == [[1, 2]]
    torch.testing.assert_close(r.weights[0], s / s.sum())
    # not the softmax weights: the two gatings differ
    assert not torch.allclose(r.weights, route(logits, 2, "softmax").weights)


@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
def test_routing_invariants_on_random_logits(gating):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(29, 6, generator=g)
    r = route(logits, 3, gating)
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(29))
    assert int(r.tokens_per_expert.sum()) == 29 * 3
    assert (r.expert_ids == logits.topk(3).indices).all()  # sigmoid is monotone: same choice
    assert r.kept.all() and r.dropped_assignments == 0 and r.dropped_tokens == 0
    load = r.tokens_per_expert.double()
    assert r.load_imbalance == pytest.approx(float(load.max() / load.mean()))


def test_capacity_by_hand():
    """C = ceil(cf·N·k/E): N = 10, k = 2, E = 4, cf = 1.25 -> ceil(6.25) = 7.

    First choices are served before second choices (GShard). ids [[0,1],[0,1],[0,2]], C = 2:
    expert 0's queue is tokens 0, 1, 2 (first choices), so token 2's first choice is dropped;
    the second choices (experts 1, 1, 2) all fit. ids [[1,0],[0,1]], C = 1: the two first
    choices fill experts 1 and 0, both second choices are dropped."""
    assert expert_capacity(10, 2, 4, 1.25) == 7
    ids = torch.tensor([[0, 1], [0, 1], [0, 2]])
    assert capacity_mask(ids, 3, 2).tolist() == [[True, True], [True, True], [False, True]]
    ids = torch.tensor([[1, 0], [0, 1]])  # both second choices queue behind first choices
    assert capacity_mask(ids, 2, 1).tolist() == [[True, False], [True, False]]


def test_capacity_drops_and_reports():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(40, 4, generator=g) + torch.tensor([2.0, 0, 0, 0])  # expert 0 popular
    r = route(logits, 2, "softmax", capacity_factor=0.5)
    assert r.capacity == math.ceil(0.5 * 40 * 2 / 4) == 10
    assert (r.kept_per_expert <= r.capacity).all()
    assert r.kept_per_expert.tolist() == torch.minimum(r.tokens_per_expert,
                                                       torch.tensor(10)).tolist()
    assert r.dropped_assignments == int((r.tokens_per_expert - r.kept_per_expert).sum()) > 0
    assert r.load_imbalance > 1.2
    assert route(logits, 2, "softmax", capacity_factor=100.0).dropped_assignments == 0


CASES = [(1, 4, 1, "softmax", False, None), (13, 6, 2, "softmax", True, None),
         (37, 8, 3, "sigmoid", False, None), (21, 4, 2, "sigmoid", True, 0.75),
         (17, 5, 2, "softmax", False, 0.3)]


@pytest.mark.parametrize("tokens,E,k,gating,shared,cf", CASES)
def test_grouped_equals_naive(tokens, E, k, gating, shared, cf):
    """Sort-by-expert with one matmul chain per expert == the per-token loop, on fresh random
    weights and tokens (dense (B, T, dim) input too)."""
    g = torch.Generator().manual_seed(tokens * 31 + E)
    layer = MoEFeedForward(24, 40, E, k, gating, shared, cf, generator=g)
    x = torch.randn(tokens, 24, generator=g)
    with torch.no_grad():
        y, routing = layer.forward_with_routing(x)
        torch.testing.assert_close(y, layer.forward_naive(x), rtol=1e-5, atol=1e-7)
        assert y.abs().max() > 1e-4  # not trivially zero
        x3 = x[:12].reshape(3, 4, 24) if tokens >= 12 else x.reshape(1, tokens, 24)
        torch.testing.assert_close(layer(x3), layer.forward_naive(x3), rtol=1e-5, atol=1e-7)
    assert routing.expert_ids.shape == (tokens, k)


def test_one_expert_is_the_dense_mlp():
    """E = k = 1: weight 1 for every token, so the layer is its single SwiGLU expert."""
    layer = MoEFeedForward(16, 32, 1, 1, generator=torch.Generator().manual_seed(2))
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(layer(x), layer.experts[0](x))


def test_dropped_token_output_is_shared_expert_only():
    """A token over capacity for all its experts gets zero from the routed experts: only the
    shared expert (and, in the block, the residual) carries it."""
    g = torch.Generator().manual_seed(11)
    layer = MoEFeedForward(16, 32, 2, 1, "softmax", True, 0.5, generator=g)
    x = torch.randn(1, 16, generator=g).repeat(6, 1)  # six identical tokens -> one expert
    with torch.no_grad():
        y, r = layer.forward_with_routing(x)
        assert r.capacity == 2 and r.dropped_tokens == 4
        torch.testing.assert_close(y[2:], layer.shared_expert(x[2:]))
        assert not torch.allclose(y[0], y[5])


@pytest.mark.parametrize("kwargs,match", [
    (dict(gating="top1"), "gating"), (dict(top_k=5), "top_k"), (dict(top_k=0), "top_k"),
    (dict(capacity_factor=0), "capacity_factor"), (dict(num_experts=0), "num_experts")])
def test_bad_layer_arguments(kwargs, match):
    args = dict(dim=8, ffn_dim=8, num_experts=4, top_k=2) | kwargs
    with pytest.raises(ValueError, match=match):
        MoEFeedForward(**args)


def test_bad_route_arguments():
    with pytest.raises(ValueError, match="gating"):
        route(torch.zeros(2, 4), 1, "relu")
    with pytest.raises(ValueError, match="top_k"):
        route(torch.zeros(2, 4), 5)
    with pytest.raises(ValueError, match="tokens, experts"):
        route(torch.zeros(4), 1)


def test_config_fields():
    dense = ModelConfig.from_name("tiny")
    assert dense.num_experts == 1 and "num_experts" not in dense.to_dict()
    cfg = tiny_moe_config(8, 2, "sigmoid")
    assert ModelConfig(**cfg.to_dict()) == cfg
    assert cfg.to_spec().num_experts == 8 and cfg.to_spec().experts_per_token == 2
    with pytest.raises(ValueError, match="experts_per_token"):
        tiny_moe_config(2, 3)
    with pytest.raises(ValueError, match="moe_gating"):
        tiny_moe_config(4, 2, "top1")
    with pytest.raises(ValueError, match="num_experts"):
        tiny_moe_config(0, 1)


def test_moe_model_shape_and_parameter_count():
    """Every block's MLP is the MoE layer; parameters match the closed-form count of
    llminfra.calc (E experts + an h×E router per layer)."""
    model = tiny_moe_model(seed=1)
    assert all(isinstance(b.feed_forward, MoEFeedForward) for b in model.layers)
    assert sum(p.numel() for p in model.parameters()) == param_count(model.config.to_spec())
    assert not isinstance(Transformer(ModelConfig.from_name("tiny")).layers[0].feed_forward,
                          MoEFeedForward)


@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
def test_engine_equals_own_greedy_generate(gating):
    """LLMEngine's continuous batching (ragged steps, paged cache) gives the tokens of the
    model's own one-request greedy decode. float64, so batching cannot flip a near-tie."""
    model = tiny_moe_model(seed=7, gating=gating).double()
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 256, (int(n),), generator=g).tolist() for n in (3, 11, 6)]
    prompts.append(list(b"def main("))
    outs = LLMEngine(model, ByteTokenizer()).generate(prompts, SamplingParams(max_tokens=10,
                                                                              temperature=0))
    for p, o in zip(prompts, outs):
        want = generate(model, p, 10, cache=DenseKVCache(model.config.n_layers))
        assert o.outputs[0].token_ids == want


def test_expert_is_swiglu():
    e = SwiGLUExpert(8, 12)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = e.w2(torch.nn.functional.silu(e.w1(x)) * e.w3(x))
        torch.testing.assert_close(e(x), want)


def test_dense_only_paths_refuse_a_moe_model_by_name(tmp_path):
    from llminfra.runner.fast_decode import FastDecoder
    from llminfra.model.transformer import tiny_moe_model
    from llminfra.parallel.megatron import apply_tensor_parallel
    from llminfra.parallel.world import SimulatedWorld
    from llminfra.quant.gguf_export import export_gguf
    model = tiny_moe_model(0)
    with pytest.raises(ValueError, match="num_experts=4"):
        FastDecoder(model)
    with pytest.raises(ValueError, match="num_experts=4.*expert_parallel"):
        apply_tensor_parallel(model, SimulatedWorld.group(1)[0])
    with pytest.raises(ValueError, match="num_experts=4"):
        export_gguf(model, tmp_path / "moe.gguf")
