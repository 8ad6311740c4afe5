"""Number formats, round-to-nearest, packing, fp8, NF4 and the QuantizedTensor byte counts."""

import math

import pytest
import torch

from llminfra.quant import QuantizedTensor, STANDARD_SCHEMES, parse_scheme, quantize
from llminfra.quant import formats, packing
from llminfra.quant.nf4 import NF4_REFERENCE, nf4_code, nf4_decode, nf4_encode
from llminfra.quant.rtn import absmax_dequantize, absmax_quantize


# ---- number formats -------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(formats.TORCH_DTYPES))
def test_range_from_bits_matches_finfo(name):
    for key, (from_bits, from_torch) in formats.finfo_comparison(name).items():
        assert from_bits == from_torch, (name, key)


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8-e4m3", "fp8-e5m2"])
def test_software_rounding_matches_torch_cast(name, gen):
    fmt_max = torch.finfo(formats.TORCH_DTYPES[name]).max
    x = torch.randn(20000, generator=gen, dtype=torch.float64) * torch.exp(
        torch.randn(20000, generator=gen, dtype=torch.float64) * 4)
    x = x.clamp(-fmt_max, fmt_max).float().double()  # fp32 values: no double rounding
    ours = formats.round_to_format(x, name)
    theirs = x.float().to(formats.TORCH_DTYPES[name]).double()
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2"])
def test_bit_fields_match_torch_bits(name, gen):
    dtype = formats.TORCH_DTYPES[name]
    bits = {torch.float32: 32, torch.float16: 16, torch.bfloat16: 16}.get(dtype, 8)
    view = {32: torch.int32, 16: torch.int16, 8: torch.uint8}[bits]
    fmt = formats.get_format(name)
    for v in (torch.randn(50, generator=gen) * 3).tolist() + [0.0, -1.0, 2.0 ** (1 - fmt.bias - 1)]:
        stored = float(torch.tensor(v).to(dtype).float())
        s, e, m = formats.float_fields(stored, name)
        raw = int(torch.tensor([stored]).to(dtype).view(view)[0]) & (2 ** bits - 1)
        assert raw == (s << (bits - 1)) | (e << fmt.mantissa_bits) | m, (name, v)


def test_encode_worked_examples():
    """0.1 in bf16: 7 mantissa bits keep 0.10009765625; 1.0 in fp16 is 0 01111 0000000000."""
    assert formats.encode(0.1, "bf16")["stored"] == 0.10009765625
    assert formats.encode(1.0, "fp16")["bits"] == "0 01111 0000000000"
    assert formats.encode(448.0, "fp8-e4m3")["bits"] == "0 1111 110"
    assert formats.encode(-3.0, "int4")["bits"] == "1101"
    assert formats.encode(1000.0, "fp8-e4m3")["abs_error"] == math.inf   # no inf in e4m3: NaN
    assert formats.encode(1e6, "fp16")["stored"] == math.inf
    rows = formats.encode_all(0.3)
    assert [r["format"] for r in rows] == list(formats.SHOWN_FORMATS)
    with pytest.raises(KeyError, match="known formats"):
        formats.encode(1.0, "fp7")


# ---- packing --------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 7, 8])
@pytest.mark.parametrize("n", [1, 7, 8, 33])
def test_pack_unpack_identity(bits, n, gen):
    codes = torch.randint(0, 2 ** bits, (3, n), generator=gen).to(torch.uint8)
    packed = packing.pack_bits(codes, bits)
    assert packed.shape == (3, packing.packed_length(n, bits)) and packed.dtype == torch.uint8
    assert torch.equal(packing.unpack_bits(packed, bits, n), codes)
    assert torch.equal(packing.unpack(packing.pack(codes, bits), bits, n), codes)


def test_nibble_packing_equals_bit_stream(gen):
    codes = torch.randint(0, 16, (5, 13), generator=gen).to(torch.uint8)
    assert torch.equal(packing.pack_int4(codes), packing.pack_bits(codes, 4))
    assert packing.pack_int4(torch.tensor([[1, 2]], dtype=torch.uint8)).item() == 0x21


