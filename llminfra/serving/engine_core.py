"""The engine-core loop: one function, whichever way the engine runs (a thread or a process),
and the one judge of whether it still moves (:class:`StallWatch`).

The web layer never calls the engine: it sends *commands* and receives *events*, both plain
tuples (so the same messages cross a ``queue.Queue`` between threads or a pipe between
processes — the shape of vLLM V1's engine core and its client, Kwon et al. 2023,
arXiv:2309.06180, and the vLLM V1 blog of 27 January 2025):

commands, web → engine
    ``("add", request_id, prompt, params)``, ``("abort", request_id)``, ``None`` (stop).
events, engine → web
    ``("accepted", request_id)``; ``("refused", request_id, message, param)`` (``param``: the
    field at fault, or None); ``("begin", expected_s)`` as a step's forward pass starts, with
    how long it should take (:class:`StepClock`; None before any step has been timed);
    ``("step", outputs, stats)`` once per step with every ``RequestOutput`` of the step;
    ``("stats", stats)`` after commands and, while idle, every ``heartbeat_s`` — every event is
    a sign of progress (what ``/health`` reads).

:func:`run_engine_loop` is the loop: drain commands (wait up to ``idle_wait_s`` for one only
when no request is left to run) → if work is left, ``step()`` and deliver the outputs → else a
heartbeat. The transports (:class:`~llminfra.serving.async_engine.AsyncEngine`,
:class:`~llminfra.serving.engine_process.EngineProcess`) only move the tuples.

The loop's liveness is judged here too, by progress, not by how long a step takes. Every event
counts as progress (:attr:`~llminfra.serving.async_engine.EngineLoop.seconds_since_progress`;
an idle engine process says it is alive every
:data:`~llminfra.serving.engine_process.HEARTBEAT_S`), and a step in progress has the time its
work should take (:class:`StepClock`): a chunk of a prompt near the real model's context can
take longer on one thread than the timeout (``llminfra/data/serve_prefill_chunk_cpu.json`` has
such steps), and that is no stall. When no event has come for ``stall_timeout_s``, nor for
:data:`STEP_SLACK` times the expected length of the step in progress — a step that does not
end, an engine process stopped (SIGSTOP) or swapped out — the engine is *stalled*
(:class:`StallWatch`): ``/health`` answers 503, every request in flight fails with a 503 that
says so (a client would otherwise wait as
long as its own timeout, 75 s for some), the engine is asked to abort them, and new requests
are refused until it moves again. A load balancer reading ``/health`` takes the server out of
rotation meanwhile. A loop that stopped altogether raises :class:`EngineDeadError`.
Taught in chapter 05.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

#: what ``next_command`` returns when no command came within its wait
NO_COMMAND = object()
#: a watchdog tick this much longer than asked (seconds) means the server process itself was
#: stopped; a busy event loop is late by milliseconds
OVERSLEEP_S = 2.0
#: a step in progress is stalled only after this many times the time it should take
#: (:class:`StepClock`), and never before ``stall_timeout_s``
STEP_SLACK = 4.0
#: steps the expected length of the next one is judged from
STEP_HISTORY = 32


class EngineDeadError(RuntimeError):
    """The engine loop stopped (shut down, crashed or stalled); no request can be served."""


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


class StepClock:
    """How long a step should take, judged from the steps before it.

    A step's *work* is two counts: its new tokens ``T = Σ n_i`` (what every weight matrix
    multiplies) and the token–context pairs its attention reads ``A = Σ n_i · (c_i + n_i)``
    (sequence ``i`` brings ``n_i`` tokens after ``c_i`` in the cache). Whatever a step costs —
    a fixed part, a part per token, a part per pair, all ≥ 0 — a step that does ``r`` times
    the work of an earlier one (``r`` the larger of the two ratios, at least 1) takes at most
    ``r`` times as long. So :meth:`begin` expects ``min_k t_k · max(1, T/T_k, A/A_k)`` over
    the last :data:`STEP_HISTORY` timed steps ``k``: an upper bound, no fit, no model of the
    machine. (A chunk of a long prompt after chunks of the same prompt: near exact; after
    decodes only: loose, at worst the stall is noticed later.) The step's rows are what the
    runner's forward pass gets (:class:`AnnouncingRunner`)."""

    def __init__(self, history: int = STEP_HISTORY):
        self.steps: deque[tuple[int, int, float]] = deque(maxlen=history)   # (T, A, seconds)
        self._work: tuple[int, int] | None = None

    @staticmethod
    def work(scheduled, padding=()) -> tuple[int, int]:
        """``(T, A)`` of a step: its ``(sequence, new tokens)`` pairs before they run, and its
        padding rows (one token each over its context)."""
        rows = [(n, s.num_computed_tokens) for s, n in scheduled]
        rows += [(1, s.num_tokens) for s in padding]
        return sum(n for n, _ in rows), sum(n * (c + n) for n, c in rows)

    def begin(self, scheduled, padding=()) -> float | None:
        """A step starts: its expected seconds (None before any step has been timed)."""
        T, A = self._work = self.work(scheduled, padding)
        if not self.steps:
            return None
        return min(t * max(1.0, T / max(Tk, 1), A / max(Ak, 1)) for Tk, Ak, t in self.steps)

    def end(self, seconds: float) -> None:
        """The step that :meth:`begin` announced took ``seconds`` (a step with nothing
        scheduled announced none, and is not kept)."""
        if self._work is not None:
            self.steps.append((*self._work, seconds))
        self._work = None


