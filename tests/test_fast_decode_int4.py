"""FastDecoder with every matrix in int4 (``linear=int4_linear(g)``): PyTorch's packed-int4 CPU
kernel gives the logits of the same int4 weights dequantized, within bf16 activation rounding."""

import pytest
import torch

from llminfra.model import ModelConfig
from llminfra.runner import FastDecoder
from llminfra.runner.fast_decode import _plain_linear
from llminfra.model.transformer import Transformer
from llminfra.quant import cpu_kernels, int4_linear, quantize

pytestmark = pytest.mark.skipif(not cpu_kernels.kernels_available(),
                                reason="this PyTorch has no int4 CPU kernel")


#: a SmolLM2-shaped model in miniature (GQA, a qkv bias, tied embeddings): every matrix fits
#: the kernel (rows a multiple of 16, inputs of 64). The tiny model's 688-wide FFN does not.
CONFIG = ModelConfig(vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=384,
                     max_seq_len=64, tie_embeddings=True, qkv_bias=True)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(CONFIG).eval()


def _dequantized(group: int):
    """The reference ``linear``: the same int4 rounding, dequantized, fp32 activations."""
    return lambda w: _plain_linear(quantize(w.float(), f"int4-g{group}").dequantize())


@pytest.mark.parametrize("group", [32, 64])
def test_int4_kernel_equals_the_dequantized_weights(model, one_thread, group):
    prompt = torch.randint(0, CONFIG.vocab_size, (12,), generator=torch.Generator().manual_seed(1))
    prompt = prompt.tolist()
    fast = FastDecoder(model, max_len=64, linear=int4_linear(group))
    ref = FastDecoder(model, max_len=64, linear=_dequantized(group))
    fp32 = FastDecoder(model, max_len=64)
    with torch.no_grad():
        got, want, full = (d.forward(torch.tensor(prompt), 0) for d in (fast, ref, fp32))
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=3e-2 * scale)
    assert int(got.argmax()) == int(want.argmax())
    # and it is a different model from fp32: int4 moves the logits by more than bf16 does
    assert float((want - full).abs().max()) > float((got - want).abs().max()) / 10
    tokens = fast.generate(prompt, 6)
    assert len(tokens) == 6 and all(0 <= t < model.config.vocab_size for t in tokens)


def test_int4_bytes_read_are_about_an_eighth(model):
    """Packed codes (half a byte) and a bf16 scale and offset per group of 32: 0.625 bytes a
    weight against fp32's 4, norms and biases aside."""
    ratio = (FastDecoder(model, linear=int4_linear(32)).weight_bytes_read()
             / FastDecoder(model).weight_bytes_read())
    assert 0.625 / 4 * 0.95 < ratio < 0.625 / 4 * 1.1


def test_bad_groups_and_shapes_are_named():
    with pytest.raises(ValueError, match="group must be one of"):
        int4_linear(48)
    with pytest.raises(ValueError, match=r"\(10, 64\) weight does not fit"):
        int4_linear(32)(torch.randn(10, 64))