def test_packing_rejects_out_of_range_codes():
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        packing.pack_int4(torch.tensor([16], dtype=torch.uint8))


# ---- round-to-nearest -----------------------------------------------------------------------

def test_absmax_worked_example():
    """x = [0.5, -1.27]: s = 1.27 / 127 = 0.01, q = [50, -127]."""
    q, s = absmax_quantize(torch.tensor([0.5, -1.27]))
    assert q.tolist() == [50, -127] and math.isclose(float(s), 0.01, rel_tol=1e-6)
    assert torch.allclose(absmax_dequantize(q, s), torch.tensor([0.5, -1.27]))


@pytest.mark.parametrize("scheme", STANDARD_SCHEMES + ("int4-g32-sym", "int3-channel", "nf4-g128",
                                                       "fp8-e4m3-channel", "int2-g64", "int6-g256"))
@pytest.mark.parametrize("shape", [(37, 300), (64, 128), (5, 1), (1000,), (3, 4, 50)])
def test_round_trip_error_bound(scheme, shape, gen):
    """Every element's error is within half a step of its group (absmax), one step (zero point:
    rounding z shifts the grid by up to half a step, so the range ends may be clamped), the fp8
    rounding bound, or half the largest NF4 gap."""
    w = torch.randn(*shape, generator=gen) * 0.05
    qt = quantize(w, scheme)
    d = qt.dequantize()
    assert d.shape == w.shape and d.dtype == torch.float32
    s = parse_scheme(scheme)
    step = qt.step_per_value()
    err = (d - w).abs()
    if s.kind == "int":
        bound = 0.5001 if s.symmetric else 1.0001
        assert bool((err <= step * bound + 1e-7).all())
    elif s.kind == "fp8":
        assert bool((err <= w.abs() * 2.0 ** -(formats.get_format(s.fp8_format).mantissa_bits + 1)
                     + step * 2.0 ** -9 + 1e-7).all())
    else:
        gap = float((nf4_code()[1:] - nf4_code()[:-1]).max())
        assert bool((err <= step * gap / 2 + 1e-7).all())


@pytest.mark.parametrize("scheme,expected", [("int8-absmax", 1.0), ("int8-channel", 1.0),
                                              ("int4-g128", 0.5), ("int3-g128", 0.375),
                                              ("fp8-e4m3", 1.0), ("nf4", 0.5)])
def test_nbytes_is_honest(scheme, expected, gen):
    """nbytes = codes + scales + zero points, element for element."""
    w = torch.randn(96, 256, generator=gen)
    qt = quantize(w, scheme)
    parts = [qt.codes, qt.scale] + ([qt.zero] if qt.zero is not None else [])
    assert qt.nbytes == sum(t.numel() * t.element_size() for t in parts)
    code_bytes = qt.codes.numel() * qt.codes.element_size()
    assert code_bytes == pytest.approx(w.numel() * expected, rel=0.01)


def test_int4_g128_bytes_per_param_target(gen):
    """4 bits + one fp16 scale + one uint8 zero point per 128 weights = 0.5234 bytes/param."""
    qt = quantize(torch.randn(256, 688, generator=gen), "int4-g128")
    assert qt.bytes_per_param <= 0.54
    assert qt.nbytes == 256 * 344 + 256 * 6 * 2 + 256 * 6


def test_zero_point_beats_absmax_on_lopsided_data(gen):
    w = torch.rand(64, 128, generator=gen)           # all positive, like post-ReLU values
    e_sym = (quantize(w, "int4-g128-sym").dequantize() - w).norm()
    e_asym = (quantize(w, "int4-g128").dequantize() - w).norm()
    assert e_asym < 0.6 * e_sym


def test_finer_groups_reduce_error(gen):
    w = torch.randn(64, 512, generator=gen) * torch.rand(1, 512, generator=gen) * 3
    errs = [float((quantize(w, s).dequantize() - w).norm()) for s in
            ("int4-tensor", "int4-channel", "int4-g128-sym", "int4-g32-sym")]
    assert errs == sorted(errs, reverse=True)


