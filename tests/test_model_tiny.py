"""Tests of the shipped artefacts: corpus, checkpoint, load_tiny, metrics; training pieces."""

import gzip
import json
import math
import time
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from llminfra.model import (TINY_CHECKPOINT, DenseKVCache, ModelConfig,
                            Transformer, generate, heldout_tokens, load_checkpoint, load_tiny,
                            mean_nll, save_checkpoint)
from llminfra.model.corpus import (DATA_DIR, build_corpus, corpus_path, corpus_tokens,
                                   load_text, write_corpus)
from llminfra.model.train import learning_rate, random_batch, unigram_cross_entropy

SMALL = ModelConfig(vocab_size=37, dim=24, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=40,
                    max_seq_len=64)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def metrics():
    return json.loads((DATA_DIR / "tiny_metrics.json").read_text())


# ---------------------------------------------------------------- shipped corpus

def test_corpus_size_licence_and_split():
    train, val = load_text("train"), load_text("validation")
    assert len(train.encode()) + len(val.encode()) <= 3_000_000
    assert len(val.encode()) >= 50_000
    assert (DATA_DIR / "LICENSE-PSF.txt").read_text().count("PYTHON SOFTWARE FOUNDATION") >= 1
    assert "PSF" in (DATA_DIR / "README.md").read_text()
    modules = [{line for line in text.splitlines() if line.startswith("module ")}
               for text in (train, val)]
    assert modules[1] and not modules[0] & modules[1]  # whole modules held out


def test_heldout_tokens_are_the_validation_bytes():
    tokens = heldout_tokens(1000)
    assert tokens.dtype == torch.int64 and tokens.shape == (1000,)
    assert bytes(tokens.tolist()) == load_text("validation").encode()[:1000]
    assert corpus_tokens("validation").numel() == len(load_text("validation").encode())
    with pytest.raises(ValueError, match="max_tokens"):
        heldout_tokens(1)
    with pytest.raises(ValueError, match="split"):
        corpus_path("test")


def test_corpus_recipe_is_deterministic(tmp_path):
    """Two fake stdlib modules: docstrings in source order, headers, duplicates dropped, and
    byte-identical gzip files from two builds."""
    lib = tmp_path / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "pkg" / "__init__.py").write_text('"""Package doc."""\n')
    (lib / "alpha.py").write_text('"""Alpha module."""\n\nclass A:\n    """An A."""\n'
                                  '    def f(self, x=1):\n        """Do f."""\n\n'
                                  'def g():\n    """Package doc."""\n')
    (lib / "test").mkdir()
    (lib / "test" / "t.py").write_text('"""Skipped."""\n')
    texts = build_corpus(lib)
    both = texts["train"] + texts["validation"]
    assert "module alpha\n\nAlpha module." in both and "class alpha.A\n\nAn A." in both
    assert "def alpha.A.f(self, x=1)\n\nDo f." in both
    assert both.count("Package doc.") == 1 and "Skipped" not in both
    a = [p.read_bytes() for p in write_corpus(texts, tmp_path)]
    b = [p.read_bytes() for p in write_corpus(build_corpus(lib), tmp_path)]
    assert a == b and gzip.decompress(a[0]).decode() == texts["train"]
    with pytest.raises(ValueError, match="not a directory"):
        build_corpus(tmp_path / "nowhere")


STDLIB_3_11_7 = Path("/root/.pyenv/versions/3.11.7/lib/python3.11")


@pytest.mark.slow
@pytest.mark.skipif(not STDLIB_3_11_7.is_dir(), reason="needs the CPython 3.11.7 standard "
                    "library the shipped corpus was built from")
def test_shipped_corpus_equals_a_rebuild():
    texts = build_corpus(STDLIB_3_11_7)
    assert texts["train"] == load_text("train")
    assert texts["validation"] == load_text("validation")


# ---------------------------------------------------------------- checkpoint and load_tiny

def test_checkpoint_round_trip(tmp_path, gen):
    model = Transformer(SMALL, generator=gen)
    exact, _ = load_checkpoint(save_checkpoint(model, tmp_path / "a.pt", dtype="float32"))
    half, meta = load_checkpoint(save_checkpoint(model, tmp_path / "b.pt", meta={"k": 1}))
    for (name, p), q, r in zip(model.named_parameters(), exact.parameters(), half.parameters()):
        assert torch.equal(p, q), name
        assert r.dtype == torch.float32
        assert_close(r, p, rtol=2**-8, atol=0), name  # bfloat16: 8 mantissa bits
    assert meta == {"k": 1} and not half.training
    with pytest.raises(ValueError, match="dtype"):
        save_checkpoint(model, tmp_path / "c.pt", dtype="int8")
    with pytest.raises(FileNotFoundError, match="train"):
        load_checkpoint(tmp_path / "missing.pt")


