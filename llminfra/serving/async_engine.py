"""The engine's loop: one owner calls the :class:`LLMEngine`; the web layer only queues work
into it and reads results out of per-request queues.

Why a loop of its own: ``engine.step()`` runs the model and may take milliseconds; run inside
the event loop it would stall every HTTP connection for that long. So the rule of vLLM's
``AsyncLLMEngine`` (Kwon et al., 2023, arXiv:2309.06180, §5, describes its FastAPI front end)
is kept in its simplest form:

* exactly one thread calls the engine (``add_request``, ``step``, ``abort_request``,
  ``stats``) — never two;
* callers queue commands to it and get their outputs on an ``asyncio.Queue`` fed with
  ``loop.call_soon_threadsafe`` — one call per step for all of the step's outputs;
* after every step the loop publishes a fresh ``stats()`` snapshot and observes the finished
  requests' TTFT / time per output token (``on_finished``), so ``/metrics`` never waits for it;
* every turn of the loop (a step, or an idle wait of at most ``idle_wait_s``) is a sign of
  progress: :attr:`EngineLoop.seconds_since_progress` grows only while a step does not end or
  the engine's process is stopped — what ``/health`` reads to tell a wedged engine from an idle
  one, beside :attr:`EngineLoop.step_expected_s`, how long the step in progress should take.

:class:`EngineLoop` is the caller side; the engine side is one function,
:func:`~llminfra.serving.engine_core.run_engine_loop`, with one message format (commands and
events as tuples), behind two transports: :class:`AsyncEngine` runs it in a thread of this
process, :class:`~llminfra.serving.engine_process.EngineProcess` in a process of its own. An
``abort`` of a running request frees its KV blocks at the next turn of the loop, which is how a
client that disconnects mid-stream gives memory back.

Taught in chapter 05.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass

from llminfra.engine.sampling_params import InvalidParameter
from llminfra.serving.engine_core import NO_COMMAND, EngineDeadError, run_engine_loop

log = logging.getLogger(__name__)


@dataclass
class _Add:
    prompt: object
    params: object
    request_id: str
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue
    accepted: Future


class EngineLoop:
    """The caller side of an engine loop, whichever way the engine runs: ``generate`` (an
    async iterator of one request's ``RequestOutput``s), ``abort``, ``stats``, and the
    routing of each step's outputs to the per-request ``asyncio.Queue``s.

    Subclasses run the engine — :class:`AsyncEngine` in a thread of this process,
    :class:`~llminfra.serving.engine_process.EngineProcess` in a process of its own — and
    implement ``start``, ``stop``, ``is_running``, ``_submit`` and ``_send_abort``.
    ``on_finished(output)`` (optional) is called for every finished request (the server
    observes its latency histograms there).
    """

    def __init__(self, *, idle_wait_s: float = 0.05, on_finished: Callable | None = None):
        if not idle_wait_s > 0:
            raise ValueError(f"idle_wait_s must be > 0, got {idle_wait_s}")
        self.idle_wait_s = idle_wait_s
        self.on_finished = on_finished
        self.stats: dict = {}
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()   # streams are touched by callers and the delivering side
        self._pending: dict[str, _Add] = {}
        self._error: BaseException | None = None
        self._last_progress = time.monotonic()
        #: how long the step in progress should take (seconds; its ``begin`` event), None
        #: between steps or before one has been timed
        self.step_expected_s: float | None = None

    # ----------------------------------------------------------- to implement
    def start(self) -> "EngineLoop":
        raise NotImplementedError

    def stop(self, timeout_s: float = 10.0) -> None:
        raise NotImplementedError

    @property
    def is_running(self) -> bool:
        raise NotImplementedError

    def _send(self, msg) -> None:
        """Move one command (:mod:`~llminfra.serving.engine_core`'s format) to the engine;
        ``EngineDeadError`` if it cannot arrive (``None``, stop, never raises)."""
        raise NotImplementedError

    @property
    def seconds_since_progress(self) -> float:
        """Seconds since the engine loop last finished a turn (a step, or an idle wait)."""
        return time.monotonic() - self._last_progress

    def _progressed(self) -> None:
        self._last_progress = time.monotonic()

    # ------------------------------------------------------------------ caller side
    async def generate(self, prompt, params, request_id: str) -> AsyncIterator:
        """Queue one request; once the engine has accepted it, return an async iterator of its
        ``RequestOutput``s (the last one has ``finished``).

        Raises the engine's ``ValueError`` (prompt too long for the context or the pool …)
        here, before any output, so a server can still answer with a 4xx. If the consumer
        stops early (a client disconnected: the iterator is closed or cancelled), the request
        is aborted and its KV blocks are freed.
        """
        if not self.is_running:
            raise EngineDeadError(f"the engine loop is not running ({self._error!r})")
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()
        accepted: Future = Future()
        self._submit(_Add(prompt, params, request_id, loop, outputs, accepted))
        waiting = asyncio.wrap_future(accepted)
        try:
            while not waiting.done():  # bounded: each turn resolves or finds the loop dead
                await asyncio.wait({waiting}, timeout=1.0)
                if not waiting.done() and not self.is_running:
                    waiting.cancel()
                    raise EngineDeadError(f"the engine loop stopped ({self._error!r})")
            waiting.result()  # re-raises the engine's ValueError
        except BaseException:  # refused, engine gone, or the caller cancelled: keep nothing
            with self._lock:
                self._pending.pop(request_id, None)
            self._send_abort(request_id)  # forgets the stream; aborts what the engine took
            raise
        return self._outputs(request_id, outputs)

    async def _outputs(self, request_id: str, outputs: asyncio.Queue) -> AsyncIterator:
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Ask the engine to abort ``request_id`` (no-op if it already finished)."""
        self._send_abort(request_id)

    def _submit(self, cmd: "_Add") -> None:
        """Register the request's stream (before the engine can produce its first output),
        then send the ``add`` command; ``cmd.accepted`` resolves on the engine's answer. A
        command that cannot be sent (the engine gone, a request that does not pickle) leaves
        nothing registered: ``cmd.accepted`` gets the error."""
        with self._lock:
            self._streams[cmd.request_id] = (cmd.loop, cmd.outputs)
            self._pending[cmd.request_id] = cmd
        try:
            self._send(("add", cmd.request_id, cmd.prompt, cmd.params))
        except Exception as e:  # noqa: BLE001 - e.g. a request that cannot be pickled
            self._forget(cmd.request_id)
            with self._lock:
                self._pending.pop(cmd.request_id, None)
            cmd.accepted.set_exception(e if isinstance(e, EngineDeadError) else ValueError(
                f"the request cannot be sent to the engine: {type(e).__name__}: "
                f"{str(e)[:200]}"))

    def _send_abort(self, request_id: str) -> None:
        if self._forget(request_id):
            try:
                self._send(("abort", request_id))
            except EngineDeadError:
                pass                     # nothing left to abort

    # ------------------------------------------------------------- delivering side
    def _on_event(self, msg: tuple) -> None:
        """Apply one event of the engine loop (:mod:`~llminfra.serving.engine_core`), in
        order: every event is a sign of progress."""
        self._progressed()
        kind = msg[0]
        self.step_expected_s = msg[1] if kind == "begin" else None
        if kind == "step":
            self.stats = msg[2]
            self._deliver(msg[1])
        elif kind == "stats":
            self.stats = msg[1]
        elif kind in ("accepted", "refused"):
            with self._lock:
                cmd = self._pending.pop(msg[1], None)
            if cmd is None:
                return
            if kind == "accepted":
                cmd.accepted.set_result(msg[1])
            else:
                self._forget(msg[1])
                cmd.accepted.set_exception(InvalidParameter(msg[3], msg[2]) if msg[3]
                                           else ValueError(msg[2]))

    def _fail_pending(self, err: BaseException) -> None:
        """Every request still waiting for its ``accepted`` gets ``err``."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for cmd in pending:
            if not cmd.accepted.done():
                cmd.accepted.set_exception(err)

    def fail_in_flight(self, err: BaseException) -> list[str]:
        """Fail every request in flight now — open streams and requests still waiting to be
        accepted — with ``err`` (the server does this once the engine is declared stalled, so
        no client waits on an engine that may never move again); returns their ids. The
        engine is asked to abort them by :meth:`abort_all` (which may block on a stopped
        engine process: call it from a worker thread)."""
        with self._lock:
            streams, self._streams = self._streams, {}
            pending, self._pending = list(self._pending.values()), {}
        for loop, q in streams.values():
            try:
                loop.call_soon_threadsafe(q.put_nowait, err)
            except RuntimeError:         # the caller's event loop is closed
                pass
        for cmd in pending:
            if not cmd.accepted.done():
                cmd.accepted.set_exception(err)
        return list(streams) + [cmd.request_id for cmd in pending]

    def abort_all(self, request_ids) -> None:
        """Send the engine an ``abort`` for each id (no-op for ids it no longer has)."""
        for rid in request_ids:
            try:
                self._send(("abort", rid))
            except EngineDeadError:
                return                   # nothing left to abort

    def _forget(self, request_id: str) -> bool:
        with self._lock:
            return self._streams.pop(request_id, None) is not None

    def _deliver(self, outs) -> None:
        """Hand a step's outputs to their callers: one ``call_soon_threadsafe`` per event loop
        per step, not one per request (each call wakes the loop through its self-pipe)."""
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outs:
            if out.finished and self.on_finished is not None:
                self.on_finished(out)
            with self._lock:
                target = (self._streams.pop(out.request_id, None) if out.finished
                          else self._streams.get(out.request_id))
            if target is not None:
                loop, q = target
                batches.setdefault(loop, []).append((q, out))
        for loop, items in batches.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the caller's event loop is closed
                pass

    def _close_streams(self) -> None:
        """Every open stream gets an :class:`EngineDeadError`."""
        err = EngineDeadError(f"the engine loop stopped ({self._error!r})")
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for loop, q in streams:
            try:
                loop.call_soon_threadsafe(q.put_nowait, err)
            except RuntimeError:
                pass


class AsyncEngine(EngineLoop):
    """Runs ``engine`` in one background thread of this process: the transport is a
    ``queue.Queue`` of commands one way and direct calls of the event handler the other.

    Simple, and enough for a notebook or a test: but the thread shares the interpreter lock
    with the web layer, so every token the server streams is Python work the engine waits for
    (:class:`~llminfra.serving.engine_process.EngineProcess` removes that).
    """

    def __init__(self, engine, *, idle_wait_s: float = 0.05,
                 on_finished: Callable | None = None):
        super().__init__(idle_wait_s=idle_wait_s, on_finished=on_finished)
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stats = dict(engine.stats())

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "AsyncEngine":
        """Start the loop thread (idempotent)."""
        if self._thread is None:
            self._progressed()
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="llminfra-engine",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; every open stream gets an :class:`EngineDeadError`."""
        self._stopping = True
        self._commands.put(None)         # the loop returns when it reads it
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("engine thread did not stop within %.3g s", timeout_s)
            else:
                log.info("engine loop stopped")
            self._thread = None

    @property
    def is_running(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and self._error is None
                and not self._stopping)

    def _send(self, msg) -> None:
        if msg is not None and not self.is_running:
            raise EngineDeadError(f"the engine loop is not running ({self._error!r})")
        self._commands.put(msg)

    # ------------------------------------------------------------------ engine thread
    def _next_command(self, wait_s: float):
        try:
            return (self._commands.get(timeout=wait_s) if wait_s > 0
                    else self._commands.get_nowait())
        except queue.Empty:
            return NO_COMMAND

    def _run(self) -> None:
        try:
            run_engine_loop(self.engine, self._next_command, self._on_event,
                            idle_wait_s=self.idle_wait_s, heartbeat_s=0.0)
        except BaseException as e:  # noqa: BLE001 - reported to every waiting caller
            log.exception("engine loop crashed")
            self._error = e
        finally:
            err = EngineDeadError(f"the engine loop stopped ({self._error!r})")
            self._close_streams()
            self._fail_pending(err)


def _put_all(items) -> None:
    """In the caller's event loop: put each output on its request's queue."""
    for q, out in items:
        q.put_nowait(out)
