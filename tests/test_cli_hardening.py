"""The command line under careless input (issue 25, §3): a reader that closes the pipe early, an
unusable ``--json`` path found before the run, and every number checked against its range when
the options are parsed — one line naming the option and the range, exit status 2, nothing run."""

import argparse
import os
import subprocess
import sys

import pytest

from llminfra import cli, cli_serving
from llminfra.cli import main


# ---- broken pipes ----------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["models", "--json"], ["gpus"], ["memory", "--model",
                                                                  "gpt2", "--context", "512"]])
def test_a_pipe_closed_early_ends_quietly(args):
    """``llminfra models --json | head -c 100`` and ``llminfra gpus | head -1`` used to end in a
    BrokenPipeError traceback. Here the pipe's read end is closed before the command starts, so
    its first write meets a pipe without a reader every time (EPIPE), whatever the timing."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([sys.executable, "-m", "llminfra", *args], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert r.stderr == "" and r.returncode == 1


def test_a_pipe_read_in_part_ends_quietly():
    """The reader takes the first 100 bytes, then leaves (``head -c 100``): no traceback
    either way (the command may have written everything before the reader left)."""
    p = subprocess.Popen([sys.executable, "-m", "llminfra", "models", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(p.stdout.read(100)) == 100
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=120) in (0, 1) and err == ""


# ---- every number is checked when parsed -----------------------------------------------------
def _options(parser):
    """(command path, option string, action) of every option of ``parser`` and its
    sub-commands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for path, opt, a in _options(sub):
                    yield (name,) + path, opt, a
        elif action.option_strings:
            yield (), action.option_strings[-1], action


def test_range_ends_are_exact():
    """Each end of a range on its right side: ``[`` and ``]`` included, ``(`` and ``)`` not."""
    from llminfra.cli_numbers import integer, number
    bad = argparse.ArgumentTypeError
    count = integer(1, 10)
    assert (count("1"), count("10")) == (1, 10)
    for text in ("0", "11", "1.0", "ten"):
        with pytest.raises(bad, match=r"in 1\.\.10"):
            count(text)
    share = number(0, 1, high_open=True)
    assert share("0") == 0.0 and share("0.999") == 0.999
    for text in ("1", "-0.001", "nan", "inf", "-inf", "half"):
        with pytest.raises(bad, match=r"in \[0, 1\)"):
            share(text)
    positive = number(0, low_open=True)
    assert positive("5e-324") == 5e-324                      # the smallest float > 0
    for text in ("0", "-0", "1e400"):
        with pytest.raises(bad, match="> 0"):
            positive(text)
    assert number(0, 1, low_open=True)("1") == 1.0


def test_no_numeric_option_takes_a_bare_int_or_float():
    """A bare ``type=float`` accepts nan, inf and negatives; a bare ``type=int`` accepts 0 and
    negatives. Only ``serve --port`` is checked later (by ``run_server``, before anything is
    loaded; ``tests/test_server.py``)."""
    bare = [(path, opt) for path, opt, a in _options(cli.build_parser())
            if a.type in (int, float) and (path, opt) != (("serve",), "--port")]
    assert bare == []


def test_the_parser_copies_of_names_match_their_sources():
    """The parser keeps copies so that ``llminfra gpus`` does not import torch."""
    import uvicorn.config

    from llminfra.serving import loadtest
    from llminfra.engine.scheduler import POLICIES
    from llminfra.kvcache.trace import WORKLOADS
    assert cli_serving.POLICIES == POLICIES and cli_serving.WORKLOADS == tuple(sorted(WORKLOADS))
    assert cli_serving.UVICORN_LOG_LEVELS == tuple(uvicorn.config.LOG_LEVELS)
    from llminfra.runner.kernel_choice import MATMULS
    assert cli_serving.MATMULS == MATMULS
    assert (cli_serving.MAX_REQUESTS, cli_serving.MAX_CHARS_PER_TOKEN) == (
        loadtest.MAX_REQUESTS, loadtest.MAX_CHARS_PER_TOKEN)


LT = ["loadtest", "--base-url", "http://127.0.0.1:9"]


