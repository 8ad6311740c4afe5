"""The command line as a user runs it: ``python -m llminfra …`` in a subprocess."""

import json
import subprocess
import sys

import pytest

from llminfra.calc import memory as mem
from llminfra.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "llminfra", *args], capture_output=True,
                          text=True, timeout=120)


def test_memory_json_has_the_contract_keys():
    r = run("memory", "--model", "llama-2-13b", "--dtype", "bf16", "--context", "4096", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("params", "weight_bytes", "kv_bytes_per_token", "kv_bytes", "total_bytes"):
        assert key in d
    assert d["params"] == 13_015_864_320
    assert d["kv_bytes_per_token"] == 819_200 and d["kv_bytes"] == 819_200 * 4096


def test_memory_with_gpu(capsys):
    assert main(["memory", "--model", "opt-13b", "--context", "2048", "--gpu", "a100-40gb",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fits"] is True and d["gpu_memory_bytes"] == 40_960 * 2**20
    assert d["max_batch"] == mem.max_batch("opt-13b", "a100-40gb", 2048)


def test_memory_table_says_gb_and_gib(capsys):
    assert main(["memory", "--model", "starcoder", "--context", "1024"]) == 0
    out = capsys.readouterr().out
    assert "GB" in out and "GiB" in out and "15,517,456,384" in out


@pytest.mark.parametrize("args,needle", [
    (["memory", "--model", "gpt-5"], "known models"),
    (["memory", "--model", "gpt2", "--gpu", "tpu"], "known GPUs"),
    (["memory", "--model", "gpt2", "--context", "4096"], "1..1024"),
    (["memory", "--model", "gpt2", "--dtype", "int2"], "allowed"),
    (["bench", "nope"], "choose one of"),
])
def test_bad_input_is_one_clear_line(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_models_and_gpus_json(capsys):
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"llama-2-7b", "mixtral-8x7b", "starcoder"}
    assert main(["gpus", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)
    assert all("confidence" in g and "source" in g for g in gpus)


def test_gpus_table_shows_confidence(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "confidence" in out and "recalled" in out and "datasheet" in out


def test_bench_gpu_without_cuda_fails_loudly():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: bench gpu would really run")
    r = run("bench", "gpu")
    assert r.returncode == 1 and "ran nothing" in r.stderr


# ---- hardening (issue 13) -------------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["memory", "--model", "gpt2", "--context", "512", "--batch", "99999999999999999999"],
     "--batch"),
    (["memory", "--model", "falcon-7b", "--context", str(10 ** 15)], "no maximum context"),
    (["memory", "--model", "gpt2", "--context", "512", "--reserve", "0.2"],
     "--reserve needs --gpu"),
    (["bench", "gpu", "--quick"], "no --quick"),
])
def test_absurd_or_ignored_flags_are_one_clear_line(args, needle, capsys):
    """These used to be accepted: absurd figures printed, or the flag silently ignored."""
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_memory_bounds_leave_real_sizes_alone(capsys):
    """A model without a maximum context still takes a long one (falcon-7b lists none)."""
    assert main(["memory", "--model", "falcon-7b", "--context", "100000", "--batch", "64",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["context"] == 100000


@pytest.mark.parametrize("where", ["directory", "under a file"])
def test_bench_json_path_is_checked_before_the_run(where, tmp_path, monkeypatch, capsys):
    """An unusable --json PATH used to end in a traceback after the whole benchmark had run."""
    import llminfra.bench
    ran = []

    class Suite:
        @staticmethod
        def run(quick=False):
            ran.append(quick)
            return {}

        @staticmethod
        def format_table(result):
            return ""

    monkeypatch.setattr(llminfra.bench, "load_suite", lambda name: Suite)
    (tmp_path / "a_file").write_text("x")
    path = tmp_path if where == "directory" else tmp_path / "a_file" / "out.json"
    assert main(["bench", "kvcache", "--quick", "--json", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "--json" in err and "Traceback" not in err
    assert ran == []                                        # nothing was run
    assert main(["bench", "kvcache", "--quick", "--json", str(tmp_path / "new" / "r.json")]) == 0
    assert ran == [True] and json.loads((tmp_path / "new" / "r.json").read_text()) == {}
