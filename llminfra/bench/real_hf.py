"""The Hugging Face ``transformers`` side of ``bench real`` (:mod:`llminfra.bench.real`): its
own GGUF loader, ``generate`` on static batches and its continuous-batching manager, each
returning the same record as the engine's run (:func:`side`). ``transformers`` is a test extra:
the package never imports it; :func:`import_transformers` says how to install it."""

from __future__ import annotations

import contextlib
import io
import logging
import time
from pathlib import Path
from types import MappingProxyType

import torch

from llminfra.engine import default_num_blocks

#: the engine's limits, which hf_continuous gets too (the KV pool: :func:`hf_kv_blocks`)
ENGINE = MappingProxyType(dict(block_size=16, max_num_seqs=16, max_num_batched_tokens=512))

def import_transformers():
    """transformers, or ``ImportError`` saying how to install it (a test extra only)."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError("bench real compares with Hugging Face transformers, which is a test "
                          "extra: pip install transformers accelerate (or: make test)") from e
    return transformers


def load_hf_model(transformers, path: Path):
    """transformers' own GGUF loader on ``path`` (fp32, eval), its logging and progress bars
    quiet meanwhile."""
    log, bar = transformers.logging, transformers.utils.logging
    verbosity, bar_on = log.get_verbosity(), bar.is_progress_bar_enabled()
    log.set_verbosity_error()
    bar.disable_progress_bar()
    try:   # its GGUF reader draws a tqdm bar on stderr whatever the settings
        with contextlib.redirect_stderr(io.StringIO()):
            return transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    finally:
        log.set_verbosity(verbosity)
        if bar_on:
            bar.enable_progress_bar()


def run_record(tokens: list[list[int]], ttft_s: list[float], finish_s: list[float]) -> dict:
    """One run's tokens, TTFTs and throughput (output tokens / last finish, all from t = 0)."""
    return {"tokens": tokens, "ttft_s": ttft_s,
            "throughput_tokens_per_s": sum(map(len, tokens)) / max(finish_s)}


class FirstTokenClock:
    """A transformers streamer keeping the time of ``generate``'s first new token
    (``generate`` calls ``put`` once with the prompt, then once per step)."""

    def __init__(self):
        self.calls, self.first_token_time = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_token_time = time.perf_counter()

    def end(self) -> None:
        pass


@torch.no_grad()
def run_hf_static(hf, work, prompts, batch: int, pad_id: int) -> dict:
    """transformers ``generate`` on left-padded batches of ``batch`` requests in turn."""
    t0 = time.perf_counter()
    tokens, ttft, finish = [], [], []
    for s in range(0, len(work), batch):
        chunk, lens = prompts[s:s + batch], [r.output_len for r in work[s:s + batch]]
        L, n = max(map(len, chunk)), max(lens)
        x = torch.tensor([[pad_id] * (L - len(p)) + p for p in chunk])          # (B, L)
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in chunk])
        clock = FirstTokenClock()
        out = hf.generate(x, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                          eos_token_id=None, pad_token_id=pad_id, do_sample=False,
                          streamer=clock)                                     # (B, L + n)
        end = time.perf_counter()
        tokens += [out[j, L:L + o].tolist() for j, o in enumerate(lens)]
        ttft += [clock.first_token_time - t0] * len(chunk)
        finish += [end - t0] * len(chunk)
    return run_record(tokens, ttft, finish)


def hf_kv_blocks(config, page_size: int = 256) -> int:
    """transformers' cache blocks (``page_size`` tokens, its default page) for the K/V tokens of
    the engine's default pool on ``config`` (:func:`~llminfra.engine.default_num_blocks`).
    Left to itself, transformers sizes the pool on a CPU at 90 % of the machine's RAM."""
    B = ENGINE["block_size"]
    tokens = B * default_num_blocks(config, B, ENGINE["max_num_seqs"], torch.float32)
    return -(-tokens // page_size)


def run_hf_continuous(transformers, hf, work, prompts, pad_id: int, kv_blocks: int) -> dict:
    """transformers' continuous batching manager with the engine's limits and ``kv_blocks``
    cache blocks; ``RuntimeError`` if a request fails."""
    gen_config = transformers.GenerationConfig(do_sample=False, eos_token_id=None,
                                               pad_token_id=pad_id)
    cb_config = transformers.ContinuousBatchingConfig(
        max_requests_per_batch=ENGINE["max_num_seqs"],
        max_batch_tokens=ENGINE["max_num_batched_tokens"], num_blocks=kv_blocks)
    cb_log = logging.getLogger("ContinuousBatchingLogger")   # warns that EOS is disabled
    level = cb_log.level
    cb_log.setLevel(logging.ERROR)
    try:
        with hf.continuous_batching_context_manager(
                generation_config=gen_config, continuous_batching_config=cb_config,
                block=True, timeout=30, warmup=False) as manager:
            t0 = time.perf_counter()
            for i, (p, r) in enumerate(zip(prompts, work)):
                manager.add_request(p, request_id=f"r{i}", max_new_tokens=r.output_len,
                                    record_timestamps=True)
            results = {}
            while len(results) < len(work):
                out = manager.get_result(timeout=60)
                if out is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped")
                if out is not None and out.is_finished():
                    results[out.request_id] = out
    finally:
        cb_log.setLevel(level)
    outs = [results[f"r{i}"] for i in range(len(work))]
    failed = [o.error for o in outs if o.error is not None]
    if failed:
        raise RuntimeError(f"transformers' continuous batching failed: {failed[0]}")
    return run_record([list(o.generated_tokens) for o in outs],
                      [o.timestamps[0] - t0 for o in outs], [o.timestamps[-1] - t0 for o in outs])

