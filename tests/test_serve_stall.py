"""One prompt cannot stall or block the server (issue 54, item 2).

* ``serve --max-prefill-chunk-tokens N`` reaches the engine, with a default below the step's
  budget: a long prompt is read a chunk a step, and a short request beside it gets its first
  token within a few engine steps (counted by the engine's step counter, not in seconds).
* The stall check judges progress, not step length: a step may last longer than
  ``stall_timeout_s`` when its work says it should (:class:`StepClock`), and no client gets a
  503 meanwhile; a step past :data:`STEP_SLACK` times its expected length is still a stall.

Servers on 127.0.0.1 (port from the OS), the tiny model's engine in a thread; slow steps are a
patched forward pass that sleeps."""

import inspect
import threading
import time

import httpx
import pytest

import llminfra.serving.serve as serve_module
from llminfra.cli import build_parser
from llminfra.cli_serving import MAX_PREFILL_CHUNK_TOKENS, serve
from llminfra.serving.background import ServerThread
from llminfra.serving.engine_core import STEP_SLACK, StallWatch, StepClock
from llminfra.serving.serve import build_engine
from llminfra.serving.server import create_app

MODEL = "llminfra-tiny"


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


# ------------------------------------------------------------------ the option
def test_serve_passes_max_prefill_chunk_tokens_to_the_engine(monkeypatch):
    """The option and its default reach ``run_server`` (and from there ``build_engine``); the
    parser's copy of the default is the server's, and it leaves room in the step's budget."""
    seen = {}
    monkeypatch.setattr(serve_module, "run_server", lambda *a, **kw: seen.update(kw))
    for argv, want in ((["serve"], serve_module.MAX_PREFILL_CHUNK_TOKENS),
                       (["serve", "--max-prefill-chunk-tokens", "48"], 48)):
        serve(build_parser().parse_args(argv))
        assert seen["max_prefill_chunk_tokens"] == want
    assert MAX_PREFILL_CHUNK_TOKENS == serve_module.MAX_PREFILL_CHUNK_TOKENS
    defaults = inspect.signature(build_engine).parameters
    assert defaults["max_prefill_chunk_tokens"].default == MAX_PREFILL_CHUNK_TOKENS
    assert MAX_PREFILL_CHUNK_TOKENS < defaults["max_num_batched_tokens"].default
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-prefill-chunk-tokens", "0"])


def counted(engine, forward_sleep_s=lambda T, A: 0.0):
    """Wrap ``engine`` so that each request notes the engine's step count when it is added
    (``added``) and when its first token comes out (``first``), by prompt length; its forward
    pass sleeps ``forward_sleep_s(T, A)`` more (T new tokens, A token-context pairs)."""
    added, first = {}, {}
    add, step, forward = engine.add_request, engine.step, engine.runner.forward

    def add_request(prompt, params=None, request_id=None, **kw):
        rid = add(prompt, params, request_id=request_id, **kw)
        added[len(engine.requests[rid].prompt_token_ids)] = engine.counters["num_steps"]
        return rid

    def counting_step():
        outputs = step()
        for o in outputs:
            if o.outputs[0].token_ids and len(o.prompt_token_ids) not in first:
                first[len(o.prompt_token_ids)] = engine.counters["num_steps"]
        return outputs

    def slow_forward(scheduled, padding, caught):
        T, A = StepClock.work(scheduled, padding)
        time.sleep(forward_sleep_s(T, A))
        return forward(scheduled, padding, caught)

    engine.add_request, engine.step, engine.runner.forward = add_request, counting_step, \
        slow_forward
    return added, first


def wait_until(condition, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"not {what} after {timeout_s} s")


