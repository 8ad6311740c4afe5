"""Disaggregated serving survives bad requests and malformed handoffs (issue 43): a request too
long for the context is refused alone (it killed the prefill worker, and every valid request
behind it ended "lost"); over gloo, a K/V payload one token shorter than its header, a message
of unknown kind, and int64 K/V are refused with the reason while the decode worker serves the
rest. Issue 54: the link trusts no peer — a pickled ``os.system`` as metadata is never run (it
was: the decode worker unpickled), a header of element size 0 with a non-zero count fails its
request alone (it aborted the decode worker and every request it held), and so do metadata
that is not JSON or describes another K/V shape; the requests behind them are served."""

import pytest
import torch

from llminfra.cluster.kv_transfer import hand_off, import_kv
from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import load_tiny

PROMPTS = ["def add(a, b):", "The KV cache holds", "import numpy as np", "class Stack:",
           "Return the sum of", "for i in range(10):", "while True:", "x = [1, 2, 3]",
           "if __name__ ==", "print(", "async def fetch(url):", "# a comment", "try:"]

#: process-heavy (servers, builds, workers): in `make test`, not `make test-fast`
pytestmark = pytest.mark.slow


def test_import_kv_refuses_integer_kv_and_holds_nothing():
    model, tok = load_tiny()
    prefill = LLMEngine(model, tok, num_blocks=32)
    decode = LLMEngine(model, tok, num_blocks=32)
    rid = prefill.add_request("def f(x):", SamplingParams(max_tokens=4))
    while not any(o.outputs[0].token_ids for o in prefill.step()):
        pass
    h = hand_off(prefill, rid)
    free = decode.cache.num_free_blocks
    bad = type(h)(**{**h.__dict__, "kv": h.kv.to(torch.int64)})
    with pytest.raises(ValueError, match="floating-point K/V"):
        import_kv(decode, bad)
    assert decode.cache.num_free_blocks == free and not decode.requests
    import_kv(decode, h)                                     # the real one still fits


@pytest.fixture(scope="module")
def marker(tmp_path_factory):
    """Where the pickled payload would create a file if the decode worker unpickled it."""
    return tmp_path_factory.mktemp("pickle") / "ran"


@pytest.fixture(scope="module")
def run(marker):
    from llminfra.cluster.disagg_process import TimedRequest, serve_disaggregated
    sp = SamplingParams(max_tokens=10)
    prompts = list(PROMPTS)
    prompts.insert(1, "x" * 5000)                            # far past the tiny context
    reqs = [TimedRequest(p, sp, 0.02 * i) for i, p in enumerate(prompts)]
    # ids: "1" too long; "2" short payload; "3" unknown kind; "4" a stray header; "5" int64;
    # "8" element size 0; "9" a pickled os.system; "10" metadata of another shape; "11" not JSON
    return prompts, serve_disaggregated(
        reqs, engine_kwargs={"num_blocks": 96}, timeout_s=120,
        corrupt_handoffs={"2": "short", "3": "unknown_kind", "4": "unknown_header",
                          "5": "int64", "8": "zero_itemsize", "9": f"pickle:{marker}",
                          "10": "bad_shape", "11": "not_json"})


def test_every_request_ends_and_the_workers_live(run):
    prompts, r = run
    outs = r["outputs"]
    assert len(outs) == len(prompts) and all(o.finished for o in outs)
    assert "died" not in r["prefill"] and "died" not in r["decode"], r
    assert r["decode"]["link_lost"] is None
    for side in ("prefill", "decode"):
        assert r[side]["blocks_free"] == r[side]["blocks_total"], side


def test_a_request_too_long_is_refused_alone(run):
    _, r = run
    bad = r["outputs"][1]
    assert bad.outputs[0].finish_reason == "error" and "refused" in bad.error
    assert "context" in bad.error or "max" in bad.error, bad.error


def test_malformed_handoffs_are_refused_with_the_reason(run):
    _, r = run
    outs = r["outputs"]
    assert "shorter than its header" in outs[2].error
    assert "unknown kind 9" in outs[3].error                  # lost, and said why
    assert "int64" in outs[5].error
    for k in (2, 3, 5):
        assert outs[k].outputs[0].finish_reason == "error", k
    assert len(r["decode"]["refused"]) == 8       # short, kind 9 twice, int64, and issue 54's


def test_a_hostile_peer_fails_only_its_requests(run, marker):
    _, r = run
    outs = r["outputs"]
    assert not marker.exists()                                # the pickle was never run
    assert "values of 0 bytes" in outs[8].error, outs[8].error
    assert "not UTF-8 JSON" in outs[9].error and "not UTF-8 JSON" in outs[11].error
    assert "describes K/V" in outs[10].error
    for k, other in ((8, 10), (10, 8)):         # each names its own request, and only that
        assert f"request '{k}'" in outs[k].error and f"'{other}'" not in outs[k].error
    for k in (8, 9, 10, 11):
        assert outs[k].outputs[0].finish_reason == "error", k


def test_the_other_requests_equal_one_engine(run):
    prompts, r = run
    model, tok = load_tiny()
    ok = [0, 4, 6, 7, 12, 13]                                 # "4": a stray header before it
    ref = LLMEngine(model, tok, num_blocks=96).generate([prompts[i] for i in ok],
                                                        SamplingParams(max_tokens=10))
    got = [r["outputs"][i] for i in ok]
    assert all(o.error is None and o.outputs[0].finish_reason == "length" for o in got)
    assert [o.outputs[0].token_ids for o in got] == [w.outputs[0].token_ids for w in ref]