class AnnouncingRunner:
    """An engine's runner (:mod:`llminfra.engine.model_runner`) whose forward pass first
    calls ``begin(scheduled, padding)``: how the engine loop learns what a step holds as it
    starts. Everything else, read or written, is the runner's own."""

    def __init__(self, runner, begin: Callable):
        object.__setattr__(self, "runner", runner)
        object.__setattr__(self, "begin", begin)

    def forward(self, scheduled, padding, caught):
        self.begin(scheduled, padding)
        return self.runner.forward(scheduled, padding, caught)

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def __setattr__(self, name, value):
        setattr(self.runner, name, value)


def announce_steps(engine, deliver: Callable[[tuple], None]) -> StepClock:
    """From now on each step of ``engine`` starts with a ``("begin", expected_s)`` event
    (:class:`StepClock`, :class:`AnnouncingRunner`); returns the clock to time the steps with.
    An engine without a ``runner`` announces nothing (its steps get the plain timeout)."""
    clock = StepClock()
    runner = getattr(engine, "runner", None)
    if runner is not None:
        while isinstance(runner, AnnouncingRunner):     # a loop started again on it
            runner = runner.runner
        engine.runner = AnnouncingRunner(
            runner, lambda scheduled, padding: deliver(("begin", clock.begin(scheduled,
                                                                             padding))))
    return clock


def run_engine_loop(engine, next_command: Callable[[float], object],
                    deliver: Callable[[tuple], None], *, idle_wait_s: float,
                    heartbeat_s: float) -> None:
    """Serve ``engine`` until a ``None`` command: commands first, then one step, repeat.

    ``next_command(wait_s)`` returns the next command, waiting up to ``wait_s`` seconds (0:
    do not wait), or :data:`NO_COMMAND`; ``deliver(event)`` hands an event to the web side.
    Each step's forward pass is announced with its expected length (a ``begin`` event,
    :func:`announce_steps`). While idle, a ``stats`` event
    goes out at least every ``heartbeat_s`` seconds (0: after every idle wait). Exceptions
    from the engine propagate: the transport reports them.
    """
    clock = announce_steps(engine, deliver)
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
            started = time.monotonic()
            outputs = engine.step()
            clock.end(time.monotonic() - started)
            deliver(("step", outputs, dict(engine.stats())))
        elif applied or time.monotonic() - last_sent >= heartbeat_s:
            deliver(("stats", dict(engine.stats())))      # also the idle heartbeat
        else:
            continue
        last_sent = time.monotonic()


def stall_message(idle_s: float, expected_s: float | None = None) -> str:
    """What ``/health`` and a failed request say of a stalled engine (``expected_s``: how long
    the step in progress should take, if known)."""
    step = "" if expected_s is None else f", in a step expected to take {expected_s:.3g} s"
    return (f"the engine loop has made no progress for {idle_s:.1f} s{step} (a step that does "
            f"not end, or a stopped engine process)")


class StallWatch:
    """The one judge of a stall, for ``/health``, new requests and the requests in flight
    alike: :meth:`run` looks at the engine loop (an
    :class:`~llminfra.serving.async_engine.EngineLoop`) every ``min(1 s, stall_timeout_s / 4)``
    and keeps :attr:`idle_s`, the engine's time without progress at that look, less any time
    this process itself was stopped (below); :attr:`stalled` once it passes
    :attr:`allowed_s` — ``stall_timeout_s``, or :data:`STEP_SLACK` times the expected length
    of the step in progress where that is longer (the engine's ``begin`` event,
    :class:`StepClock`): a long step that should be long is progress, not a stall, and no
    client is refused for it — when the requests in flight are failed
    (:meth:`~llminfra.serving.async_engine.EngineLoop.fail_in_flight`) and their aborts sent
    from a worker thread (a stopped engine process may not read them for a while).

    A look that comes more than :data:`OVERSLEEP_S` late means this process was stopped as
    well (the whole server SIGSTOPped, as ``make compare-engines`` pauses the servers it is
    not measuring, or a suspended laptop): the engine could not be seen to move then, so that
    time is left out until it next moves, and it gets its full ``stall_timeout_s`` once both
    run again. The verdict is the last look's, at most one tick old: a request that comes in
    the moment a stopped server resumes is judged by the look before the stop, not by a clock
    that ran while nothing could answer it."""

    def __init__(self, loop, stall_timeout_s: float):
        self.loop, self.stall_timeout_s = loop, stall_timeout_s
        self.tick_s = min(1.0, stall_timeout_s / 4)
        #: the engine's seconds without progress at the last look, stopped time left out
        self.idle_s = 0.0
        #: the expected seconds of the step in progress at the last look (None: no step, or
        #: none timed yet)
        self.expected_s: float | None = None
        self._excused_s, self._last_raw_s = 0.0, None

    @property
    def allowed_s(self) -> float:
        """Seconds without progress that are not yet a stall."""
        if self.expected_s is None:
            return self.stall_timeout_s
        return max(self.stall_timeout_s, STEP_SLACK * self.expected_s)

    @property
    def stalled(self) -> bool:
        return self.idle_s > self.allowed_s

    @property
    def message(self) -> str:
        """What a stalled engine is said to be (:func:`stall_message`)."""
        return stall_message(self.idle_s, self.expected_s)

    def look(self, elapsed_s: float) -> float:
        """Update :attr:`idle_s` after ``elapsed_s`` seconds since the last look."""
        raw_s = self.loop.seconds_since_progress
        self.expected_s = getattr(self.loop, "step_expected_s", None)
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
                ids = self.loop.fail_in_flight(EngineDeadError(self.message))
                if ids:
                    log.warning("engine stalled for %.1f s: failed %d requests in flight",
                                self.idle_s, len(ids))
                    await asyncio.to_thread(self.loop.abort_all, ids)