@pytest.mark.parametrize("args, needle", [
    (LT + ["--rate", "inf"], "argument --rate: must be a finite number of requests per second > 0"),
    (LT + ["--rate", "nan"], "argument --rate: must be a finite number of requests per second > 0"),
    (LT + ["--rate", "0"], "argument --rate: must be a finite number of requests per second > 0"),
    (LT + ["--rate", "1", "--max-output-tokens", "0"],
     "argument --max-output-tokens: must be an integer number of tokens >= 1, got 0"),
    (LT + ["--rate", "1", "--max-output-tokens", "-5"], "argument --max-output-tokens"),
    (LT + ["--concurrency", "0"], "argument --concurrency: must be an integer number of clients"),
    (LT + ["--concurrency", "2", "--requests", "0"], "argument --requests"),
    (LT + ["--concurrency", "2", "--requests", "10000000000"], "1..1,000,000"),
    (LT + ["--concurrency", "2", "--seed", "-1"], "argument --seed"),
    (LT + ["--concurrency", "2", "--seed", str(2**64)], "argument --seed"),
    (LT + ["--concurrency", "2", "--max-model-len", "1"], "argument --max-model-len"),
    (LT + ["--concurrency", "2", "--chars-per-token", "0"], "argument --chars-per-token"),
    (LT + ["--concurrency", "2", "--chars-per-token", "1e9"], "(0, 100]"),
    (LT + ["--concurrency", "2", "--arrivals", "bursty"], "argument --arrivals"),
    (LT + ["--concurrency", "2", "--workload", "wiki"], "argument --workload"),
    (["serve", "--threads", "0"], "argument --threads: must be an integer number of threads"),
    (["serve", "--threads", "-3"], "argument --threads"),
    (["serve", "--max-num-seqs", "0"], "argument --max-num-seqs"),
    (["serve", "--num-blocks", "0"], "argument --num-blocks"),
    (["serve", "--policy", "fastest"], "argument --policy"),
    (["serve", "--log-level", "loud"], "argument --log-level"),
    (["memory", "--model", "gpt2", "--context", "0"], "argument --context"),
    (["memory", "--model", "gpt2", "--context", "512", "--batch", "-1"], "argument --batch"),
    (["memory", "--model", "gpt2", "--gpu", "h100", "--reserve", "1"],
     "argument --reserve: must be a finite number in [0, 1)"),
    (["memory", "--model", "gpt2", "--gpu", "h100", "--reserve", "nan"], "argument --reserve"),
])
def test_bad_numbers_are_one_line_naming_the_option(args, needle, capsys, monkeypatch):
    """Each used to be accepted (``--max-output-tokens 0``), to end in a traceback
    (``--rate inf``: OverflowError, ``serve --threads 0``: RuntimeError), or to reach the
    calculator under another name. Nothing runs: the server and load test are never called."""
    import llminfra.serving.loadtest
    import llminfra.serving.serve

    def never(*a, **k):
        raise AssertionError("ran despite bad input")
    monkeypatch.setattr(llminfra.serving.serve, "run_server", never)
    monkeypatch.setattr(llminfra.serving.loadtest, "run_loadtest", never)
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_help_is_status_0_not_an_exception(capsys):
    assert main(["loadtest", "--help"]) == 0
    assert "--max-output-tokens" in capsys.readouterr().out


# ---- the load test: settings checked before the first request --------------------------------
def test_loadtest_schedule_longer_than_a_day_is_refused_before_any_request(capsys):
    """``--rate 1e-300`` used to wait ~1e300 s for its second request. The server address
    leads nowhere: the refusal comes before the model list is even asked for."""
    assert main(LT + ["--rate", "1e-300", "--requests", "100"]) == 2
    err = capsys.readouterr().err
    assert "one day" in err and "rate 1e-300" in err and err.count("\n") == 1
    assert main(LT + ["--rate", "1e-320", "--requests", "2"]) == 2     # 1 / rate overflows
    assert "one day" in capsys.readouterr().err
    # a day is allowed: 100 requests at 99 / 86,400 per second; then the server is missing
    assert main(LT + ["--rate", str(99 / 86_400), "--requests", "100"]) == 2
    assert "no OpenAI-compatible model list" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["directory", "under a file"])
