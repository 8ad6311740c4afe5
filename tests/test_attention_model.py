"""The tiny model runs with every attention version plugged in (``model.set_attention``).

Random weights (a seeded generator), so the test does not depend on the trained checkpoint:
prefill logits and a cached decode step (T = 1 query against S keys, the last position) must
equal the model's own reference attention. The Triton kernel runs under the interpreter in a
subprocess (TRITON_INTERPRET must be set before triton is imported).
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

model_mod = pytest.importorskip("llminfra.model")
from llminfra.attention import flash_attention, naive_attention  # noqa: E402


def _tiny(seed: int):
    return model_mod.Transformer(model_mod.ModelConfig.from_name("tiny"),
                                 generator=torch.Generator().manual_seed(seed)).eval()


def _prefill_and_decode(model, tokens):
    cache = model_mod.DenseKVCache(model.config.n_layers)
    with torch.no_grad():
        prefill = model(tokens[:, :-1], cache=cache)
        step = model(tokens[:, -1:], cache=cache, start_pos=tokens.shape[1] - 1)
    return prefill, step


@pytest.mark.parametrize("fn", [naive_attention, flash_attention,
                                lambda q, k, v, causal: flash_attention(q, k, v, causal,
                                                                        block_q=8, block_k=16)])
def test_model_with_plugged_attention(gen, fn):
    model = _tiny(int(torch.randint(0, 2**31, (1,), generator=gen)))
    tokens = torch.randint(0, 256, (2, 41), generator=gen)
    want = _prefill_and_decode(model, tokens)
    model.set_attention(fn)
    got = _prefill_and_decode(model, tokens)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_model_with_triton_kernel_under_interpreter():
    pytest.importorskip("triton")
    code = textwrap.dedent("""
        import torch
        from llminfra.attention import flash_attention_triton
        from llminfra.model import DenseKVCache, ModelConfig, Transformer
        model = Transformer(ModelConfig.from_name("tiny"),
                            generator=torch.Generator().manual_seed(3)).eval()
        tokens = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(4))
        def run():
            cache = DenseKVCache(model.config.n_layers)
            with torch.no_grad():
                return (model(tokens[:, :-1], cache=cache),
                        model(tokens[:, -1:], cache=cache, start_pos=19))
        want = run()
        model.set_attention(lambda q, k, v, causal: flash_attention_triton(
            q, k, v, causal, block_m=16, block_n=16))
        got = run()
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        print("OK")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
