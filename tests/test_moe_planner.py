"""Expert parallelism in closed form (llminfra/calc/expert_parallel.py) and its widget."""

import pytest

from llminfra.calc.expert_parallel import (expert_parallel_plan, routed_expert_params,
                                          uniform_overflow_fraction)
from llminfra.calc.params import expert_param_count, param_count
from llminfra.specs import get_model
from llminfra.widgets.moe_planner import MoEPlanner, ep_choices, moe_presets, plan_lines


def test_mixtral_by_hand():
    """Mixtral-8x7B: E = 8, k = 2, h = 4096, 32 layers, all MoE; one expert is 3·4096·14336.
    ep = 8, 1 token, bf16: a2a = 2·32·1·2·4096·2·7/8 = 917,504 bytes."""
    p = expert_parallel_plan("mixtral-8x7b", 8, tokens=1)
    assert expert_param_count("mixtral-8x7b") == 3 * 4096 * 14336
    assert routed_expert_params("mixtral-8x7b") == 32 * 8 * 3 * 4096 * 14336
    assert p["a2a_bytes_per_step"] == pytest.approx(917_504)
    total, routed = param_count("mixtral-8x7b"), 32 * 8 * 3 * 4096 * 14336
    assert p["weight_bytes_per_gpu"] == pytest.approx(2 * (total - routed + routed / 8))
    assert p["tp_allreduce_bytes_per_step"] == 2 * 32 * 4096 * 2
    assert p["experts_per_gpu"] == 1 and p["fits"]


def test_deepseek_dense_layers_and_traffic_scaling():
    assert get_model("deepseek-v3").num_moe_layers == 61 - 3
    assert get_model("llama-3-8b").num_moe_layers == 0 == routed_expert_params("llama-3-8b")
    one = expert_parallel_plan("deepseek-v3", 1)
    assert one["a2a_bytes_per_step"] == 0 and not one["fits"]          # 1.34 TB on one GPU
    a = expert_parallel_plan("deepseek-v3", 64, tokens=10)
    b = expert_parallel_plan("deepseek-v3", 64, tokens=20, activation_dtype="fp8")
    assert b["a2a_bytes_per_step"] == pytest.approx(a["a2a_bytes_per_step"])   # 2x tokens, 1/2 B
    assert expert_parallel_plan("deepseek-v3", 64)["fits"]


@pytest.mark.parametrize("args, match", [
    (("llama-3-8b", 2), "dense"), (("mixtral-8x7b", 3), "divide"),
    (("mixtral-8x7b", 2, ), None)])
def test_bad_values_named(args, match):
    if match is None:
        with pytest.raises(ValueError, match="top_k"):
            expert_parallel_plan(*args, top_k=9)
        with pytest.raises(ValueError, match="tokens"):
            expert_parallel_plan(*args, tokens=0)
        with pytest.raises(KeyError, match="interconnect"):
            expert_parallel_plan(*args, interconnect="smoke-signals")
        return
    with pytest.raises(ValueError, match=match):
        expert_parallel_plan(*args)


def test_widget_follows_its_controls():
    w = MoEPlanner()
    assert "mixtral-8x7b" in moe_presets() and ep_choices("mixtral-8x7b") == [1, 2, 4, 8]
    assert w.lines == plan_lines(expert_parallel_plan("mixtral-8x7b", 8, tokens=64))
    w.tokens.value = 65
    assert w.lines == plan_lines(expert_parallel_plan("mixtral-8x7b", 8, tokens=65))
    w.model.value = "deepseek-v3"
    assert (w.gpus.value, w.top_k.value) == (8, 8) and "deepseek-v3 over 8 GPUs" in w.lines[0]
    assert w.plan["a2a_bytes_per_step"] > 0 and "MB sent per GPU" in w.label.value
    with pytest.raises(ValueError):
        MoEPlanner(ep=3)


def test_dispatch_fp8_combine_bf16_by_hand():
    """DeepSeek-V3 dispatches in FP8 and combines in BF16: 1 + 2 bytes per value, 1.5x the
    traffic of FP8 both ways; Mixtral ep = 8, 1 token: 32·1·2·4096·(1 + 2)·7/8 = 688,128."""
    p = expert_parallel_plan("mixtral-8x7b", 8, tokens=1, dispatch_dtype="fp8",
                             combine_dtype="bf16")
    assert p["a2a_bytes_per_step"] == pytest.approx(688_128)
    fp8 = expert_parallel_plan("deepseek-v3", 64, tokens=64, activation_dtype="fp8")
    mixed = expert_parallel_plan("deepseek-v3", 64, tokens=64, dispatch_dtype="fp8",
                                 combine_dtype="bf16")
    assert mixed["a2a_bytes_per_step"] == pytest.approx(1.5 * fp8["a2a_bytes_per_step"])


def test_capacity_what_if_is_training_only_and_by_hand():
    """Uniform routing of 2 assignments on 2 experts at cf = 0.5: C = 1, X ~ Bin(2, 1/2),
    E[max(0, X - 1)] = 1/4 per expert -> 2 · 1/4 / 2 = 25 % dropped; nothing at a large cf;
    the plan has no what-if unless asked, and its line says serving drops none."""
    assert uniform_overflow_fraction(2, 2, 0.5) == pytest.approx(0.25)
    assert uniform_overflow_fraction(1024, 8, 3.0) == pytest.approx(0.0, abs=1e-12)
    assert uniform_overflow_fraction(1024, 8, 1.0) > uniform_overflow_fraction(1024, 8, 1.25)
    plain = expert_parallel_plan("mixtral-8x7b", 8, tokens=64)
    assert plain["overflow_fraction_training"] is None and len(plan_lines(plain)) == 3
    w = MoEPlanner()
    w.capacity.value = 1.0
    assert w.plan["overflow_fraction_training"] > 0
    assert "training-time what-if" in w.lines[-1] and "drop none" in w.lines[-1]
    w.capacity.value = 0.0
    assert w.plan["overflow_fraction_training"] is None
