"""The engine-core loop: one function, whichever way the engine runs (a thread or a process).

The web layer never calls the engine: it sends *commands* and receives *events*, both plain
tuples (so the same messages cross a ``queue.Queue`` between threads or a pipe between
processes — the shape of vLLM V1's engine core and its client, Kwon et al. 2023,
arXiv:2309.06180, and the vLLM V1 blog of 27 January 2025):

commands, web → engine
    ``("add", request_id, prompt, params)``, ``("abort", request_id)``, ``None`` (stop).
events, engine → web
    ``("accepted", request_id)``; ``("refused", request_id, message, param)`` (``param``: the
    field at fault, or None); ``("step", outputs, stats)`` once per step with every
    ``RequestOutput`` of the step; ``("stats", stats)`` after commands and, while idle, every
    ``heartbeat_s`` — every event is a sign of progress (what ``/health`` reads).

:func:`run_engine_loop` is the loop: drain commands (wait up to ``idle_wait_s`` for one only
when no request is left to run) → if work is left, ``step()`` and deliver the outputs → else a
heartbeat. The transports (:class:`~llminfra.serving.async_engine.AsyncEngine`,
:class:`~llminfra.serving.engine_process.EngineProcess`) only move the tuples.
Taught in chapter 05.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: what ``next_command`` returns when no command came within its wait
NO_COMMAND = object()


def apply_command(engine, cmd: tuple, deliver: Callable[[tuple], None]) -> None:
    """Apply one ``add`` / ``abort`` command to ``engine``; an ``add`` is answered with an
    ``accepted`` or ``refused`` event (a ``ValueError`` from ``add_request`` — the prompt is
    too long, a parameter is out of range — refuses that request only)."""
    kind, request_id = cmd[0], cmd[1]
    if kind == "add":
        try:
            engine.add_request(cmd[2], cmd[3], request_id=request_id)
        except (ValueError, TypeError, KeyError) as e:
            deliver(("refused", request_id, str(e), getattr(e, "param", None)))
            return
        deliver(("accepted", request_id))
    elif kind == "abort":
        engine.abort_request(request_id)
    else:
        raise ValueError(f"unknown engine command {kind!r} (allowed: 'add', 'abort', None)")


def run_engine_loop(engine, next_command: Callable[[float], object],
                    deliver: Callable[[tuple], None], *, idle_wait_s: float,
                    heartbeat_s: float) -> None:
    """Serve ``engine`` until a ``None`` command: commands first, then one step, repeat.

    ``next_command(wait_s)`` returns the next command, waiting up to ``wait_s`` seconds (0:
    do not wait), or :data:`NO_COMMAND`; ``deliver(event)`` hands an event to the web side.
    While idle, a ``stats`` event goes out at least every ``heartbeat_s`` seconds (0: after
    every idle wait). Exceptions from the engine propagate: the transport reports them.
    """
    last_sent = time.monotonic()
    while True:
        wait = 0.0 if engine.has_unfinished_requests() else idle_wait_s
        applied = False
        while (cmd := next_command(wait)) is not NO_COMMAND:
            if cmd is None:
                return
            apply_command(engine, cmd, deliver)
            applied, wait = True, 0.0
        if engine.has_unfinished_requests():
            deliver(("step", engine.step(), dict(engine.stats())))
        elif applied or time.monotonic() - last_sent >= heartbeat_s:
            deliver(("stats", dict(engine.stats())))      # also the idle heartbeat
        else:
            continue
        last_sent = time.monotonic()