def test_load_tiny_is_fast_and_ready():
    start = time.perf_counter()
    model, tok = load_tiny()
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"load_tiny took {elapsed:.2f} s"
    assert model.config == ModelConfig.from_name("tiny") and not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert tok.vocab_size == model.config.vocab_size
    assert TINY_CHECKPOINT.stat().st_size < 8e6


def test_shipped_metrics_are_far_below_the_unigram_baseline(metrics):
    assert metrics["params"] == 3_033_344
    assert metrics["heldout_bytes"] == corpus_tokens("validation").numel()
    assert metrics["heldout_loss_nats_per_byte"] < 2.5
    assert metrics["heldout_loss_nats_per_byte"] < metrics["unigram_loss_nats_per_byte"] - 0.7
    assert metrics["heldout_perplexity"] == pytest.approx(
        math.exp(metrics["heldout_loss_nats_per_byte"]), rel=1e-3)
    curve = json.loads((DATA_DIR / "tiny_loss_curve.json").read_text())["points"]
    assert curve[0]["val_loss"] > 5.0 and curve[-1]["val_loss"] < 2.6


def test_load_tiny_perplexity_on_heldout_text(tiny, metrics):
    """The first 4 KiB of the held-out split: far below the unigram baseline (~3.3 nats/byte)
    and near the recorded full-split loss."""
    model, _ = tiny
    loss = mean_nll(model, heldout_tokens(4096))
    assert loss < 2.6
    assert abs(loss - metrics["heldout_loss_nats_per_byte"]) < 0.4


def test_tiny_generates_python_like_text_with_and_without_cache(tiny):
    model, tok = tiny
    prompt = tok.encode("def ")
    plain = generate(model, prompt, 24)
    assert generate(model, prompt, 24, cache=DenseKVCache(model.config.n_layers)) == plain
    text = tok.decode(plain)
    letters = sum(c.isalpha() or c in " _.(),\n" for c in text)
    assert letters >= 0.8 * len(text), text  # trained text, not byte noise


# ---------------------------------------------------------------- training pieces

def test_unigram_cross_entropy_worked_example():
    """Train bytes {0: 3, 1: 1} with add-one smoothing over 2 symbols: p = (4/6, 2/6); held-out
    all zeros: loss = -ln(4/6) = 0.4055 nats."""
    loss = unigram_cross_entropy(torch.tensor([0, 0, 0, 1]), torch.tensor([0, 0]), vocab=2)
    assert loss == pytest.approx(-math.log(4 / 6))


def test_learning_rate_schedule():
    assert learning_rate(0, 0.0, 1.0, 10) == pytest.approx(0.1)
    assert learning_rate(10, 0.0, 1.0, 10) == pytest.approx(1.0)
    assert learning_rate(500, 0.5, 1.0, 10) == pytest.approx(0.55)
    assert learning_rate(900, 1.0, 1.0, 10) == pytest.approx(0.1)


def test_random_batch_targets_are_next_bytes(gen):
    tokens = torch.arange(1000)
    x, y = random_batch(tokens, 5, 17, gen)
    assert x.shape == y.shape == (5, 17)
    assert torch.equal(y, x + 1) and int(y.max()) < 1000


@pytest.mark.slow
def test_train_command_writes_checkpoint_curve_and_metrics(tmp_path):
    """Two steps of the real command on short windows: files written, loss falls from ~ln 256."""
    from llminfra.model.train import main
    main(["--minutes", "5", "--max-steps", "2", "--out", str(tmp_path), "--batch-size", "2",
          "--seq-len", "32", "--threads", "1", "--score-tokens", "2048"])
    metrics = json.loads((tmp_path / "tiny_metrics.json").read_text())
    curve = json.loads((tmp_path / "tiny_loss_curve.json").read_text())["points"]
    assert metrics["steps"] == 2 and metrics["tokens_seen"] == 2 * 2 * 32
    assert metrics["heldout_bytes"] == 2048
    assert metrics["heldout_loss_nats_per_byte"] < math.log(256)
    assert curve[0]["step"] == 0 and curve[-1]["step"] == 2
    model, meta = load_checkpoint(tmp_path / "tiny.pt")
    assert meta["step"] == 2 and model.config == ModelConfig.from_name("tiny")