def complete(base_url: str, prompt: str, results: list, max_tokens: int = 1):
    r = httpx.post(f"{base_url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True})
    results.append(r)


def test_a_short_request_beside_a_long_prompt_gets_its_token_within_two_steps():
    """A 200-token prompt is read 16 tokens a step (budget 32); a 3-token request sent while
    it is being read joins the next step and has its first token after it, while the long
    prompt is still being read. Without the cap the long prompt took the whole budget and the
    short one waited for all of it (four steps here, its token in the long one's last)."""
    engine = build_engine("tiny", num_threads=1, num_blocks=32, max_num_seqs=4,
                          max_num_batched_tokens=32, max_prefill_chunk_tokens=16)
    added, first = counted(engine, lambda T, A: 0.02)      # room to send the short one
    with ServerThread(create_app(engine, engine.tokenizer, model_name=MODEL)) as srv:
        results = []
        long = threading.Thread(target=complete, args=(srv.base_url, "x" * 200, results))
        long.start()
        wait_until(lambda: 200 in added and engine.counters["num_steps"] > added[200],
                   "reading the long prompt")
        complete(srv.base_url, "abc", results)
        long.join(60)
    assert [r.status_code for r in results] == [200, 200]
    assert first[3] - added[3] <= 2, (added, first)
    assert first[3] < first[200], "the short request waited for the whole long prompt"


# ------------------------------------------------------------- the stall check
def test_step_clock_scales_the_closest_earlier_step_by_its_work():
    """Worked by hand: a timed step of T = 10 tokens over A = 100 pairs took 0.1 s, one of
    T = 1, A = 50 took 0.01 s. Next, T = 20, A = 400: 0.1 · max(1, 2, 4) = 0.4 s against
    0.01 · max(1, 20, 8) = 0.2 s — the smaller bound, 0.2 s. A smaller step than both is
    bounded by the faster one, 0.01 s."""
    clock = StepClock()

    class Seq:
        def __init__(self, c):
            self.num_computed_tokens = c

    def sched(*rows):                    # (new tokens, context before)
        return [(Seq(c), n) for n, c in rows]

    assert clock.begin(sched((10, 0))) is None          # nothing timed yet
    clock.end(0.1)                                      # T = 10, A = 10 · 10 = 100
    assert clock.begin(sched((1, 49))) == pytest.approx(0.1)
    clock.end(0.01)                                     # T = 1, A = 1 · 50 = 50
    assert StepClock.work(sched((16, 4), (4, 0))) == (20, 16 * 20 + 4 * 4)
    assert clock.begin(sched((20, 0))) == pytest.approx(0.2)   # A = 400
    assert clock.begin(sched((1, 10))) == pytest.approx(0.01)


class FakeLoop:
    def __init__(self):
        self.seconds_since_progress, self.step_expected_s = 0.0, None


def test_a_step_is_a_stall_only_past_its_expected_length():
    """``stall_timeout_s`` = 1 s: with no step expectation, 1.5 s without progress is a stall;
    in a step expected to take 1 s, 3 s is not (the allowance is STEP_SLACK × 1 s), 5 s is."""
    assert STEP_SLACK == 4.0
    loop = FakeLoop()
    watch = StallWatch(loop, 1.0)
    loop.seconds_since_progress = 1.5
    watch.look(watch.tick_s)
    assert watch.stalled
    loop.step_expected_s = 1.0
    for idle_s, stalled in ((3.0, False), (5.0, True)):
        loop.seconds_since_progress = idle_s
        watch.look(watch.tick_s)
        assert watch.stalled is stalled, idle_s
    assert "no progress for 5.0 s, in a step expected to take 1 s" in watch.message


def test_a_slow_step_that_should_be_slow_is_no_stall():
    """Steps sleep in proportion to the pairs they read (a long context is slow). After a few
    short requests have been timed, a 200-token prompt's one step lasts 1.5 s, three times
    ``stall_timeout_s``: ``/health`` stays 200 throughout, the long request and one sent
    meanwhile are both answered (not 503)."""
    engine = build_engine("tiny", num_threads=1, num_blocks=32, max_num_seqs=4,
                          max_num_batched_tokens=256, max_prefill_chunk_tokens=256)
    long_step_s = 1.5
    added, _ = counted(engine, lambda T, A: long_step_s if T >= 200 else 1e-5 * A)
    app = create_app(engine, engine.tokenizer, model_name=MODEL, stall_timeout_s=0.5)
    with ServerThread(app) as srv:
        warm = []
        complete(srv.base_url, "hello", warm, max_tokens=4)   # steps timed: the history
        results, statuses = [], []
        long = threading.Thread(target=complete, args=(srv.base_url, "x" * 200, results))
        long.start()
        wait_until(lambda: 200 in added, "the long prompt added")
        t0 = time.monotonic()
        meanwhile = threading.Thread(target=complete, args=(srv.base_url, "ab", results))
        meanwhile.start()
        while long.is_alive() and time.monotonic() - t0 < 30:
            statuses.append(httpx.get(f"{srv.base_url}/health", timeout=10).status_code)
            time.sleep(0.05)
        long.join(30)
        meanwhile.join(30)
    assert warm[0].status_code == 200
    assert time.monotonic() - t0 >= long_step_s        # the step was as slow as asked
    assert [r.status_code for r in results] == [200, 200], [r.text for r in results]
    assert statuses and set(statuses) == {200}, statuses
