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


async def watch_for_stalls(loop: EngineLoop, stall_timeout_s: float) -> None:
    """Run until cancelled: every ``min(1 s, stall_timeout_s / 4)``, if ``loop`` has made no
    progress for ``stall_timeout_s``, fail its requests in flight
    (:meth:`~llminfra.serving.async_engine.EngineLoop.fail_in_flight`) and send their aborts
    from a worker thread (a stopped engine process may not read them for a while). A tick
    that comes more than :data:`OVERSLEEP_S` late means this process was stopped as well (the
    whole server SIGSTOPped, as ``make compare-engines`` pauses the servers it is not
    measuring, or a suspended laptop): that time is left out of the engine's idle time until
    it next moves, so it gets its full ``stall_timeout_s`` once both run again. (``/health``
    may say 503 for the second until an idle engine process's next heartbeat.)"""
    tick_s = min(1.0, stall_timeout_s / 4)
    excused_s, last_idle_s = 0.0, loop.seconds_since_progress
    while True:
        before = time.monotonic()
        await asyncio.sleep(tick_s)
        elapsed_s = time.monotonic() - before
        idle_s = loop.seconds_since_progress
        if idle_s < last_idle_s + elapsed_s - 1e-3:       # the engine moved since the last tick
            excused_s = 0.0
        last_idle_s = idle_s
        # a tick far later than asked: this process was stopped too (the whole server
        # SIGSTOPped, a suspended machine), and what it missed is not the engine's stall
        if elapsed_s - tick_s > OVERSLEEP_S:
            excused_s += elapsed_s - tick_s
        idle_s = max(0.0, idle_s - excused_s)
        if idle_s > stall_timeout_s:
            ids = loop.fail_in_flight(EngineDeadError(stall_message(idle_s)))
            if ids:
                log.warning("engine stalled for %.1f s: failed %d requests in flight", idle_s,
                            len(ids))
                await asyncio.to_thread(loop.abort_all, ids)
