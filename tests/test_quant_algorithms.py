"""GPTQ, AWQ, QuantLinear, quantize_model, the quantized KV cache, GGUF export, memory rules."""

import dataclasses

import pytest
import torch
from torch import nn

from llminfra.quant import QuantLinear, quantize, quantize_model
from llminfra.quant.awq import awq_quantize, awq_search
from llminfra.quant.gptq import HessianAccumulator, column_update, gptq_quantize, inverse_hessian_factor
from llminfra.quant.kv_quant import QuantizedKVCache, dequantize_vectors, kv_perplexity, quantize_vectors
from llminfra.quant.quant_linear import int8_matmul, int8_matmul_reference
from llminfra.quant.quantize_model import model_weight_bytes


def correlated_inputs(gen, n=1024, d=256):
    """Inputs with correlated channels and uneven magnitudes, like real activations."""
    mix = torch.randn(d, d, generator=gen) / d ** 0.5 + torch.eye(d)
    return (torch.randn(n, d, generator=gen) @ mix) * (torch.rand(d, generator=gen) * 2 + 0.1)


def out_err(X, W, qt):
    Y = X @ W.T
    return float((X @ qt.dequantize().T - Y).norm() / Y.norm())


# ---- GPTQ -----------------------------------------------------------------------------------

def test_hessian_accumulator_streams(gen):
    X = torch.randn(300, 16, generator=gen)
    h = HessianAccumulator(16)
    for chunk in X.split(70):
        h.add(chunk)
    torch.testing.assert_close(h.H, 2 * X.double().T @ X.double() / 300)


def test_column_update_sets_column_and_matches_hand_computation(gen):
    W = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    A = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    Hinv = inverse_hessian_factor(A @ A.T + torch.eye(6, dtype=torch.float64))
    q = torch.round(W[:, 2] * 4) / 4
    W2, err = column_update(W, Hinv, 2, q)
    torch.testing.assert_close(W2[:, 2], q)
    torch.testing.assert_close(W2[:, :2], W[:, :2])
    torch.testing.assert_close(W2[:, 4], W[:, 4] - (W[:, 2] - q) / Hinv[2, 2] * Hinv[2, 4])
    torch.testing.assert_close(err, (W[:, 2] - q) / Hinv[2, 2])


def test_gptq_beats_rtn_on_correlated_inputs(gen):
    W = torch.randn(128, 256, generator=gen) * 0.05
    X = correlated_inputs(gen)
    h = HessianAccumulator(256)
    h.add(X)
    e_rtn = out_err(X, W, quantize(W, "int4-g128"))
    e_gptq = out_err(X, W, gptq_quantize(W, h.H, 4, 128))
    e_act = out_err(X, W, gptq_quantize(W, h.H, 4, 128, act_order=True))
    assert e_gptq < 0.8 * e_rtn and e_act < 0.8 * e_rtn


def test_gptq_lazy_batches_equal_column_by_column(gen):
    """Lazy batch updates (B = 128) give the codes of plain one-column-at-a-time GPTQ (B = 1)."""
    W = torch.randn(32, 200, generator=gen)
    h = HessianAccumulator(200)
    h.add(correlated_inputs(gen, 512, 200))
    a = gptq_quantize(W, h.H, 4, 64, block_size=128)
    b = gptq_quantize(W, h.H, 4, 64, block_size=1)
    assert (a.dequantize() == b.dequantize()).float().mean() > 0.999
    torch.testing.assert_close(a.dequantize(), b.dequantize(), rtol=0, atol=float(a.scale.max()) * 1.01)


def test_gptq_deterministic_and_same_layout_as_rtn(gen):
    W, X = torch.randn(64, 128, generator=gen), correlated_inputs(gen, 256, 128)
    h = HessianAccumulator(128)
    h.add(X)
    a, b = gptq_quantize(W, h.H), gptq_quantize(W, h.H)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale)
    r = quantize(W, "int4-g128")
    assert a.nbytes == r.nbytes and a.codes.shape == r.codes.shape


def test_gptq_dead_inputs_and_bad_shapes(gen):
    W = torch.randn(8, 32, generator=gen)
    X = torch.randn(100, 32, generator=gen)
    X[:, 5] = 0                                     # an input channel that never fires
    h = HessianAccumulator(32)
    h.add(X)
    qt = gptq_quantize(W, h.H, 4, "channel")
    assert torch.isfinite(qt.dequantize()).all()
    with pytest.raises(ValueError, match="H"):
        gptq_quantize(W, torch.eye(31))
    with pytest.raises(ValueError, match="tensor"):
        gptq_quantize(W, h.H, 4, "tensor")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (not counted as a pass)")
