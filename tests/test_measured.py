"""Tests for llminfra.calc.measured: each measurement checked against numbers worked by hand."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from llminfra.calc.measured import (measure_training_step, optimizer_state_bytes,
                                    parameter_bytes, peak_forward_bytes, saved_activations,
                                    tensor_storage_bytes)


def _mlp(d: int, act: nn.Module, gen: torch.Generator) -> nn.Sequential:
    m = nn.Sequential(nn.Linear(d, 4 * d), act, nn.Linear(4 * d, d))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return m


def _draw(gen):
    B = int(torch.randint(1, 9, (1,), generator=gen)) * 3 + 1  # awkward sizes: 4, 7, ..., 25
    d = int(torch.randint(3, 40, (1,), generator=gen))
    return B, d


def test_storage_bytes_counts_views_and_tied_weights_once():
    """A (1000, 10) fp32 tensor and its transpose share 40,000 bytes; a tied weight counts once."""
    x = torch.zeros(1000, 10)
    assert tensor_storage_bytes([x, x.t(), x[:5]]) == 40_000
    emb = nn.Embedding(7, 3)
    head = nn.Linear(3, 7, bias=False)
    head.weight = emb.weight
    assert parameter_bytes(nn.ModuleList([emb, head])) == 7 * 3 * 4


def test_saved_activations_relu_mlp_by_hand(gen):
    """Linear(d,4d) -> ReLU -> Linear(4d,d) -> (y**2).sum() on x (B, d), fp32.

    Saved: x (first matmul, for the weight's grad), the ReLU *output* (ReLU's backward and the
    second matmul share it), y (for pow). The first linear's output is NOT saved.
    Bytes = 4·(B·d + 4·B·d + B·d) = 24·B·d; weights excluded.
    """
    B, d = _draw(gen)
    m = _mlp(d, nn.ReLU(), gen)
    x = torch.randn(B, d, generator=gen)
    loss, saved = saved_activations(lambda: m(x).pow(2).sum(), exclude=m.parameters())
    assert saved.total_bytes == 24 * B * d
    loss.backward()  # the graph is intact
    assert all(p.grad is not None for p in m.parameters())


def test_saved_activations_gelu_saves_its_input(gen):
    """GELU's backward needs its input: the first linear's output (4·B·d) is saved as well as
    GELU's output: 4·(B·d + 4·B·d + 4·B·d + B·d) = 40·B·d bytes."""
    B, d = _draw(gen)
    m = _mlp(d, nn.GELU(), gen)
    x = torch.randn(B, d, generator=gen)
    _, saved = saved_activations(lambda: m(x).pow(2).sum(), exclude=m.parameters())
    assert saved.total_bytes == 40 * B * d
    assert saved.by_shape()[((B, 4 * d), "float32")] == (2, 32 * B * d)


def test_saved_activations_without_exclude_counts_weights(gen):
    """Without ``exclude`` a weight is counted when backward needs it: the second linear's
    weight (4·d², fp32 = 16·d² bytes) carries the gradient back to the first layer; the first
    one's is not saved, since x does not require a gradient."""
    B, d = _draw(gen)
    m = _mlp(d, nn.ReLU(), gen)
    x = torch.randn(B, d, generator=gen)
    _, saved = saved_activations(lambda: m(x).pow(2).sum())
    assert saved.total_bytes == 24 * B * d + 16 * d * d


def test_peak_forward_relu_mlp_by_hand(gen):
    """No-grad forward of Linear(d,4d) -> ReLU -> Linear(4d,d): the peak is while ReLU runs,
    with the first output and ReLU's output alive: 4·(4·B·d + 4·B·d) = 32·B·d bytes.
    The input and the weights existed before and are not counted."""
    B, d = _draw(gen)
    m = _mlp(d, nn.ReLU(), gen)
    assert peak_forward_bytes(m, torch.randn(B, d, generator=gen)) == 32 * B * d


def test_peak_forward_counts_inplace_and_views_once(gen):
    """In-place ReLU and a view add no bytes: peak = first output (16·B·d) + second output
    (4·B·d) held together during the second matmul = 20·B·d."""
    B, d = _draw(gen)
    m = _mlp(d, nn.ReLU(inplace=True), gen)
    assert peak_forward_bytes(m, torch.randn(B, d, generator=gen)) == 20 * B * d


def test_peak_forward_releases_memory_in_a_chain(gen):
    """A chain of n Linear(d, d): each output is freed once the next exists, so the peak is two
    outputs (8·B·d bytes) whatever n is."""
    B, d = _draw(gen)
    for n in (1, 3, 6):
        m = nn.Sequential(*[nn.Linear(d, d) for _ in range(n)])
        expected = 4 * B * d * (1 if n == 1 else 2)
        assert peak_forward_bytes(m, torch.randn(B, d, generator=gen)) == expected


