"""The CPU fast paths of QuantLinear (int8 per channel, int4 group-wise) against the
dequantize-then-matmul reference; chapters 03 and 08."""

import pytest
import torch

from llminfra.quant import QuantLinear, quantize
from llminfra.quant import cpu_kernels
from llminfra.quant.quant_linear import use_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.kernels_available(),
                                reason="this PyTorch has no CPU int8/int4 weight-only kernels")


def _layer(out_f, in_f, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(in_f, out_f, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out_f, in_f, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(out_f, generator=g))
    return lin, g


@pytest.mark.parametrize("scheme,path", [("int8-channel", "int8"), ("int4-g128", "int4"),
                                         ("int4-g32-sym", "int4"), ("int4-g64", "int4")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fast_path_equals_reference(scheme, path, dtype):
    """Awkward shapes (N = 48·7 = 336, K = 640, leading dims (3, 5)); fp32 matches to float
    rounding, bf16 to bf16 rounding of the scales and the output (2**-8 relative)."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    print("seed", seed)
    lin, g = _layer(336, 640, seed)
    q = QuantLinear.from_linear(lin, scheme, fast=True)
    assert q.fast_path == path
    x = torch.randn(3, 5, 640, generator=g).to(dtype)
    y, ref = q(x), q.forward_reference(x)
    assert y.shape == (3, 5, 336) and y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.float(), ref.float(), rtol=tol,
                               atol=tol * float(ref.float().abs().max()))


def test_layouts_without_a_kernel_use_the_reference():
    """Per-tensor int8, per-channel int4 with K = 640 (no such group size), N not a multiple of
    16 (int4), nf4: no kernel; the output is exactly the reference."""
    for scheme, shape in (("int8-absmax", (64, 128)), ("int4-channel", (64, 640)),
                          ("int4-g32", (40, 128)), ("nf4", (64, 128))):
        lin, g = _layer(*shape, seed=1)
        q = QuantLinear.from_linear(lin, scheme)
        assert q.fast_path is None, scheme
        x = torch.randn(2, shape[1], generator=g)
        assert torch.equal(q(x), q.forward_reference(x))


def test_default_takes_the_kernels_only_where_vectorized(monkeypatch, request):
    """fast=None follows PyTorch's code: bf16 activations on AVX2 / AVX-512 take the kernel,
    fp32 activations (a plain loop there) and other CPUs dequantize; use_kernels sets and
    restores every layer's choice."""
    request.addfinalizer(cpu_kernels.vectorized.cache_clear)   # no faked answer outlives the test
    lin, g = _layer(64, 256, seed=5)
    x = torch.randn(3, 256, generator=g)
    for capability, path in (("AVX512", "int4"), ("AVX2", "int4"), ("DEFAULT", None)):
        cpu_kernels.vectorized.cache_clear()
        monkeypatch.setattr(cpu_kernels, "cpu_capability", lambda c=capability: c)
        q = QuantLinear.from_linear(lin, "int4-g128")
        assert q.fast_path == path, capability
        assert torch.equal(q(x), q.forward_reference(x))             # fp32: never the kernel
        if path is None:
            assert torch.equal(q(x.bfloat16()), q.forward_reference(x.bfloat16()))
    cpu_kernels.vectorized.cache_clear()
    monkeypatch.undo()
    model = torch.nn.Sequential(QuantLinear.from_linear(lin, "int4-g128", fast=True),
                                QuantLinear.from_linear(lin, "int8-channel"))
    with use_kernels(model, False):
        assert [m.fast_path for m in model] == [None, None]
        assert torch.equal(model[0](x), model[0].forward_reference(x))
    assert [m.fast for m in model] == [True, None]
    with pytest.raises(ValueError, match="fast must be"):
        QuantLinear.from_linear(lin, "int4-g128", fast="yes")


def test_fast_off_and_w8a8_take_their_own_paths():
    lin, g = _layer(64, 128, seed=2)
    q = QuantLinear.from_linear(lin, "int8-channel", fast=False)
    assert q.fast_path is None
    x = torch.randn(2, 128, generator=g)
    assert torch.equal(q(x), q.forward_reference(x))
    assert QuantLinear.from_linear(lin, "int8-channel", act_quant="int8").fast_path is None


def test_new_codes_rebuild_the_kernel_tensors():
    """load_state_dict of another weight: the fast path follows the new codes."""
    a, g = _layer(64, 256, seed=3)
    b, _ = _layer(64, 256, seed=4)
    qa, qb = (QuantLinear.from_linear(a, "int4-g128", fast=True),
              QuantLinear.from_linear(b, "int4-g128", fast=True))
    x = torch.randn(4, 256, generator=g)
    qa(x)  # builds the cache for a's codes
    qa.load_state_dict(qb.state_dict())
    torch.testing.assert_close(qa(x), qb(x))


def test_prepare_int4_maps_zero_points():
    """w = (u - z)·s = (u - 8)·s + (8 - z)·s: the kernel's [s, z'] pairs, for u = z + 1
    everywhere, give back s."""
    w = torch.randn(16, 64)
    q = quantize(w, "int4-g32")
    t = cpu_kernels.prepare_int4(q)
    assert t["scale_zero"].shape == (2, 16, 2)
    s, z = q.scale.float(), q.zero.float()
    torch.testing.assert_close(t["scale_zero"][..., 1].T, (8 - z) * s)