def test_gptq_and_awq_follow_the_weight_to_cuda(gen):
    """Device from the inputs: a CUDA weight with a CPU Hessian / CPU calibration inputs (what
    quantize_model records) quantizes on the GPU to the codes the CPU run gives."""
    W, X = torch.randn(32, 128, generator=gen), correlated_inputs(gen, 256, 128)
    h = HessianAccumulator(128)
    h.add(X)
    for cpu, gpu in ((gptq_quantize(W, h.H, 4, 64), gptq_quantize(W.cuda(), h.H, 4, 64)),
                     (awq_quantize(W, X, 4, 64), awq_quantize(W.cuda(), X, 4, 64))):
        assert gpu.codes.is_cuda and gpu.scale.is_cuda
        gpu_cpu = dataclasses.replace(gpu, **{f: None if t is None else t.cpu() for f, t in
                                              (("codes", gpu.codes), ("scale", gpu.scale),
                                               ("zero", gpu.zero), ("input_scale", gpu.input_scale))})
        assert out_err(X, W, gpu_cpu) == pytest.approx(out_err(X, W, cpu), rel=0.02)


# ---- AWQ ------------------------------------------------------------------------------------

def test_awq_helps_with_outlier_channels_and_is_deterministic(gen):
    W = torch.randn(128, 256, generator=gen) * 0.05
    X = torch.randn(1024, 256, generator=gen)
    X[:, [3, 50, 77, 200]] *= 40                    # injected outlier input channels
    e_rtn = out_err(X, W, quantize(W, "int4-g128"))
    a = awq_quantize(W, X)
    assert out_err(X, W, a) < 0.7 * e_rtn
    b = awq_quantize(W, X)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.input_scale, b.input_scale)
    assert a.nbytes == quantize(W, "int4-g128").nbytes + 256 * 2    # fp16 input scales counted


def test_awq_alpha_zero_is_rtn(gen):
    W, X = torch.randn(16, 128, generator=gen), torch.randn(64, 128, generator=gen)
    alpha, errors = awq_search(W, X)
    Y = X @ W.T
    rtn = float(((X @ quantize(W, "int4-g128").dequantize().T - Y) ** 2).mean())
    assert errors[0] == pytest.approx(rtn, rel=1e-5) and min(errors) <= errors[0]
    assert 0 <= alpha < 1


# ---- QuantLinear and quantize_model ---------------------------------------------------------

@pytest.mark.parametrize("scheme,tol", [("int8-channel", 0.01), ("int8-absmax", 0.03),
                                        ("fp8-e4m3", 0.05), ("int4-g128", 0.15), ("nf4", 0.15)])
def test_quant_linear_close_to_linear(scheme, tol, gen):
    lin = nn.Linear(200, 72, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(72, 200, generator=gen) * 0.05)
        lin.bias.copy_(torch.randn(72, generator=gen))
    x = torch.randn(3, 9, 200, generator=gen)
    ql = QuantLinear.from_linear(lin, scheme)
    with torch.no_grad():
        y, yq = lin(x) - lin.bias, ql(x) - lin.bias
    assert float((yq - y).norm() / y.norm()) < tol
    torch.testing.assert_close(ql(x), nn.functional.linear(x, ql.qweight.dequantize(), lin.bias))
    assert ql.weight_nbytes == quantize(lin.weight, scheme).nbytes


def test_w8a8_dynamic_matches_its_definition(gen):
    lin = nn.Linear(64, 48, bias=False)
    ql = QuantLinear.from_linear(lin, "int8-channel", act_quant="int8")
    x = torch.randn(5, 64, generator=gen)
    with torch.no_grad():
        y, yq = lin(x), ql(x)
    assert float((yq - y).norm() / y.norm()) < 0.02
    with pytest.raises(ValueError, match="int8-channel"):
        QuantLinear.from_linear(lin, "int4-g128", act_quant="int8")


def test_int8_matmul_equals_reference(gen):
    a = torch.randint(-127, 128, (33, 64), generator=gen, dtype=torch.int8)
    b = torch.randint(-127, 128, (64, 40), generator=gen, dtype=torch.int8)
    assert torch.equal(int8_matmul(a, b), int8_matmul_reference(a, b))


def small_model(gen):
    from llminfra.model import ModelConfig, Transformer
    cfg = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                      max_seq_len=64)
    return Transformer(cfg, generator=gen).eval()


@pytest.mark.parametrize("scheme", ["int8-absmax", "int4-g128", "nf4", "fp8-e4m3", "int8-dynamic",
                                    "gptq-int4-g32", "awq-int4-g32"])