def test_training_step_adamw_by_hand(gen):
    """AdamW on fp32 weights: gradients 4·P, exp_avg 4·P, exp_avg_sq 4·P, step 4 bytes per
    parameter tensor (4 tensors here: two weights, two biases); P = 8·d² + 5·d."""
    B, d = _draw(gen)
    m = _mlp(d, nn.ReLU(), gen)
    x = torch.randn(B, d, generator=gen)
    r = measure_training_step(m, (x,), lambda y: y.pow(2).sum())
    P = 8 * d * d + 5 * d
    assert r.parameters == 4 * P and r.gradients == 4 * P
    assert r.optimizer_states == {"step": 4 * 4, "exp_avg": 4 * P, "exp_avg_sq": 4 * P}
    assert r.activations == 24 * B * d and r.inference_peak == 32 * B * d
    assert r.training_total == 16 * P + 16 + 24 * B * d


def test_training_step_sgd_has_no_state(gen):
    """Plain SGD (no momentum) keeps no optimizer state."""
    B, d = _draw(gen)
    m = _mlp(d, nn.ReLU(), gen)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    r = measure_training_step(m, (torch.randn(B, d, generator=gen),), lambda y: y.sum(), opt)
    assert r.optimizer_states == {} and r.optimizer_state_bytes == 0
    assert optimizer_state_bytes(opt) == {}


def test_bad_inputs_are_reported():
    m = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="tuple"):
        measure_training_step(m, torch.zeros(2, 3), lambda y: y.sum())
    with pytest.raises(ValueError, match="scalar"):
        measure_training_step(m, (torch.zeros(2, 3),), lambda y: y)
    frozen = nn.Linear(3, 3).requires_grad_(False)
    with pytest.raises(ValueError, match="trainable"):
        measure_training_step(frozen, (torch.zeros(2, 3),), lambda y: y.sum())


def test_tiny_transformer_parts_match_the_calculator():
    """On the course's tiny model (fp32): parameters, gradients and AdamW moments are exactly
    4, 4 and 8 bytes per parameter, as in the calculator's ``adamw-fp32`` recipe; the step
    counters are 4 bytes per parameter tensor; saved activations are exactly affine in the
    batch (a·B + c: c is the rotary tables, the causal masks and the loss's scalar), so the
    second difference over B = 2, 3, 4 is zero (at B = 1 the flattened targets are a view of
    the tokens, not a copy, which breaks the pattern by 8·16 bytes)."""
    import llminfra.model as model_mod
    from llminfra.calc.memory import training_memory
    from llminfra.calc.params import param_count

    config = model_mod.ModelConfig.from_name("tiny")
    spec = config.to_spec()
    P = param_count(spec)
    results = {}
    for B in (2, 3, 4):
        model = model_mod.Transformer(config)
        tok = torch.randint(0, config.vocab_size, (B, 17), generator=torch.Generator().manual_seed(B))
        loss = lambda logits, t=tok: F.cross_entropy(logits.flatten(0, 1), t[:, 1:].flatten())
        results[B] = measure_training_step(model, (tok[:, :-1],), loss)
    calc = training_memory(spec, batch=2, seq_len=16, recipe="adamw-fp32")
    r = results[2]
    assert r.parameters == calc["weights"] == 4 * P
    assert r.gradients == calc["gradients"]
    assert r.optimizer_states["exp_avg"] + r.optimizer_states["exp_avg_sq"] == calc["optimizer_states"]
    assert r.optimizer_states["step"] == 4 * len(list(model.parameters()))
    act = {B: res.activations for B, res in results.items()}
    assert act[4] - 2 * act[3] + act[2] == 0 and act[3] > act[2]
    peak = {B: res.inference_peak for B, res in results.items()}
    assert peak[2] < peak[3] < peak[4]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (cross-check with "
                    "the CUDA caching allocator's statistics)")
def test_peak_forward_matches_the_cuda_allocator():
    """On a GPU the caching allocator counts every byte handed out: its peak above the baseline
    during a no-grad forward must be the tracker's peak (sizes are multiples of 512 bytes, the
    allocator's rounding; a warm-up call creates cuBLAS's workspace first)."""
    B, d = 64, 256
    gen = torch.Generator().manual_seed(0)
    m = _mlp(d, nn.GELU(), gen).cuda()
    x = torch.randn(B, d, generator=gen).cuda()
    with torch.no_grad():
        m(x)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        y = m(x)
        del y
    torch.cuda.synchronize()
    allocator_peak = torch.cuda.max_memory_allocated() - base
    assert peak_forward_bytes(m, x) == 32 * B * d
    assert allocator_peak == pytest.approx(32 * B * d, rel=0.05)
