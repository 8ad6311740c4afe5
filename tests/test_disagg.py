"""Prefill/decode disaggregation: a request prefilled on one engine and decoded on another
gives the colocated engine's output token for token (greedy, and seeded sampling: the
generator state travels); the KV handoff is exact and all or nothing; a failed import is
retried or fails its request with a reason; no block is leaked on either side. The process
version (two gloo ranks) is checked under ``slow``: equality, injected import faults, a dying
prefill worker, and the real model."""

import pytest
import torch

from llminfra.cluster.disagg import DecodeWorker, PrefillWorker, run_local
from llminfra.cluster.kv_transfer import can_import, export_kv, hand_off, import_kv, release
from llminfra.engine import LLMEngine, SamplingParams
from llminfra.kvcache.blocks import BlockPoolExhausted
from llminfra.model import load_tiny

PROMPTS = ["def foo(x):", "Return the sum of", "The quick brown fox " * 6, "a",
           "import os\nimport sys\n", "class Cache:\n    def __init__(self"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def tiny64():
    """The trained tiny model in float64: batching cannot flip a near-tie of the argmax."""
    model, tok = load_tiny()
    return model.double().eval(), tok


def _engines(tiny, blocks=(64, 48), block_sizes=(16, 8), **kw):
    model, tok = tiny
    return (LLMEngine(model, tok, num_blocks=blocks[0], block_size=block_sizes[0], **kw),
            LLMEngine(model, tok, num_blocks=blocks[1], block_size=block_sizes[1], **kw))


def _tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def _all_free(*engines):
    for e in engines:
        e.cache.allocator.check_invariants()
        assert e.cache.num_free_blocks == e.cache.allocator.num_blocks
        assert not e.requests


def test_disaggregated_equals_colocated_greedy(tiny64):
    sp = [SamplingParams(max_tokens=n) for n in (20, 7, 25, 3, 16, 1)]
    ref = LLMEngine(*tiny64, num_blocks=64).generate(PROMPTS, sp)
    pe, de = _engines(tiny64)
    got = run_local(pe, de, PROMPTS, sp)
    assert _tokens(got) == _tokens(ref)
    assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in ref]
    assert [o.outputs[0].finish_reason for o in got] == [o.outputs[0].finish_reason for o in ref]
    assert all(o.metrics.ttft_s is not None and o.metrics.finished_time for o in got)
    _all_free(pe, de)


def test_one_prompt_of_token_ids_is_one_request(tiny64):
    """run_local pairs prompts and params as LLMEngine.generate does: a list of ints is ONE
    prompt, not one prompt per token."""
    ids = tiny64[1].encode("def read(path):")
    sp = SamplingParams(max_tokens=6)
    pe, de = _engines(tiny64)
    got = run_local(pe, de, ids, sp)
    assert len(got) == 1
    assert _tokens(got) == _tokens(LLMEngine(*tiny64, num_blocks=64).generate(ids, sp))
    _all_free(pe, de)


def test_disaggregated_equals_colocated_seeded_sampling(tiny64):
    sp = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234)
    ref = LLMEngine(*tiny64, num_blocks=64).generate(PROMPTS[:4], sp)
    got = run_local(*_engines(tiny64), PROMPTS[:4], sp)
    assert _tokens(got) == _tokens(ref)


