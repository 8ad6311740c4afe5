"""Train the ``tiny`` model on the shipped corpus: ``python -m llminfra.model.train``.

Next-byte prediction with the cross-entropy loss, AdamW (Loshchilov & Hutter 2019,
arXiv:1711.05101; β = (0.9, 0.95), weight decay 0.1 on matrices only), a linear warm-up then a
cosine decay to 10 % of the peak learning rate over the wall-clock budget, gradient clipping at
norm 1. Batches are random windows of the training split drawn from a seeded
``torch.Generator``. Every ``--eval-every-s`` seconds the validation loss (nats per byte) on the
first 16 KiB of the held-out split is logged and the checkpoint saved; at the end the whole
held-out split is scored with the checkpoint as stored (bfloat16 weights, loaded back as
float32, exactly what :func:`llminfra.model.load_tiny` returns).

Writes into ``--out`` (default ``llminfra/data/``): ``tiny.pt``, ``tiny_loss_curve.json``,
``tiny_metrics.json``. The wall-clock schedule makes runs on different machines differ; the
metrics record the machine's thread count and the tokens processed.

Taught in chapter 01 (training vs inference).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import signal
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from llminfra.attention.reference import sdpa_attention
from llminfra.model.checkpoint import load_checkpoint, save_checkpoint
from llminfra.model.config import ModelConfig
from llminfra.model.corpus import DATA_DIR, corpus_tokens
from llminfra.model.generate import mean_nll
from llminfra.model.transformer import Transformer

log = logging.getLogger(__name__)
EVAL_TOKENS = 16384


def unigram_cross_entropy(train: torch.Tensor, heldout: torch.Tensor, vocab: int = 256) -> float:
    """Loss in nats/byte of the best context-free guess: -Σ q(x) log p(x), p the byte
    frequencies of ``train`` (add-one smoothed), q those of ``heldout``. The baseline a model
    that ignores context cannot beat."""
    p = (torch.bincount(train, minlength=vocab).double() + 1).div_(train.numel() + vocab)
    q = torch.bincount(heldout, minlength=vocab).double() / heldout.numel()
    return float(-(q * p.log()).sum())


def random_batch(tokens: torch.Tensor, batch_size: int, seq_len: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets, both ``(batch_size, seq_len)``, from random offsets."""
    starts = torch.randint(0, tokens.numel() - seq_len - 1, (batch_size,), generator=generator)
    rows = torch.stack([tokens[s:s + seq_len + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def learning_rate(step: int, progress: float, peak: float, warmup_steps: int) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine from ``peak`` to 0.1·peak as
    ``progress`` (fraction of the time budget spent) goes 0 -> 1."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW with weight decay 0.1 on 2-D weights, none on norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def train(args: argparse.Namespace) -> dict:
    """Run the training loop of the module docstring; returns the metrics dict."""
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    config = ModelConfig.from_name("tiny")
    model = Transformer(config, generator=g)
    model.set_attention(sdpa_attention)  # same result as the reference, faster to train
    train_tokens, val_tokens = corpus_tokens("train"), corpus_tokens("validation")
    opt = make_optimizer(model, args.lr)
    budget_s, out = args.minutes * 60, Path(args.out)
    curve, step, t0, next_eval, ema = [], 0, time.perf_counter(), 0.0, None
    stop = _stop_flag()
    while True:
        elapsed = time.perf_counter() - t0
        done = (elapsed >= budget_s or stop["requested"] or
                (args.max_steps is not None and step >= args.max_steps))
        if elapsed >= next_eval or done:
            curve.append(_evaluate(model, val_tokens, step, elapsed, ema, args))
            save_checkpoint(model, out / "tiny.pt", meta={"step": step, "seed": args.seed})
            next_eval = elapsed + args.eval_every_s
        if done:
            break
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, elapsed / budget_s, args.lr, args.warmup_steps)
        loss = _train_step(model, opt, *random_batch(train_tokens, args.batch_size,
                                                      args.seq_len, g))
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        step += 1
    signal.signal(signal.SIGTERM, stop["previous"])
    return _finish(out, curve, step, time.perf_counter() - t0, train_tokens, val_tokens, args)


def _stop_flag() -> dict:
    """A flag set by SIGTERM, so ``kill PID`` ends training early but still scores and writes
    the checkpoint, the curve and the metrics (the previous handler is kept to restore)."""
    flag = {"requested": False}

    def handler(signum, frame):
        log.info("signal %d: stopping after this step", signum)
        flag["requested"] = True

    flag["previous"] = signal.signal(signal.SIGTERM, handler)
    return flag


def _train_step(model, opt, x: torch.Tensor, y: torch.Tensor) -> float:
    logits = model(x)  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def _evaluate(model, val_tokens, step, elapsed, ema, args) -> dict:
    model.eval()
    val = mean_nll(model, val_tokens[:_eval_tokens(args)], seq_len=args.seq_len,
                   batch_size=max(8, 2048 // args.seq_len))
    model.train()
    point = {"step": step, "elapsed_s": round(elapsed, 1),
             "tokens_seen": step * args.batch_size * args.seq_len,
             "train_loss_ema": None if ema is None else round(ema, 4),
             "val_loss": round(val, 4)}
    log.info("step %d  %.0f s  train %s  val %.4f nats/byte", step, elapsed,
             point["train_loss_ema"], val)
    return point


def _eval_tokens(args) -> int:
    """Held-out bytes scored during training: 16 KiB, fewer if --score-tokens is smaller."""
    return min(EVAL_TOKENS, args.score_tokens or EVAL_TOKENS)


def _finish(out: Path, curve, steps, seconds, train_tokens, val_tokens, args) -> dict:
    """Score the stored checkpoint on the held-out split; write curve and metrics."""
    model, _ = load_checkpoint(out / "tiny.pt")
    val_tokens = val_tokens[:args.score_tokens] if args.score_tokens else val_tokens
    val = mean_nll(model, val_tokens, seq_len=args.seq_len,
                   batch_size=max(8, 2048 // args.seq_len))
    metrics = {
        "config": "tiny", "params": sum(p.numel() for p in model.parameters()),
        "checkpoint_dtype": "bfloat16", "seed": args.seed, "steps": steps,
        "train_seconds": round(seconds, 1), "threads": args.threads,
        "batch_size": args.batch_size, "seq_len": args.seq_len, "peak_lr": args.lr,
        "tokens_seen": steps * args.batch_size * args.seq_len,
        "heldout_bytes": int(val_tokens.numel()),
        "heldout_loss_nats_per_byte": round(val, 4),
        "heldout_perplexity": round(math.exp(val), 4),
        "unigram_loss_nats_per_byte": round(unigram_cross_entropy(train_tokens, val_tokens), 4),
        "uniform_loss_nats_per_byte": round(math.log(256), 4),
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
    }
    (out / "tiny_loss_curve.json").write_text(json.dumps(
        {"eval_tokens": _eval_tokens(args), "unit": "nats/byte", "points": curve}, indent=1) + "\n")
    (out / "tiny_metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    log.info("held-out loss %.4f nats/byte, perplexity %.3f", val, math.exp(val))
    return metrics


def main(argv: list[str] | None = None) -> None:
    """Command line of the module docstring."""
    p = argparse.ArgumentParser(description="Train the tiny model on the shipped corpus.")
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget")
    p.add_argument("--out", default=str(DATA_DIR), help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--eval-every-s", type=float, default=30.0)
    p.add_argument("--max-steps", type=int, default=None, help="stop early (for tests)")
    p.add_argument("--score-tokens", type=int, default=None,
                   help="score only this many held-out bytes at the end (default: all)")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.threads < 1 or args.seq_len > 256 or args.seq_len < 2:
        p.error("need --minutes > 0, --threads >= 1 and 2 <= --seq-len <= 256")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    train(args)


if __name__ == "__main__":
    main()