# ---- awkward tensors ------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["int8-absmax", "int8-zeropoint", "int4-g128", "fp8-e4m3", "nf4"])
def test_all_zero_and_constant_tensors(scheme):
    z = torch.zeros(8, 130)
    assert torch.equal(quantize(z, scheme).dequantize(), z)
    for c in (0.75, -2.5):
        w = torch.full((8, 130), c)
        torch.testing.assert_close(quantize(w, scheme).dequantize(), w, rtol=2e-3, atol=0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("scheme", ["int8-absmax", "int4-g128", "fp8-e4m3", "nf4"])
def test_nan_and_inf_give_clear_error(bad, scheme):
    w = torch.randn(4, 64)
    w[1, 3] = bad
    with pytest.raises(ValueError, match="NaN"):
        quantize(w, scheme)


def test_bad_inputs_name_the_problem():
    with pytest.raises(KeyError, match="int4-g128"):
        quantize(torch.randn(4, 4), "int5-banana")
    with pytest.raises(ValueError, match="floating-point"):
        quantize(torch.ones(4, 4, dtype=torch.int32), "int8-absmax")
    with pytest.raises(ValueError, match="empty"):
        quantize(torch.zeros(0, 4), "int8-absmax")


def test_tiny_and_huge_values_keep_fp32_scales():
    """Scales fp16 cannot hold are stored in fp32 rather than flushed to 0 or inf."""
    for mag in (1e-9, 1e8):
        w = torch.linspace(-1, 1, 256).reshape(2, 128) * mag
        qt = quantize(w, "int8-channel")
        assert qt.scale.dtype == torch.float32
        torch.testing.assert_close(qt.dequantize(), w, rtol=0, atol=mag / 100)


def test_outlier_hurts_per_tensor_more_than_groups(gen):
    w = torch.randn(64, 512, generator=gen) * 0.02
    w[3, 7] = 5.0
    e_tensor = (quantize(w, "int8-absmax").dequantize() - w).norm()
    e_group = (quantize(w, "int8-g128").dequantize() - w).norm()
    assert e_group < 0.2 * e_tensor


# ---- fp8 and NF4 ----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["fp8-e4m3", "fp8-e5m2"])
def test_fp8_stored_in_torch_dtype_and_matches_software_rounding(fmt, gen):
    w = torch.randn(16, 100, generator=gen)
    qt = quantize(w, fmt + "-channel")
    assert qt.codes.dtype == formats.TORCH_DTYPES[fmt]
    scaled = w / qt.scale.float()
    assert torch.equal(qt.codes.double(), formats.round_to_format(scaled.double(), fmt))


def test_nf4_code_from_quantiles_matches_reference():
    torch.testing.assert_close(nf4_code(torch.float64), torch.tensor(NF4_REFERENCE, dtype=torch.float64),
                               rtol=0, atol=1e-6)


def test_nf4_encode_is_nearest_level(gen):
    x = torch.rand(1000, generator=gen) * 2 - 1
    brute = (x.unsqueeze(-1) - nf4_code()).abs().argmin(-1)
    assert torch.equal(nf4_encode(x).long(), brute)
    assert torch.equal(nf4_decode(torch.arange(16)), nf4_code())


def test_nf4_beats_int4_on_normal_weights(gen):
    w = torch.randn(128, 512, generator=gen)
    e_nf4 = (quantize(w, "nf4").dequantize() - w).norm()
    e_int4 = (quantize(w, "int4-g64-sym").dequantize() - w).norm()
    assert e_nf4 < e_int4


def test_quantized_tensor_is_frozen(gen):
    qt = quantize(torch.randn(4, 32, generator=gen), "int4-g128")
    assert isinstance(qt, QuantizedTensor) and qt.shape == (4, 32) and qt.numel() == 128
    with pytest.raises(Exception):
        qt.bits = 3


@pytest.mark.parametrize("scheme", ["int4-g128", "int4-g32-sym", "int8-channel", "int3-g64"])
def test_fake_quantize_equals_quantize_dequantize(scheme, gen):
    from llminfra.quant.rtn import fake_quantize_int
    s = parse_scheme(scheme)
    w = torch.randn(33, 150, generator=gen)
    assert torch.equal(fake_quantize_int(w, s.bits, s.granularity, s.symmetric),
                       quantize(w, scheme).dequantize())


def test_tiny_scales_stay_in_fp32():
    """A row whose absmax is 4.88e-5 has scale 3.8e-7, subnormal in fp16 (spacing 6e-8): stored
    in fp16 the code of that value would be clamped 9 steps away. Found by a random case."""
    w = torch.tensor([[-4.8791371227707714e-05], [0.03], [-0.01]])
    qt = quantize(w, "int8-channel")
    err = (qt.dequantize() - w).abs()
    assert bool((err <= qt.step_per_value() * 0.5001 + 1e-12).all())
    assert qt.scale.dtype == torch.float32


# ---- hardening (issue 13) -------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["int8-zeropoint", "int4-g128", "int3-g128"])
def test_zero_point_schemes_near_float32_limit(scheme):
    """max - min of [2e38, -2e38] overflows float32 (4e38 > 3.4e38): the scale used to become
    inf and the group NaN. The range is now taken in float64, the scale (4e38 / levels) fits,
    and every value decodes within half a step."""
    w = torch.tensor([[2e38, -2e38, 1.0, 3.0, -1e37, 5e37]])
    qt = quantize(w, scheme)
    dq = qt.dequantize()
    assert torch.isfinite(qt.scale).all() and torch.isfinite(dq).all()
    assert ((dq.double() - w.double()).abs() <= qt.step_per_value().double() * 0.5001).all()


def test_grid_that_would_decode_past_float32_is_refused():
    """[3.4e38, -3.4e38] with a zero point: s = 6.8e38 / 255, z = round(127.5) = 128, so the
    lowest code decodes to -128 · s = -3.41e38, beyond float32's -3.40e38: refused, not -inf."""
    with pytest.raises(ValueError, match="float32"):
        quantize(torch.tensor([[3.4e38, -3.4e38, 1.0]]), "int8-zeropoint")


@pytest.mark.parametrize("scheme", ["int8-absmax", "int8-zeropoint", "int4-g128", "fp8-e4m3",
                                    "nf4"])
def test_float64_beyond_float32_range_is_refused(scheme):
    """Quantization computes in float32; 1e300 is finite in float64 but inf in float32 (the
    finiteness check used to run before the cast, and the result was NaN / inf)."""
    w = torch.tensor([[1e300, 1.0, -2.0, 3.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="float32"):
        quantize(w, scheme)
    with pytest.raises(ValueError, match="float32"):
        absmax_quantize(w)
    ok = torch.tensor([[1e30, 1.0, -2.0, 3.0]], dtype=torch.float64)  # in range: still fine
    assert torch.isfinite(quantize(ok, scheme).dequantize()).all()


def test_fake_quantized_weights_are_the_quantized_layers_values():
    """fake_quantize_model stores exactly what QuantLinear holds, and leaves the head alone."""
    import copy

    from llminfra.model import load_tiny
    from llminfra.quant import fake_quantize_model, quantize_model
    model, _ = load_tiny()
    fake = fake_quantize_model(copy.deepcopy(model), "int4-g128")
    real = quantize_model(copy.deepcopy(model), "int4-g128")
    name = "layers.2.feed_forward.w2"
    torch.testing.assert_close(fake.get_submodule(name).weight,
                               real.get_submodule(name).qweight.dequantize(torch.float32),
                               rtol=0, atol=0)
    assert not torch.equal(fake.get_submodule(name).weight, model.get_submodule(name).weight)
    assert torch.equal(fake.output.weight, model.output.weight)
    with pytest.raises(KeyError, match="unknown quantization scheme 'int9-g7'"):
        fake_quantize_model(model, "int9-g7")
