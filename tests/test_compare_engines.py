"""``make compare-engines``' orchestration, run with a second llminfra server standing in for vLLM
(vLLM itself is recorded once, never in CI): export, start, probe, load test, stop, report."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("transformers")  # the stand-in model comes from a transformers config
from test_pretrained_files import _hf_folder  # noqa: E402

pytestmark = pytest.mark.slow  # starts four server processes


def test_both_servers_measured_and_their_greedy_texts_compared(tmp_path):
    from llminfra.bench.compare_engines import main
    _, folder = _hf_folder(tmp_path, "llama")
    out = tmp_path / "compare.json"
    peer = (f"{sys.executable} -m llminfra serve --model {{folder}} --port {{port}} "
            f"--threads {{threads}} --log-level warning")
    report = main(["--peer-cmd", peer, "--model", str(folder), "--threads", "1",
                   "--requests", "1:2,2:3", "--chars-per-token", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["settings"]["max_model_len"] == 128  # the model's own context caps it
    for label in ("peer", "llminfra"):
        server = report["servers"][label]
        assert server["start_s"] > 0 and len(server["probe_texts"]) == 4
        for c, n in (("1", 2), ("2", 3)):
            row = server["concurrency"][c]
            assert (row["num_requests"], row["num_ok"], row["errors"]) == (n, n, [])
            assert row["output_tokens_per_s"] > 0
    # the same weights and the same engine: every probe's greedy text agrees
    assert all(a["equal"] for a in report["greedy_agreement"])
    assert set(report["throughput_llminfra_over_peer"]) == {"1", "2"}


def test_bad_arguments_are_refused_before_anything_starts(tmp_path, capsys):
    from llminfra.bench.compare_engines import main
    for argv, msg in ((["--json", str(tmp_path / "x.json")], "exactly one of"),
                      (["--peer-cmd", "x", "--json", str(tmp_path)], "not a file"),
                      (["--peer-cmd", "x", "--requests", "1-8", "--json",
                        str(tmp_path / "x.json")], "pairs like")):
        with pytest.raises(SystemExit):
            main(argv)
        assert msg in capsys.readouterr().err
