"""Batch-1 decode of SmolLM2-135M for ``python -m llminfra bench real``: the readable model and
:class:`~llminfra.runner.FastDecoder` on each matmul kernel and in int4 on each int4 kernel, timed
against the weight-read floor, and how far each int4 kernel's greedy answers follow the int4
weights with fp32 activations and the fp32 model. :mod:`llminfra.bench.real` (its module
docstring) says what each path is; ``make compare-engines`` times the same paths beside
llama.cpp. Chapter 08."""

from __future__ import annotations

import time

from llminfra.model import DenseKVCache, generate
from llminfra.runner import FastDecoder, prepacked as onednn
from llminfra.quant import int4_linear, quantize
from llminfra.kernels import w4a8
from llminfra.runner.kernel_set import skinny_kernels
from llminfra.runner.fast_decode import _plain_linear

#: batch-1 decode paths: the default kernel's, the plain kernel's, the package's fp32 kernel for
#: few rows (``fast_skinny``: ``serve``'s default at one or two rows, where the C kernels build),
#: int4 on the default int4 kernel and on PyTorch's
DECODE_PATHS = ("eager", "eager_plain", "fast", "fast_plain", "fast_skinny", "fast_int4",
                "fast_int4_2pass", "fast_int4_torch")
DECODE_PROMPT_LEN = 64
#: extra timing rounds of a decode path whose n + 1 tokens timed no slower than 1 (noise)
RETIMES = 5
#: int4 group of the ``fast_int4`` decode path (SmolLM2's 576-wide inputs take 32 or 64, not 128;
#: 32 is the shipped Q4_1 weights' own group, and PyTorch's kernel runs it faster than 64)
FAST_INT4_GROUP = 32


def int4_decoders(model, max_len: int) -> dict[str, FastDecoder]:
    """FastDecoders with every matrix in int4 (groups of :data:`FAST_INT4_GROUP`, the same
    codes), keyed by decode path: ``fast_int4`` on :func:`int4_kernel`'s kernel; where that is
    w4a8, also ``fast_int4_2pass`` (w4a8 with its activations' rounding error multiplied too:
    about 15-bit activations) and ``fast_int4_torch`` (PyTorch's packed-int4 kernel, bf16
    activations)."""
    torch_int4 = FastDecoder(model, max_len=max_len, linear=int4_linear(FAST_INT4_GROUP))
    if int4_kernel() != "w4a8":
        return {"fast_int4": torch_int4}
    return {"fast_int4": FastDecoder(model, max_len=max_len, linear=w4a8.w4a8_linear()),
            "fast_int4_2pass": FastDecoder(model, max_len=max_len,
                                           linear=w4a8.w4a8_linear(passes=2)),
            "fast_int4_torch": torch_int4}


