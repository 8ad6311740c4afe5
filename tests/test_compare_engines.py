"""``make compare-engines``' orchestration, run with a second llminfra server standing in for the
peers (vLLM and llama.cpp are recorded once, never in CI): export, start, probe, load test, stop,
report; and the report's arithmetic (the plan's roofline bound, ratios, agreement) on its own."""

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
    # fp32 only: the stand-in's FFN (96 wide) is no multiple of the w4a8 kernel's 64
    report = main(["--peer-cmd", peer, "--model", str(folder), "--threads", "1",
                   "--formats", "fp32", "--requests", "1:2,2:3", "--chars-per-token", "1",
                   "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["settings"]["max_model_len"] == 128  # the model's own context caps it
    assert list(report["servers"]) == ["peer", "llminfra"]
    for label, server in report["servers"].items():
        assert server["start_s"] > 0 and len(server["probe_texts"]) == 4
        for c, n in (("1", 2), ("2", 3)):
            row = server["concurrency"][c]
            assert (row["num_requests"], row["num_ok"], row["errors"]) == (n, n, [])
            assert row["output_tokens_per_s"] > 0
    # ours runs chapter 10's exported line with the plan's limits
    ours = report["servers"]["llminfra"]["command"]
    assert ours[ours.index("--max-num-seqs") + 1] == "2"
    assert ours[ours.index("--num-blocks") + 1] == str(2 * 128 // 16)
    assert report["plan"]["limits"]["max_num_seqs"] == 2
    # the same weights and the same engine: every probe's greedy text agrees
    agree = report["greedy_agreement"]
    assert set(agree) == {"peer vs llminfra"}
    assert all(a["equal"] for a in agree["peer vs llminfra"])
    assert set(report["throughput_llminfra_over_peer"]["peer"]) == {"1", "2"}
    plan = report["plan"]["beside_measured"]["2"]
    assert plan["bound"]["tpot_s"] > 0 and set(plan["measured"]) == {"peer", "llminfra"}
    eff = plan["measured"]["llminfra"]["efficiency"]
    assert 0 < eff["throughput"] and 0 < eff["tpot"]


def test_plan_bound_is_the_roofline_of_a_closed_loop():
    from llminfra.bench.compare_report import plan_bound
    from llminfra.calc.roofline import Roofline, step_time_s
    roof = Roofline("cpu", 1e11, 2e10)
    got = plan_bound("smollm2-135m", roof, 4, 99.6, 64)
    # a prefill needs one row of logits: the output layer once per sequence (logits="last")
    tpot = step_time_s("smollm2-135m", roof, [(1, 132)] * 4, dtype="fp32", logits="last")
    ttft = step_time_s("smollm2-135m", roof, [(100, 100)] + [(1, 132)] * 3, dtype="fp32",
                       logits="last")
    assert (got["tpot_s"], got["ttft_s"]) == (tpot, ttft)
    assert got["output_tokens_per_s"] == pytest.approx(4 * 64 / (ttft + 63 * tpot))
    # decode at batch 4 reads the weights once: about 538 MB of fp32 at 20 GB/s
    assert 0.025 < tpot < 0.03


def test_ratios_and_agreement_pair_each_peer_with_ours_of_its_format():
    from llminfra.bench.compare_report import greedy_agreement, throughput_ratios
    from llminfra.bench.compare_servers import ServerSpec
    specs = [ServerSpec(label, engine, fmt, None, None) for label, engine, fmt in (
        ("vllm", "vllm", "fp32"), ("llama.cpp", "llama.cpp", "fp32"),
        ("llama.cpp Q4_1", "llama.cpp", "int4"), ("llminfra", "llminfra", "fp32"),
        ("llminfra w4a8", "llminfra", "int4"))]
    tps = {"vllm": 10.0, "llama.cpp": 20.0, "llama.cpp Q4_1": 40.0, "llminfra": 30.0,
           "llminfra w4a8": 60.0}
    texts = {"vllm": ["a", "b"], "llama.cpp": ["a", "c"], "llama.cpp Q4_1": ["x", "b"],
             "llminfra": ["a", "b"], "llminfra w4a8": ["a", "bb"]}
    results = {k: {"concurrency": {"1": {"output_tokens_per_s": v}}, "probe_texts": texts[k]}
               for k, v in tps.items()}
    assert throughput_ratios(results, specs) == {"vllm": {"1": 3.0}, "llama.cpp": {"1": 1.5},
                                                 "llama.cpp Q4_1": {"1": 1.5}}
    agree = greedy_agreement(results, specs)
    assert [a["equal"] for a in agree["vllm vs llminfra"]] == [True, True]
    assert [a["equal"] for a in agree["llama.cpp vs llminfra"]] == [True, False]
    assert [a["equal"] for a in agree["llama.cpp Q4_1 vs llminfra w4a8"]] == [False, False]
    assert [a["equal"] for a in agree["llminfra w4a8 vs llminfra"]] == [True, False]


def test_bad_arguments_are_refused_before_anything_starts(tmp_path, capsys):
    from llminfra.bench.compare_engines import main
    for argv, msg in ((["--json", str(tmp_path / "x.json")], "at least one peer"),
                      (["--peer-cmd", "x", "--formats", "fp16", "--json",
                        str(tmp_path / "x.json")], "allowed fp32, int4"),
                      (["--peer-cmd", "x", "--json", str(tmp_path)], "not a file"),
                      (["--peer-cmd", "x", "--requests", "1-8", "--json",
                        str(tmp_path / "x.json")], "pairs like")):
        with pytest.raises(SystemExit):
            main(argv)
        assert msg in capsys.readouterr().err
