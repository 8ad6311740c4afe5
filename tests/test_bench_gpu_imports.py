"""``bench gpu`` on a bare GPU machine: every GPU suite imports with none of the course-only
packages, a suite that cannot import is a failure in the result (never dropped), and the
pieces of the new suites that run without a GPU are right."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llminfra.bench import SUITES
from llminfra.bench import gpu as bench_gpu

#: what a GPU machine with torch, Triton, numpy, pandas, matplotlib and transformers lacks
COURSE_ONLY = ("fastapi", "uvicorn", "openai", "ipywidgets", "gguf", "llguidance")

BLOCKER = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {COURSE_ONLY!r}:
            raise ModuleNotFoundError(f"blocked for the test: {{name}}", name=name)
sys.meta_path.insert(0, Block())
"""


def run_blocked(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                               "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


def test_every_gpu_suite_imports_without_the_course_only_packages(tmp_path):
    done = run_blocked("""
import json
from llminfra.bench.gpu import gpu_suites
found = gpu_suites()
print(json.dumps({k: (None if callable(v) else repr(v)) for k, v in found.items()}))
""", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(found) == set(bench_gpu.GPU_SUITES)
    assert all(err is None for err in found.values()), found


def test_bench_gpu_from_the_command_line_says_there_is_no_gpu(tmp_path):
    """Without CUDA the command ends with a clear message, not an import error."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: `bench gpu` would run (checked by bench gpu itself)")
    done = run_blocked("""
from llminfra.cli import main
raise SystemExit(main(["bench", "gpu", "--json", "out.json"]))
""", tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode != 0 and "no CUDA device" in text, text[-2000:]
    assert "ModuleNotFoundError" not in text


def test_every_suite_with_a_cuda_part_is_run_by_bench_gpu():
    root = Path(__file__).resolve().parents[1]
    with_gpu = {name for name, module in SUITES.items()
                if re.search(r"^def run_gpu\(", (root / (module.replace(".", "/") + ".py"))
                             .read_text(), re.M)}
    assert with_gpu == set(bench_gpu.GPU_SUITES)


def test_a_suite_that_cannot_import_is_a_failure(monkeypatch):
    monkeypatch.setitem(bench_gpu.SUITES, "memory", "llminfra.bench.no_such_module")
    found = bench_gpu.gpu_suites()
    assert isinstance(found["memory"], ModuleNotFoundError)
    assert callable(found["engine"])
    if not torch.cuda.is_available():
        with pytest.raises(bench_gpu.NoGPUError, match="no CUDA device"):
            bench_gpu.run()


def test_memory_suite_builds_the_llama_3_8b_shape():
    from llminfra.bench.memory import MODEL, config_of
    from llminfra.calc.params import param_count
    from llminfra.specs import get_model
    config = config_of(MODEL)
    assert param_count(config.to_spec(MODEL)) == param_count(get_model(MODEL))
    with torch.device("meta"):
        from llminfra.model import Transformer
        model = Transformer(config)
    assert sum(p.numel() for p in model.parameters()) == param_count(get_model(MODEL))


def test_tile_autotune_keeps_the_fastest_and_reports_failures():
    from llminfra.attention.flash_tuning import tune_tiles
    cost = {(128, 64, 4, 2): 3.0, (64, 64, 4, 3): 1.0, (64, 32, 4, 2): 2.0}

    def run(tile):
        if tile == (128, 128, 8, 3):
            raise RuntimeError("out of shared memory")
        return tile

    out = tune_tiles(run, candidates=[*cost, (128, 128, 8, 3)],
                     time_s=lambda fn: cost[fn()])
    assert out["best"] == (64, 64, 4, 3)
    assert set(out["times_s"]) == set(cost)
    assert "out of shared memory" in out["errors"][(128, 128, 8, 3)]


def test_hf_llama_holds_the_same_weights():
    """The engine suite's transformers model computes our logits (rotate-half rows undone)."""
    pytest.importorskip("transformers")
    from llminfra.bench.engine import hf_llama
    from llminfra.model import ModelConfig, Transformer
    config = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         ffn_dim=96, max_seq_len=64)
    model = Transformer(config, torch.Generator().manual_seed(3)).eval()
    hf = hf_llama(model)
    x = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), rtol=1e-4, atol=1e-4)