def decode_s_per_token(model, prompt: list[int], n: int, repeats: int,
                       int4: dict[str, FastDecoder] | None = None
                       ) -> tuple[dict[str, float], int]:
    """Batch-1 decode seconds per token, keyed as :data:`DECODE_PATHS`: ``eager``
    (:func:`generate` with a DenseKVCache), ``fast`` (:class:`llminfra.runner.FastDecoder`), both
    on :func:`matmul_kernel`'s kernel, ``eager_plain`` / ``fast_plain`` on ``F.linear`` (left out
    where that is the default already), ``fast_skinny`` on :mod:`llminfra.kernels.f32_skinny`
    (where the C kernels build), and the int4 paths of :func:`int4_decoders` (``int4``:
    built already, with room for the prompt and n + 1 tokens): (best time of n + 1 tokens − best
    time of 1 token) / n, all timed in turn. Also the bytes of weights ``fast_int4`` reads a
    token (the int4 floor's numerator)."""
    size = len(prompt) + n + 1
    dnn = matmul_kernel() == "onednn"
    int4 = int4_decoders(model, size) if int4 is None else int4
    fast_plain = FastDecoder(model, max_len=size)
    eager_plain = lambda k: generate(model, prompt, k, cache=DenseKVCache(model.config.n_layers))
    paths = {"eager": eager_plain, "fast": lambda k: fast_plain.generate(prompt, k)}
    if dnn:
        packed = onednn.prepacked(model)
        fast = FastDecoder(model, max_len=size, linear=onednn.onednn_linear)
        paths = {"eager": lambda k: generate(packed, prompt, k,
                                             cache=DenseKVCache(model.config.n_layers)),
                 "eager_plain": eager_plain, "fast": lambda k: fast.generate(prompt, k),
                 "fast_plain": paths["fast"]}
    if w4a8.available():
        skinny = FastDecoder(model, max_len=size, kernels=skinny_kernels())
        paths["fast_skinny"] = lambda k: skinny.generate(prompt, k)
    for name, decoder in int4.items():
        paths[name] = lambda k, d=decoder: d.generate(prompt, k)
    best = {(p, k): float("inf") for p in paths for k in (1, n + 1)}
    for r in range(repeats + 1):                                   # round 0 warms up
        for p, k in best:
            t0 = time.perf_counter()
            paths[p](k)
            if r:
                best[p, k] = min(best[p, k], time.perf_counter() - t0)
    # n more tokens cannot take less time than none: where a stall of the machine made every
    # timed 1-token run slower than the best (n + 1)-token run (a tiny n, few repeats, a busy
    # machine), both are timed again, up to RETIMES more rounds
    for _ in range(RETIMES):
        noisy = [p for p in paths if best[p, n + 1] <= best[p, 1]]
        if not noisy:
            break
        for p in noisy:
            for k in (1, n + 1):
                t0 = time.perf_counter()
                paths[p](k)
                best[p, k] = min(best[p, k], time.perf_counter() - t0)
    return ({p: (best[p, n + 1] - best[p, 1]) / n for p in paths},
            int4["fast_int4"].weight_bytes_read())


#: chat turns whose greedy answers the int4 paths are compared on (English, code, Korean, facts)
AGREEMENT_PROMPTS = ("The history of the Roman Empire begins with", "def fibonacci(n):",
                     "서울은 한국의 수도이며", "Explain what a KV cache is in one sentence.",
                     "The capital of France is", "import numpy as np\n", "Once upon a time",
                     "Water boils at")


def int4_greedy_identical(model, tok, int4: dict[str, FastDecoder], n: int,
                          prompts: tuple[str, ...] = AGREEMENT_PROMPTS) -> dict:
    """For each int4 path, on how many of ``prompts`` (as chat turns; all of
    :data:`AGREEMENT_PROMPTS` unless the tests ask for fewer) its first ``n`` greedy tokens are
    identical to two references: the same int4 weights with fp32 activations (``F.linear`` on
    the dequantized codes: what the kernel alone changes) and the fp32 weights (what int4
    changes)."""
    size = max(d.max_len for d in int4.values())
    refs = {"int4_weights_fp32_activations": FastDecoder(model, max_len=size, linear=lambda w:
                _plain_linear(quantize(w.float(), f"int4-g{FAST_INT4_GROUP}").dequantize())),
            "fp32_weights": FastDecoder(model, max_len=size)}
    out = {"prompts": len(prompts), "tokens": n, **{k: {} for k in refs}}
    for text in prompts:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}],
                                                 add_generation_prompt=True))[-(size - n):]
        want = {k: r.generate(ids, n) for k, r in refs.items()}
        for path, decoder in int4.items():
            got = decoder.generate(ids, n)
            for k in refs:
                out[k][path] = out[k].get(path, 0) + int(got == want[k])
    return out


def int4_kernel() -> str:
    """The kernel of the ``fast_int4`` row: ``"w4a8"`` (:mod:`llminfra.kernels.w4a8`: int8
    activations, integer dot products, built on first use) where it can be built here, else
    ``"torch"`` (PyTorch's packed-int4 kernel, bf16 activations)."""
    return "w4a8" if w4a8.available() else "torch"


def matmul_kernel() -> str:
    """The kernel of the ``eager`` and ``fast`` decode rows: ``"onednn"`` (prepacked weights:
    ``llminfra serve --matmul onednn``, what ``--matmul auto`` gives the real model where the C
    kernels do not build; ``fast_skinny`` is the C kernels' row) where this PyTorch has it,
    else ``"plain"``. The ``engine`` row runs what ``serve`` runs
    (:func:`llminfra.bench.real.engine_sides`)."""
    return "onednn" if onednn.available() else "plain"