def test_handoff_moves_exactly_the_kv_of_the_used_blocks(tiny64):
    """export → import into a pool of another block size → export again: the same tensor,
    and the bytes are 2·L·T·H_kv·d·itemsize."""
    pe, de = _engines(tiny64, block_sizes=(16, 4))
    rid = pe.add_request(PROMPTS[2], SamplingParams(max_tokens=5))
    while not pe.requests[rid].seqs[0].output_token_ids:
        pe.step()
    h = export_kv(pe, rid)
    cfg = tiny64[0].config
    T = len(pe.requests[rid].prompt_token_ids)
    assert h.kv.shape == (2, cfg.n_layers, T, cfg.n_kv_heads, cfg.head_dim)
    assert h.nbytes == 2 * cfg.n_layers * T * cfg.n_kv_heads * cfg.head_dim * 8
    release(pe, rid)
    import_kv(de, h)
    assert torch.equal(export_kv(de, rid).kv, h.kv)
    assert de.cache.num_free_blocks == de.cache.allocator.num_blocks - -(-T // 4)
    release(de, rid)
    _all_free(pe, de)


def test_import_is_all_or_nothing(tiny64):
    pe, de = _engines(tiny64, blocks=(64, 3), block_sizes=(16, 8))
    rid = pe.add_request(PROMPTS[2], SamplingParams(max_tokens=5))
    pe.step()
    h = hand_off(pe, rid)
    assert not can_import(de, h)
    with pytest.raises(BlockPoolExhausted):
        import_kv(de, h)
    bad = type(h)(**{**h.__dict__, "kv": h.kv[:, :, :, :1]})
    with pytest.raises(ValueError, match="H_kv"):
        import_kv(de, bad)

    def boom():
        raise RuntimeError("link dropped mid-write")
    small = pe.add_request(PROMPTS[0], SamplingParams(max_tokens=5))
    pe.step()
    with pytest.raises(RuntimeError, match="mid-write"):
        import_kv(de, hand_off(pe, small), before_commit=boom)
    _all_free(pe, de)


def test_failed_import_is_retried_or_fails_with_a_reason(tiny64):
    sp = SamplingParams(max_tokens=10)
    ref = LLMEngine(*tiny64, num_blocks=64).generate(PROMPTS, sp)
    pe, de = _engines(tiny64)
    got = run_local(pe, de, PROMPTS, sp, max_import_retries=1, fail_on={"1": 1, "4": 3})
    assert got[1].outputs[0].token_ids == ref[1].outputs[0].token_ids   # retried once, fine
    assert got[4].outputs[0].finish_reason == "error"
    assert "InjectedFault" in got[4].error and "2 attempts" in got[4].error
    assert got[4].outputs[0].token_ids == ref[4].outputs[0].token_ids[:1]
    others = [i for i in range(len(PROMPTS)) if i != 4]
    assert [got[i].outputs[0].token_ids for i in others] == \
        [ref[i].outputs[0].token_ids for i in others]
    _all_free(pe, de)


def test_decode_pool_backpressure_every_request_finishes(tiny64):
    """A decode pool that holds one long request at a time: handoffs wait, nothing is lost;
    a handoff that can never fit ends with an error."""
    sp = SamplingParams(max_tokens=8)
    ref = LLMEngine(*tiny64, num_blocks=64).generate(PROMPTS, sp)
    pe, de = _engines(tiny64, blocks=(64, 16), block_sizes=(16, 8))
    got = run_local(pe, de, PROMPTS, sp)
    assert _tokens(got) == _tokens(ref)
    pe, de = _engines(tiny64, blocks=(64, 2), block_sizes=(16, 8))
    got = run_local(pe, de, PROMPTS[2:4], sp)
    assert got[0].outputs[0].finish_reason == "error" and "cannot hold" in got[0].error
    assert got[1].outputs[0].token_ids == ref[3].outputs[0].token_ids
    _all_free(pe, de)


def test_bad_input(tiny64):
    pe, de = _engines(tiny64)
    with pytest.raises(ValueError, match="two engines"):
        run_local(pe, pe, PROMPTS[:1])
    with pytest.raises(ValueError, match="n = 2"):
        PrefillWorker(pe).add_request("x", SamplingParams(n=2, temperature=1.0))
    with pytest.raises(KeyError, match="no live request"):
        export_kv(pe, "nope")
    with pytest.raises(ValueError, match="max_import_retries"):
        DecodeWorker(de, max_import_retries=-1)
    rid = pe.add_request("abc", SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="first token"):
        export_kv(pe, rid)                       # not run yet
    release(pe, rid)
    _all_free(pe, de)


# ------------------------------------------------------------------ the wire format (data only)
def _handoff(tiny64, sp):
    pe, _ = _engines(tiny64)
    rid = pe.add_request(PROMPTS[0], sp)
    while not pe.requests[rid].seqs[0].output_token_ids:
        pe.step()
    return hand_off(pe, rid)


def _meta_bytes(h) -> bytes:
    import json
    from llminfra.cluster.kv_transfer import handoff_meta
    return json.dumps(handoff_meta(h)).encode()


def test_handoff_metadata_is_json_and_reads_back_equal(tiny64):
    """Every field but the K/V values round-trips through JSON: the sampling parameters
    (logit_bias with int keys, stop strings, a schema), the generator state, log-probs."""
    from llminfra.cluster.kv_link import read_meta
    sp = SamplingParams(max_tokens=6, temperature=0.8, seed=7, stop=["\n\n", "END"],
                        logit_bias={3: -1.5, 17: 2.0}, logprobs=2)
    h = _handoff(tiny64, sp)
    got, shape, dtype = read_meta(_meta_bytes(h))
    assert shape == tuple(h.kv.shape) and dtype == str(h.kv.dtype)
    assert got.params == h.params and got.params.logit_bias == {3: -1.5, 17: 2.0}
    assert torch.equal(got.generator_state, h.generator_state)
    for name in ("request_id", "prompt", "prompt_token_ids", "output_token_ids",
                 "arrival_time", "first_scheduled_time", "token_times", "output_logprobs"):
        assert getattr(got, name) == getattr(h, name), name


def test_a_pickled_payload_is_never_run(tiny64, tmp_path):
    """The payload is live (pickle.loads runs os.system and creates the marker); the link's
    reader refuses the same bytes as data and the marker never appears."""
    import pickle
    from llminfra.cluster.kv_link import pickled_system_call, read_meta
    live, marker = tmp_path / "live", tmp_path / "marker"
    pickle.loads(pickled_system_call(f"touch '{live}'"))
    assert live.exists()
    with pytest.raises(ValueError, match="not UTF-8 JSON"):
        read_meta(pickled_system_call(f"touch '{marker}'"))
    assert not marker.exists()


@pytest.mark.parametrize("field, value, match", [
    ("request_id", 5, "request_id"), ("request_id", "x" * 300, "request_id"),
    ("prompt_token_ids", [1, -2], "prompt_token_ids"),
    ("prompt_token_ids", [1, True], "prompt_token_ids"),
    ("output_token_ids", "12", "output_token_ids"),
    ("params", {"max_tokens": 4, "__class__": "os.system"}, "params"),
    ("params", {"temperature": -1.0}, "temperature"),
    ("arrival_time", float("nan"), "arrival_time"),
    ("token_times", [0.1, "now"], "token_times"),
    ("generator_state", "not base64!", "generator_state"),
    ("output_logprobs", [[1, 0.0]], "output_logprobs"),
    ("kv", {"shape": [2, 1, 3, 1], "dtype": "torch.float32"}, "kv.shape"),
    ("kv", {"shape": [2, 1, -3, 1, 4], "dtype": "torch.float32"}, "kv.shape"),
    ("kv", {"shape": [2, 1, 3, 1, 4], "dtype": "torch.int64"}, "kv.dtype"),
    ("kv", {"shape": [2, 1, 3, 1, 4], "dtype": "numpy.object_"}, "kv.dtype"),
])
def test_every_metadata_field_is_checked(tiny64, field, value, match):
    import json
    from llminfra.cluster.kv_link import read_meta
    from llminfra.cluster.kv_transfer import handoff_meta
    meta = handoff_meta(_handoff(tiny64, SamplingParams(max_tokens=4, temperature=1.0, seed=1)))
    meta[field] = value
    with pytest.raises(ValueError, match=match):
        read_meta(json.dumps(meta).encode())
    meta.pop(field)
    with pytest.raises(ValueError, match="exactly the keys"):
        read_meta(json.dumps(meta).encode())


def test_a_header_out_of_step_or_past_the_limits_is_refused():
    from llminfra.cluster import kv_link as kl

    def header(*fields):
        raw = torch.zeros(kl.HEADER_BUFFER_BYTES, dtype=torch.uint8)
        raw[:8 * len(fields)] = torch.tensor(fields, dtype=torch.int64).view(torch.uint8)
        return raw
    assert kl.read_header(header(kl.MAGIC, 1, 10, 6, 0)) == (1, 10, 6, 0)   # read, then refused
    for bad in [(7, 1, 10, 6, 4), (kl.MAGIC, 1, -1, 6, 4), (kl.MAGIC, 1, 10, -6, 4),
                (kl.MAGIC, 1, kl.MAX_META_BYTES + 1, 6, 4), (kl.MAGIC, 1, 10, 6, 17),
                (kl.MAGIC, 1, 10, kl.MAX_KV_BYTES, 2)]:
        with pytest.raises(ConnectionError, match="out of step"):
            kl.read_header(header(*bad))


# ------------------------------------------------------------------ processes (gloo)
@pytest.fixture(scope="module")
def tiny_run():
    from llminfra.cluster.disagg_process import TimedRequest, serve_disaggregated
    sp = SamplingParams(max_tokens=16)
    reqs = [TimedRequest(p, sp, 0.01 * i) for i, p in enumerate(PROMPTS)]
    return serve_disaggregated(reqs, engine_kwargs={"num_blocks": 64},
                               fail_on={"1": 1, "3": 5}, timeout_s=90)


@pytest.mark.slow
def test_processes_equal_colocated_and_survive_import_faults(tiny_run):
    model, tok = load_tiny()
    ref = LLMEngine(model, tok, num_blocks=64).generate(PROMPTS, SamplingParams(max_tokens=16))
    got = tiny_run["outputs"]
    ok = [i for i in range(len(PROMPTS)) if i != 3]
    assert [got[i].outputs[0].token_ids for i in ok] == [ref[i].outputs[0].token_ids for i in ok]
    assert got[3].outputs[0].finish_reason == "error" and "InjectedFault" in got[3].error
    for side in ("prefill", "decode"):
        assert tiny_run[side]["blocks_free"] == tiny_run[side]["blocks_total"]
    assert tiny_run["decode"]["num_retries"] == 2
    assert len(tiny_run["prefill"]["transfers"]) == len(PROMPTS)
    assert all(v > 0 for v in tiny_run["prefill"]["link_mb_per_s"].values())


@pytest.mark.slow
def test_processes_prefill_death_loses_no_request():
    from llminfra.cluster.disagg_process import TimedRequest, serve_disaggregated
    sp = SamplingParams(max_tokens=12)
    reqs = [TimedRequest(p, sp, 0.05 * i) for i, p in enumerate(PROMPTS)]
    r = serve_disaggregated(reqs, engine_kwargs={"num_blocks": 64}, prefill_exit_after=2,
                            timeout_s=90)
    outs = r["outputs"]
    assert len(outs) == len(PROMPTS) and all(o.finished for o in outs)
    done = [o for o in outs if o.outputs[0].finish_reason == "length"]
    failed = [o for o in outs if o.outputs[0].finish_reason == "error"]
    assert len(done) == 2 and len(failed) == len(PROMPTS) - 2
    assert all("prefill worker died" in o.error for o in failed)
    assert "died" in r["prefill"] and r["decode"]["link_lost"]
    assert r["decode"]["blocks_free"] == r["decode"]["blocks_total"]


@pytest.mark.slow
def test_processes_real_model_equal_colocated():
    from llminfra.model import load_pretrained
    from llminfra.cluster.disagg_process import TimedRequest, serve_disaggregated
    prompts = ["The capital of France is", "def fibonacci(n):",
               "Write one sentence about the sea."]
    sp = SamplingParams(max_tokens=8)
    r = serve_disaggregated([TimedRequest(p, sp) for p in prompts], model="smollm2-135m",
                            engine_kwargs={"num_blocks": 32}, timeout_s=180)
    model, tok = load_pretrained("smollm2-135m")
    ref = LLMEngine(model, tok, num_blocks=32).generate(prompts, sp)
    assert _tokens(r["outputs"]) == _tokens(ref)
