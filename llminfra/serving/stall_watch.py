"""A stalled engine: how the server tells one, and what it does about it.

The engine loop counts every turn (a step, or an idle wait; an idle engine process also says it
is alive every :data:`~llminfra.serving.engine_process.HEARTBEAT_S`) as progress
(:attr:`~llminfra.serving.async_engine.EngineLoop.seconds_since_progress`). When none has come
for ``stall_timeout_s`` — a step that does not end, an engine process stopped (SIGSTOP) or
swapped out — the engine is *stalled*: ``/health`` answers 503, every request in flight fails
with a 503 that says so (a client would otherwise wait as long as its own timeout, 75 s for
some), the engine is asked to abort them, and new requests are refused until it moves again.
A load balancer reading ``/health`` takes the server out of rotation meanwhile. Taught in
chapter 05.
"""

from __future__ import annotations

import asyncio
import logging
import time

from llminfra.serving.async_engine import EngineDeadError, EngineLoop

log = logging.getLogger(__name__)

#: a watchdog tick this much longer than asked (seconds) means the server process itself was
#: stopped; a busy event loop is late by milliseconds
OVERSLEEP_S = 2.0


def stall_message(idle_s: float) -> str:
    """What ``/health`` and a failed request say of a stalled engine."""
    return (f"the engine loop has made no progress for {idle_s:.1f} s (a step that does not "
            f"end, or a stopped engine process)")


class StallWatch:
    """The one judge of a stall, for ``/health``, new requests and the requests in flight
    alike: :meth:`run` looks at the engine loop every ``min(1 s, stall_timeout_s / 4)`` and
    keeps :attr:`idle_s`, the engine's time without progress at that look, less any time this
    process itself was stopped (below); :attr:`stalled` once it passes ``stall_timeout_s``,
    when the requests in flight are failed
    (:meth:`~llminfra.serving.async_engine.EngineLoop.fail_in_flight`) and their aborts sent
    from a worker thread (a stopped engine process may not read them for a while).

    A look that comes more than :data:`OVERSLEEP_S` late means this process was stopped as
    well (the whole server SIGSTOPped, as ``make compare-engines`` pauses the servers it is
    not measuring, or a suspended laptop): the engine could not be seen to move then, so that
    time is left out until it next moves, and it gets its full ``stall_timeout_s`` once both
    run again. The verdict is the last look's, at most one tick old: a request that comes in
    the moment a stopped server resumes is judged by the look before the stop, not by a clock
    that ran while nothing could answer it."""

    def __init__(self, loop: EngineLoop, stall_timeout_s: float):
        self.loop, self.stall_timeout_s = loop, stall_timeout_s
        self.tick_s = min(1.0, stall_timeout_s / 4)
        #: the engine's seconds without progress at the last look, stopped time left out
        self.idle_s = 0.0
        self._excused_s, self._last_raw_s = 0.0, None

    @property
    def stalled(self) -> bool:
        return self.idle_s > self.stall_timeout_s

    def look(self, elapsed_s: float) -> float:
        """Update :attr:`idle_s` after ``elapsed_s`` seconds since the last look."""
        raw_s = self.loop.seconds_since_progress
        if self._last_raw_s is None or raw_s < self._last_raw_s + elapsed_s - 1e-3:
            self._excused_s = 0.0                       # the engine moved since the last look
        self._last_raw_s = raw_s
        if elapsed_s - self.tick_s > OVERSLEEP_S:       # this process was stopped meanwhile
            self._excused_s += elapsed_s - self.tick_s
        self.idle_s = max(0.0, raw_s - self._excused_s)
        return self.idle_s

    async def run(self) -> None:
        """Look every tick until cancelled; fail the requests in flight while stalled."""
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.tick_s)
            self.look(time.monotonic() - before)
            if self.stalled:
                ids = self.loop.fail_in_flight(EngineDeadError(stall_message(self.idle_s)))
                if ids:
                    log.warning("engine stalled for %.1f s: failed %d requests in flight",
                                self.idle_s, len(ids))
                    await asyncio.to_thread(self.loop.abort_all, ids)