def test_quantize_model_replaces_block_linears(scheme, gen):
    import copy
    model = small_model(gen)
    tokens = torch.randint(0, 256, (2, 40), generator=gen)
    with torch.no_grad():
        ref = model(tokens)
    q = quantize_model(copy.deepcopy(model), scheme, calibration=tokens)
    kinds = {n: type(m).__name__ for n, m in q.named_modules() if n.startswith("layers.0.")}
    assert kinds["layers.0.attention.wq"] == "QuantLinear"
    assert kinds["layers.0.feed_forward.w2"] == "QuantLinear"
    assert isinstance(q.output, nn.Linear)
    with torch.no_grad():
        out = q(tokens)
    assert out.shape == ref.shape and float((out - ref).norm() / ref.norm()) < 0.5
    assert model_weight_bytes(q)["quantized_params"] == 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 96)


def test_quantize_model_errors(gen):
    model = small_model(gen)
    with pytest.raises(ValueError, match="calibration"):
        quantize_model(model, "gptq-int4-g128")
    with pytest.raises(KeyError, match="unknown quantization scheme"):
        quantize_model(model, "int9-foo")
    with pytest.raises(KeyError, match="group"):
        quantize_model(model, "gptq-fp8-e4m3", calibration=torch.zeros(1, 8, dtype=torch.long))


def test_gptq_model_deterministic(gen):
    import copy
    model = small_model(gen)
    tokens = torch.randint(0, 256, (2, 32), generator=gen)
    a = quantize_model(copy.deepcopy(model), "gptq-int4-g32", tokens)
    b = quantize_model(copy.deepcopy(model), "gptq-int4-g32", tokens)
    assert all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers()))


# ---- KV cache -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,tol", [("int8", 0.01), ("fp8-e4m3", 0.05)])
def test_kv_vectors_round_trip(fmt, tol, gen):
    x = torch.randn(2, 3, 17, 32, generator=gen)
    c, s = quantize_vectors(x, fmt)
    assert c.element_size() == 1 and s.dtype == torch.float16
    assert float((dequantize_vectors(c, s, x.dtype) - x).norm() / x.norm()) < tol


def test_quantized_kv_cache_bytes_and_protocol(gen):
    cache = QuantizedKVCache(2, "int8")
    k, v = torch.randn(1, 2, 5, 16, generator=gen), torch.randn(1, 2, 5, 16, generator=gen)
    ka, va = cache.update(0, k, v)
    ka, va = cache.update(0, k[:, :, :1], v[:, :, :1])
    assert ka.shape == (1, 2, 6, 16) and cache.seq_len == 6
    assert cache.nbytes == 2 * (1 * 2 * 6 * 16 * 1 + 1 * 2 * 6 * 2)
    with pytest.raises(KeyError, match="int8"):
        QuantizedKVCache(2, "int5")


def test_kv_perplexity_close_to_dense(gen):
    model = small_model(gen)
    tokens = torch.randint(0, 256, (300,), generator=gen)
    from llminfra.model import perplexity
    dense = kv_perplexity(model, tokens, None, seq_len=64)
    assert dense == pytest.approx(perplexity(model, tokens[: 4 * 64 + 1], seq_len=64), rel=1e-4)
    assert kv_perplexity(model, tokens, "int8", seq_len=64) == pytest.approx(dense, rel=0.01)


# ---- GGUF and memory rules ------------------------------------------------------------------

def test_gguf_round_trip(tmp_path, gen):
    from llminfra.quant.gguf_export import export_gguf, load_state_dict_from_gguf, read_gguf
    model = small_model(gen)
    path = export_gguf(model, tmp_path / "m.gguf", "Q8_0")
    meta, tensors = read_gguf(path)
    assert meta["llama.block_count"] == 2 and meta["llama.embedding_length"] == 64
    assert tensors["blk.0.attn_q.weight"]["type"] == "Q8_0"
    assert tensors["blk.0.attn_q.weight"]["nbytes"] == 64 * 64 // 32 * 34
    sd = load_state_dict_from_gguf(model, path)
    for name, p in model.state_dict().items():
        assert sd[name].shape == p.shape
        assert float((sd[name] - p).norm() / p.norm()) < 0.01, name