def test_loadtest_json_path_is_checked_before_the_run(where, tmp_path, monkeypatch, capsys):
    """An unusable ``--json PATH`` used to raise after the whole run, its numbers lost."""
    import llminfra.serving.loadtest as lt
    ran = []

    def fake_run(*a, **k):
        ran.append(k)
        return {"num_ok": 1, "tpot_s": {"p50": float("nan")}}
    monkeypatch.setattr(lt, "run_loadtest", fake_run)
    monkeypatch.setattr(lt, "format_summary", lambda r: "summary")
    (tmp_path / "a_file").write_text("x")
    path = tmp_path if where == "directory" else tmp_path / "a_file" / "lt.json"
    assert main(LT + ["--concurrency", "2", "--json", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--json" in err and str(path) in err and "Traceback" not in err and ran == []
    good = tmp_path / "new" / "lt.json"
    assert main(LT + ["--concurrency", "2", "--json", str(good)]) == 0 and len(ran) == 1
    # NaN (no latency to report) is written as null: strict JSON, readable outside Python
    assert good.read_text() == '{\n  "num_ok": 1,\n  "tpot_s": {\n    "p50": null\n  }\n}\n'


@pytest.mark.parametrize("kwargs, needle", [
    (dict(rate=1e-300), "one day"),
    (dict(rate=float("nan")), "rate must be a finite number"),
    (dict(rate=2.0, max_output_tokens=0), "max_output_tokens must be None or an int >= 1"),
    (dict(rate=2.0, max_output_tokens=-5), "max_output_tokens"),
    (dict(rate=2.0, seed=2**64), "seed must be an int in 0..2**64 - 1"),
    (dict(rate=2.0, arrivals="bursty"), "arrivals"),
])
def test_loadtest_requests_refuses_what_it_cannot_draw(kwargs, needle):
    """``max_output_tokens=0`` used to be silently turned into 1; ``seed=2**64`` reached
    torch's "Overflow when unpacking long"."""
    from llminfra.serving.loadtest import loadtest_requests
    with pytest.raises(ValueError, match=needle.replace("*", r"\*").replace(".", r"\.")):
        loadtest_requests(100, kwargs.pop("seed", 0), 256, **kwargs)


def test_run_loadtest_checks_before_the_network():
    """The address leads nowhere; each refusal names the setting, not the connection."""
    from llminfra.serving.loadtest import run_loadtest
    base = "http://127.0.0.1:9"
    for kwargs, needle in ((dict(rate=1e-300), "one day"),
                           (dict(concurrency=2, max_output_tokens=0), "max_output_tokens"),
                           (dict(concurrency=2, chars_per_token=float("inf")), "chars_per_token"),
                           (dict(concurrency=2, max_model_len=1), "max_model_len"),
                           (dict(concurrency=2, timeout_s=float("nan")), "timeout_s"),
                           (dict(concurrency=2, num_requests=10**7), "num_requests")):
        with pytest.raises(ValueError, match=needle):
            run_loadtest(base, progress=False, **kwargs)


@pytest.mark.slow
def test_serve_an_unknown_model_is_one_line():
    """``serve --model no-such-model`` used to end in a FileNotFoundError traceback."""
    r = subprocess.run([sys.executable, "-m", "llminfra", "serve", "--model", "no-such-model",
                        "--port", "9"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "llminfra serve: 'no-such-model' is not a known model" in r.stderr


def test_serve_limit_flags_reach_run_server(monkeypatch):
    """The server's bounds are settable from the command line, checked like every number, and
    the defaults the help names are http_limits' own."""
    from llminfra import cli
    from llminfra.serving import http_limits, serve
    seen = {}
    monkeypatch.setattr(serve, "run_server", lambda *a, **kw: seen.update(kw))
    assert cli.main(["serve", "--max-body-bytes", "4096", "--body-timeout", "2.5",
                     "--max-connections", "8", "--keep-alive-timeout", "1"]) == 0
    assert (seen["max_body_bytes"], seen["body_timeout_s"], seen["limit_concurrency"],
            seen["timeout_keep_alive_s"]) == (4096, 2.5, 8, 1.0)
    seen.clear()
    assert cli.main(["serve"]) == 0
    assert "max_body_bytes" not in seen and seen["limit_concurrency"] is None
    assert (http_limits.MAX_BODY_BYTES, http_limits.BODY_TIMEOUT_S) == (2**20, 30.0)
    assert (http_limits.UVICORN_LIMITS["limit_concurrency"],
            http_limits.UVICORN_LIMITS["timeout_keep_alive"]) == (256, 5)
    assert cli.main(["serve", "--max-connections", "0"]) == 2
