"""oneDNN's prepacked matmul (llminfra.runner.prepacked): the copy shares the model's weights and
leaves the model alone, computes what F.linear computes (to float32 rounding), runs through the
engine with the same greedy tokens, and refuses what it cannot pack by name."""

import pytest
import torch
from torch import nn

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import load_tiny
from llminfra.runner import prepacked as pp

pytestmark = pytest.mark.skipif(not pp.available(), reason="this PyTorch build has no oneDNN "
                                "(not counted as a pass)")


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


def test_copy_shares_every_weight_and_leaves_the_model_alone(tiny):
    model, _ = tiny
    fast = pp.prepacked(model)
    assert fast is not model
    assert not any(isinstance(m, pp.PrepackedLinear) for m in model.modules())
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    assert sum(isinstance(m, pp.PrepackedLinear) for m in fast.modules()) == n_linear > 0
    theirs, ours = model.state_dict(), fast.state_dict()
    assert list(theirs) == list(ours)
    assert all(ours[k].data_ptr() == theirs[k].data_ptr() for k in theirs)


def test_logits_equal_the_plain_model_to_float32_rounding(tiny):
    model, _ = tiny
    fast = pp.prepacked(model)
    tokens = torch.randint(0, model.config.vocab_size, (3, 17), generator=torch.Generator()
                           .manual_seed(0))
    with torch.no_grad():
        want, got = model(tokens), fast(tokens)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_packed_linear_with_bias_and_rows_of_any_count():
    torch.manual_seed(0)
    layer = nn.Linear(64, 48)
    fast = pp.PrepackedLinear(layer)
    for rows in (1, 5, 16, 33):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(fast(x), layer(x), atol=1e-5, rtol=1e-5)


def test_engine_on_the_copy_gives_the_plain_engines_tokens(tiny):
    model, tok = tiny
    prompts = ["def add(a, b):", "Return the", "import os\n"]
    params = SamplingParams(max_tokens=24)
    want = [o.outputs[0].token_ids for o in LLMEngine(model, tok).generate(prompts, params)]
    got = [o.outputs[0].token_ids
           for o in LLMEngine(pp.prepacked(model), tok).generate(prompts, params)]
    assert got == want


def test_what_cannot_be_packed_is_refused_by_name(monkeypatch):
    with pytest.raises(ValueError, match="no float32 CPU nn.Linear"):
        pp.prepacked(nn.Sequential(nn.ReLU()))
    with pytest.raises(ValueError, match="2-D float32 CPU weight"):
        pp.pack_weight(torch.zeros(4, 4, dtype=torch.float64))
    monkeypatch.setattr(pp, "available", lambda: False)
    with pytest.raises(RuntimeError, match="no oneDNN"):
        pp.prepacked(nn.Sequential(nn.Linear(4, 4)))


def test_serve_builds_its_engine_on_the_chosen_kernel():
    """``llminfra serve --matmul onednn`` serves the prepacked copy; a wrong name is refused."""
    from llminfra.serving.serve import build_engine
    engine = build_engine("tiny", matmul="onednn", num_blocks=64)
    assert any(isinstance(m, pp.PrepackedLinear) for m in engine.model.modules())
    plain = build_engine("tiny", num_blocks=64)
    assert not any(isinstance(m, pp.PrepackedLinear) for m in plain.model.modules())
    with pytest.raises(ValueError, match="matmul 'mkl'; allowed"):
        build_engine("tiny", matmul="mkl")


def test_auto_is_prepacked_for_a_real_model_where_torch_has_it(monkeypatch):
    """``--matmul auto`` (the default): prepacked for a real model (with one or two rows on the
    C kernel where it builds: ``skinny``), F.linear for the tiny one (whose stored outputs are
    F.linear's), and F.linear where PyTorch lacks oneDNN."""
    from llminfra.kernels import w4a8
    from llminfra.runner.kernel_choice import resolve_matmul
    assert resolve_matmul("auto", "tiny") == "plain"
    real = ("skinny" if w4a8.available() else "onednn") if pp.available() else "plain"
    assert resolve_matmul("auto", "smollm2-135m") == real
    monkeypatch.setattr(w4a8, "available", lambda: False)
    assert resolve_matmul("auto", "smollm2-135m") == ("onednn" if pp.available() else "plain")
    assert resolve_matmul("plain", "smollm2-135m") == "plain"
    assert resolve_matmul("onednn", "tiny") == "onednn"
    monkeypatch.setattr(pp, "available", lambda: False)
    assert resolve_matmul("auto", "/models/x.gguf") == "plain"
    with pytest.raises(ValueError, match="matmul 'fast'; allowed"):
        resolve_matmul("fast", "tiny")
