"""The Triton kernel under Triton's CPU interpreter, against naive attention in float64.

``TRITON_INTERPRET=1`` must be in the environment before triton is imported, and the package never
sets it, so these tests run the kernel in a fresh subprocess with the variable set. Small shapes:
the whole file takes a few seconds. On a CUDA machine the GPU test runs the compiled kernel.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton")

CASES = [  # B, H, H_kv, T, S, d, causal, dtype
    (1, 2, 2, 37, 37, 16, False, "float32"),
    (1, 2, 2, 37, 37, 16, True, "float32"),
    (2, 4, 2, 20, 45, 32, True, "float32"),    # GQA, T < S (queries are the last T)
    (1, 3, 1, 33, 17, 64, False, "float32"),   # MQA, T > S non-causal
    (1, 2, 1, 24, 10, 32, True, "float32"),    # T > S causal: first 14 rows see no key
    (1, 2, 2, 30, 30, 80, True, "float32"),    # d not a power of two
    (1, 2, 1, 18, 40, 64, True, "float16"),
    (1, 2, 2, 18, 18, 32, False, "bfloat16"),
    (1, 4, 1, 1, 37, 32, True, "float32"),     # one decode query against 37 cached keys
    (1, 1, 1, 1, 1, 16, True, "float32"),
]

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from llminfra.attention import flash_attention_triton, naive_attention
    g = torch.Generator(); g.seed()
    errors = []
    for B, H, H_kv, T, S, d, causal, dt in json.loads(sys.argv[1]):
        dtype = getattr(torch, dt)
        q = torch.randn(B, H, T, d, generator=g).to(dtype)
        k = torch.randn(B, H_kv, S, d, generator=g).to(dtype)
        v = torch.randn(B, H_kv, S, d, generator=g).to(dtype)
        out = flash_attention_triton(q, k, v, causal, block_m=16, block_n=16)
        ref = naive_attention(q.double(), k.double(), v.double(), causal)
        assert out.dtype == dtype and out.shape == q.shape
        errors.append(float((out.double() - ref).abs().max()))
    print(json.dumps(errors))
""")


def run_interpreted(code: str, *args: str, interpret: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.mark.slow
def test_kernel_matches_naive_under_interpreter():
    proc = run_interpreted(SCRIPT, json.dumps(CASES))
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}
    for case, err in zip(CASES, errors):
        assert err < tol[case[-1]], f"case {case}: max abs error {err}"


def test_cpu_without_interpreter_says_how():
    code = ("import torch\nfrom llminfra.attention import flash_attention_triton\n"
            "x = torch.zeros(1, 1, 16, 16)\n"
            "try:\n    flash_attention_triton(x, x, x)\n"
            "except RuntimeError as e:\n    print('RAISED', e)\n")
    proc = run_interpreted(code, interpret=False)
    assert "RAISED" in proc.stdout and "TRITON_INTERPRET=1" in proc.stdout, proc.stderr[-2000:]


def test_package_imports_without_triton():
    code = ("import sys\nsys.modules['triton'] = None\n"
            "import torch, llminfra.attention as A\nx = torch.zeros(1, 1, 4, 8)\n"
            "assert A.flash_attention(x, x, x).shape == x.shape\n"
            "try:\n    A.flash_attention_triton(x, x, x)\n"
            "except ImportError as e:\n    print('IMPORTERROR', e)\n")
    proc = run_interpreted(code, interpret=False)
    assert "IMPORTERROR" in proc.stdout and "triton" in proc.stdout, proc.stderr[-2000:]


def test_bad_inputs_rejected_before_launch():
    from llminfra.attention import flash_attention_triton
    x = torch.zeros(1, 1, 16, 16)
    with pytest.raises(ValueError, match="dtype"):
        flash_attention_triton(x.double(), x.double(), x.double())
    with pytest.raises(ValueError, match="power of two"):
        flash_attention_triton(x, x, x, block_m=24)
    with pytest.raises(ValueError, match="multiple"):
        flash_attention_triton(torch.zeros(1, 3, 16, 16), torch.zeros(1, 2, 16, 16),
                               torch.zeros(1, 2, 16, 16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (not counted as a pass)")
def test_kernel_on_gpu():
    from llminfra.attention import flash_attention_triton, naive_attention
    g = torch.Generator(device="cuda")
    g.seed()
    for causal in (False, True):
        q = torch.randn(2, 8, 300, 128, device="cuda", generator=g, dtype=torch.bfloat16)
        k, v = (torch.randn(2, 2, 333, 128, device="cuda", generator=g, dtype=torch.bfloat16)
                for _ in range(2))
        ref = naive_attention(q.double(), k.double(), v.double(), causal)
        out = flash_attention_triton(q, k, v, causal)
        assert (out.double() - ref).abs().max() < 3e-2
