"""The one engine-core loop (llminfra/serving/engine_core.py): commands in, events out, the
same tuples for the thread and the process transports."""

import pytest

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.model import load_tiny
from llminfra.serving.engine_core import NO_COMMAND, apply_command, run_engine_loop


@pytest.fixture(scope="module")
def engine():
    model, tok = load_tiny()
    return LLMEngine(model, tok, num_blocks=64, block_size=8)


def scripted(commands):
    """``next_command`` that hands out ``commands`` one per call, then the stop."""
    it = iter(commands)

    def next_command(wait_s):
        return next(it, None)
    return next_command


def test_add_step_until_done_then_stop(engine):
    events = []
    params = SamplingParams(max_tokens=5, temperature=0)
    run_engine_loop(engine, scripted([("add", "a", "def ", params), NO_COMMAND, NO_COMMAND,
                                      NO_COMMAND, NO_COMMAND, NO_COMMAND, NO_COMMAND]),
                    events.append, idle_wait_s=0.01, heartbeat_s=0.0)
    kinds = [e[0] for e in events]
    assert kinds[0] == "accepted" and events[0][1] == "a"
    steps = [e for e in events if e[0] == "step"]
    finals = [o for e in steps for o in e[1] if o.finished]
    assert len(finals) == 1 and len(finals[0].outputs[0].token_ids) == 5
    assert not engine.has_unfinished_requests()
    expected = engine.generate(["def "], params)[0].outputs[0].token_ids
    assert finals[0].outputs[0].token_ids == expected


def test_a_bad_request_is_refused_alone_and_named(engine):
    events = []
    run_engine_loop(engine, scripted([("add", "bad", "x" * 100_000, SamplingParams()),
                                      ("add", "ok", "def ", SamplingParams(max_tokens=2)),
                                      NO_COMMAND, NO_COMMAND, NO_COMMAND]),
                    events.append, idle_wait_s=0.01, heartbeat_s=0.0)
    assert events[0][:2] == ("refused", "bad") and "prompt" in events[0][2]
    assert events[1] == ("accepted", "ok")
    assert any(o.finished and o.request_id == "ok" for e in events if e[0] == "step"
               for o in e[1])


def test_abort_frees_the_request(engine):
    events = []
    run_engine_loop(engine, scripted([("add", "long", "def ", SamplingParams(max_tokens=50)),
                                      NO_COMMAND, ("abort", "long"), NO_COMMAND]),
                    events.append, idle_wait_s=0.01, heartbeat_s=0.0)
    assert not engine.has_unfinished_requests()
    assert engine.stats()["kv_blocks_used"] == 0


def test_idle_heartbeat_and_unknown_command(engine):
    events = []
    run_engine_loop(engine, scripted([NO_COMMAND, NO_COMMAND]), events.append,
                    idle_wait_s=0.01, heartbeat_s=0.0)
    assert [e[0] for e in events] == ["stats", "stats"]
    with pytest.raises(ValueError, match="'launch'.*allowed"):
        apply_command(engine, ("launch", "x"), events.append)
