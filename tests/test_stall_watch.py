"""The stall watchdog (llminfra.serving.engine_core) on a clock the test moves: an engine that
does not move past the timeout has its requests failed; time the server process itself was
stopped (the whole server SIGSTOPped, then SIGCONT) is not counted as the engine's stall, and
a request that arrives the moment it resumes is judged by the last look, not refused."""

from __future__ import annotations

import asyncio

import pytest

from llminfra.serving import engine_core


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class FakeLoop:
    """What the watchdog reads and calls of an EngineLoop, on ``clock``."""

    def __init__(self, clock):
        self.clock, self._last_progress, self.failed = clock, clock(), []

    @property
    def seconds_since_progress(self):
        return self.clock() - self._last_progress

    def fail_in_flight(self, exc):
        self.failed.append(str(exc))
        return []


def _run(monkeypatch, gaps: list[float], timeout_s: float = 30.0) -> FakeLoop:
    """Run the watchdog for len(gaps) ticks, each tick's sleep taking ``gap`` seconds."""
    clock = Clock()
    monkeypatch.setattr(engine_core.time, "monotonic", clock)
    loop = FakeLoop(clock)
    ticks = iter(gaps)

    async def sleep(_):
        try:
            clock.now += next(ticks)
        except StopIteration:
            raise asyncio.CancelledError from None

    monkeypatch.setattr(engine_core.asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(engine_core.StallWatch(loop, timeout_s).run())
    return loop


def test_an_engine_that_does_not_move_is_failed_after_the_timeout(monkeypatch):
    loop = _run(monkeypatch, [1.0] * 29)
    assert loop.failed == []
    loop = _run(monkeypatch, [1.0] * 31)
    assert loop.failed and "no progress for 31.0 s" in loop.failed[0]


def test_time_the_server_itself_was_stopped_is_not_the_engines_stall(monkeypatch):
    # stopped for 100 s between two ticks, then running again: not a stall
    loop = _run(monkeypatch, [1.0, 101.0, 1.0, 1.0])
    assert loop.failed == []
    # and the engine still has to move once both run: 30 s of it after the stop are a stall
    loop = _run(monkeypatch, [1.0, 101.0] + [1.0] * 28)
    assert loop.failed == []
    loop = _run(monkeypatch, [1.0, 101.0] + [1.0] * 29)
    assert loop.failed and "no progress for 31.0 s" in loop.failed[0]


def test_progress_after_a_stop_ends_the_excuse(monkeypatch):
    """After the engine moves, a later stall is counted in full."""
    clock = Clock()
    monkeypatch.setattr(engine_core.time, "monotonic", clock)
    loop = FakeLoop(clock)
    gaps = iter([1.0, 101.0, 1.0] + [1.0] * 31)

    async def sleep(_):
        try:
            clock.now += next(gaps)
        except StopIteration:
            raise asyncio.CancelledError from None
        if clock.now == 1103.0:               # the engine moves after the stop
            loop._last_progress = clock.now

    monkeypatch.setattr(engine_core.asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(engine_core.StallWatch(loop, 30.0).run())
    assert loop.failed and "no progress for 31.0 s" in loop.failed[0]


def test_the_verdict_is_the_last_looks_so_a_resumed_server_admits_at_once(monkeypatch):
    """/health and new requests read ``stalled``: right after SIGCONT, before the watchdog's
    next look, the engine's raw idle time includes the stop, the verdict does not; the look
    then excuses the stop."""
    clock = Clock()
    monkeypatch.setattr(engine_core.time, "monotonic", clock)
    loop = FakeLoop(clock)
    watch = engine_core.StallWatch(loop, 30.0)
    clock.now += 1.0
    assert watch.look(1.0) == 1.0 and not watch.stalled
    clock.now += 60.0                                        # stopped, then resumed
    assert loop.seconds_since_progress == 61.0 and not watch.stalled
    assert watch.look(60.0) == pytest.approx(2.0) and not watch.stalled