def test_memory_rules_worked():
    """Llama-2-70B: 4-bit with one fp16 scale per 128 weights is more than params · 0.5."""
    from llminfra.quant.memory_rules import kv_stays, seventy_b_at_4_bits, weight_rule_table
    r = seventy_b_at_4_bits()
    assert r["naive_bytes"] < r["with_scales_bytes"] < r["with_scales_and_zeros_bytes"]
    assert [row["rule_of_thumb_bytes"] for row in weight_rule_table()] == [28e9, 14e9, 7e9, 3.5e9]
    rows = kv_stays()
    assert rows[0]["kv_bytes"] == rows[1]["kv_bytes"] == 2 * rows[2]["kv_bytes"]


def test_bad_arguments_name_the_value():
    W, X = torch.randn(8, 16), torch.randn(32, 16)
    with pytest.raises(ValueError, match="block_size"):
        gptq_quantize(W, X.T @ X, block_size=0, granularity=8)
    with pytest.raises(ValueError, match="n_grid"):
        awq_search(W, X, n_grid=0, granularity=8)
    cache = QuantizedKVCache(1)
    with pytest.raises(ValueError, match=r"\(B, H_kv, T, d\)"):
        cache.update(0, torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 5))
    cache.update(0, torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    with pytest.raises(ValueError, match="does not continue"):
        cache.update(0, torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4))


# ---- hardening (issue 13) -------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["nan", "inf", "empty"])
def test_awq_refuses_unusable_calibration_data(gen, bad):
    """NaN / inf / empty X used to make every grid error NaN, and min() then picked α = 0:
    plain round-to-nearest, silently."""
    W, X = torch.randn(8, 32, generator=gen), torch.randn(64, 32, generator=gen)
    if bad == "empty":
        X = X[:0]
    else:
        X[3, 5] = float(bad)
    for call in (lambda: awq_search(W, X, granularity=8), lambda: awq_quantize(W, X, granularity=8)):
        with pytest.raises(ValueError, match="calibration"):
            call()


def test_awq_refuses_inputs_whose_output_error_overflows(gen):
    """Finite X whose layer outputs overflow float32 (1e30 · 1e30) also leave no usable error."""
    W, X = torch.randn(8, 32, generator=gen) * 1e10, torch.randn(64, 32, generator=gen) * 1e30
    with pytest.raises(ValueError, match="not finite"):
        awq_search(W, X, granularity=8)


def test_hessian_accumulator_checks_its_inputs(gen):
    h = HessianAccumulator(16)
    with pytest.raises(ValueError, match="16"):
        h.add(torch.randn(4, 15, generator=gen))          # used to be a raw broadcast error
    x = torch.randn(4, 16, generator=gen)
    x[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        h.add(x)                                          # used to be taken silently
    assert h.n == 0 and not h.H.any()
    h.add(torch.randn(0, 16))                             # used to be ZeroDivisionError
    assert h.n == 0 and not h.H.any()                     # an empty batch adds nothing
    X = torch.randn(10, 16, generator=gen)
    h.add(X)
    torch.testing.assert_close(h.H, 2 * X.double().T @ X.double() / 10)


def test_gptq_bad_hessian_and_percdamp_say_why(gen):
    W = torch.randn(4, 2, generator=gen)
    indefinite = torch.tensor([[1.0, 2.0], [2.0, 1.0]])   # eigenvalues 3 and -1
    with pytest.raises(ValueError, match="positive definite.*percdamp"):
        gptq_quantize(W, indefinite, 4, "channel")
    H = torch.tensor([[2.0, 0.5], [0.5, 1.0]])
    for bad in (-0.01, float("nan"), "1%"):
        with pytest.raises(ValueError, match="percdamp"):
            gptq_quantize(W, H, 4, "channel", percdamp=bad)
    with pytest.raises(ValueError, match="finite"):
        gptq_quantize(W, torch.tensor([[float("nan"), 0.0], [0.0, 1.0]]), 4, "channel")
    with pytest.raises(ValueError, match="symmetric"):
        gptq_quantize(W, torch.tensor([[2.0, 0.5], [0.0, 1.0]]), 4, "channel")
    with pytest.raises(ValueError, match="all zeros"):
        gptq_quantize(W, HessianAccumulator(2).H, 4, "channel")


def test_dampening_is_a_share_of_the_mean_diagonal():
    """H = diag(1, 3), percdamp = 0.5: λ = 0.5 · mean(1, 3) = 1, (H + λI)⁻¹ = diag(1/2, 1/4),
    whose upper Cholesky factor is diag(1/√2, 1/2). (λ from the maximum, 1.5, would give
    diag(1/√2.5, 1/√4.5).)"""
    U = inverse_hessian_factor(torch.diag(torch.tensor([1.0, 3.0])), percdamp=0.5)
    torch.testing.assert_close(U, torch.diag(torch.tensor([2 ** -0.5, 0.5], dtype=torch.float64)))
