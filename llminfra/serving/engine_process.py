"""The engine in a process of its own: the web layer and the engine no longer share one GIL.

:class:`~llminfra.serving.async_engine.AsyncEngine` runs the engine in a thread of the server's
process. Python lets one thread run Python code at a time, and the tiny model's steps are
mostly Python (hundreds of small torch calls, the scheduler, the sampler), so every token the
web layer turns into a server-sent event is time the engine waits: the whole server then runs
on about one core and serves fewer tokens/s than the same engine called in process (the
recorded ``bench serving`` run, ``llminfra/data/bench_serving_cpu.json``, has the server over
the engine called in process with the engine in a thread, ``http_vs_engine_thread``, and in a
process of its own, ``http_vs_engine``). vLLM made the same move for the same reason: its V1 engine runs the
scheduler and the model in an *engine-core* process, and the API server (HTTP, detokenising,
streaming) in another, talking over ZeroMQ (vLLM blog, "vLLM V1: A Major Upgrade to vLLM's Core
Architecture", 27 January 2025, "Optimized execution loop & API server").

Here the two processes talk over two ``multiprocessing`` pipes, carrying the commands and
events of :mod:`~llminfra.serving.engine_core` (the same tuples the thread version queues) plus
two of the process's own: ``("ready", stats)`` once the engine is built, and
``("dead", error type, message)`` if it cannot be built or crashes. The child runs the one loop,
:func:`~llminfra.serving.engine_core.run_engine_loop`, with an idle heartbeat every
:data:`HEARTBEAT_S` (a stopped engine process sends nothing: what ``/health`` notices).

A reader thread in the web process routes each step's outputs to the per-request queues (the
same :class:`~llminfra.serving.async_engine.EngineLoop` caller side as the thread version). The
engine process is built from a picklable ``factory`` (it is started with ``spawn``: a fork of
a process that already runs threads is unsafe), ignores Ctrl-C (the terminal sends SIGINT to
the whole group; the server decides when the engine stops) and exits when the web process
stops it or goes away (its command pipe closes), so no engine outlives its server.

Taught in chapter 05.
"""

from __future__ import annotations

import logging
import os
import multiprocessing
import signal
import threading
import time
import traceback
from collections.abc import Callable

from llminfra.serving.async_engine import EngineLoop
from llminfra.serving.engine_core import NO_COMMAND, EngineDeadError, run_engine_loop

log = logging.getLogger(__name__)

#: an idle engine process says it is alive at least this often (seconds)
HEARTBEAT_S = 1.0


class EngineProcess(EngineLoop):
    """Runs ``factory()`` (it must return an ``LLMEngine``; picklable, e.g. a module-level
    function or a ``functools.partial`` of one) in a child process.

    ``start()`` returns once the engine is built (``start_timeout_s``); ``stop()`` ends the
    child (terminated if it does not stop within ``timeout_s``). ``env``: environment
    variables the child starts with (read by libraries as they load, before ``factory`` runs).
    """

    def __init__(self, factory: Callable, *, idle_wait_s: float = 0.05,
                 start_timeout_s: float = 120.0, on_finished: Callable | None = None,
                 env: dict[str, str] | None = None):
        if not callable(factory):
            raise ValueError(f"factory must be callable, got {type(factory).__name__}")
        super().__init__(idle_wait_s=idle_wait_s, on_finished=on_finished)
        self.factory, self.start_timeout_s, self.env = factory, start_timeout_s, dict(env or {})
        self._proc = None
        self._commands = self._results = None
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "EngineProcess":
        """Start the engine process and wait until its engine is built (idempotent)."""
        if self._proc is not None:
            return self
        ctx = multiprocessing.get_context("spawn")
        cmd_recv, self._commands = ctx.Pipe(duplex=False)
        self._results, res_send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=engine_main, name="llminfra-engine-core", daemon=True,
                           args=(self.factory, cmd_recv, res_send, self.idle_wait_s))
        saved = {k: os.environ.get(k) for k in self.env}
        try:
            os.environ.update(self.env)        # a spawned child copies this process's environ
            proc.start()
        except BaseException:
            for conn in (cmd_recv, res_send, self._commands, self._results):
                conn.close()
            self._commands = self._results = None
            raise
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self._proc = proc
        cmd_recv.close()
        res_send.close()                 # the child holds the only writer: EOF when it ends
        self.stats = self._wait_ready()
        self._progressed()
        self._reader = threading.Thread(target=self._read, name="llminfra-engine-reader",
                                        daemon=True)
        self._reader.start()
        log.info("engine process %d started", self._proc.pid)
        return self

    def _wait_ready(self) -> dict:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._results.poll(0.1):
                try:
                    msg = self._results.recv()
                except EOFError:
                    break
                if msg[0] == "ready":
                    return msg[1]
                self.stop()
                if msg[1] == "ValueError":   # a bad setting: the caller's error, said plainly
                    raise ValueError(msg[2])
                raise RuntimeError(f"the engine process could not build its engine: "
                                   f"{msg[1]}: {msg[2]}")
            if not self._proc.is_alive():
                break
        code = self._proc.exitcode
        self.stop()
        raise RuntimeError(f"the engine process did not start within {self.start_timeout_s} s "
                           f"(exit code {code})")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the engine process; every open stream gets an :class:`EngineDeadError`."""
        if self._proc is None:
            return
        self._send(None)
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            log.warning("engine process did not stop within %.3g s; terminating", timeout_s)
            self._proc.terminate()
            self._proc.join(timeout_s)
        if self._reader is not None:
            self._reader.join(timeout_s)
        self._close_streams()
        self._fail_pending(EngineDeadError("the engine loop stopped"))
        for conn in (self._commands, self._results):
            conn.close()
        log.info("engine loop stopped (engine process exit code %s)", self._proc.exitcode)
        self._proc = self._reader = None

    @property
    def is_running(self) -> bool:
        return (self._proc is not None and self._proc.is_alive() and self._error is None
                and self._reader is not None and self._reader.is_alive())

    # ------------------------------------------------------------------ web side
    def _send(self, msg) -> None:
        with self._send_lock:            # handlers and stop() may send from different threads
            try:
                self._commands.send(msg)
            except (BrokenPipeError, OSError) as e:
                if msg is not None:
                    raise EngineDeadError(f"the engine process is gone ({e!r})") from None

    def _read(self) -> None:
        """The reader thread: hand every event of the engine process to the caller side, in
        order."""
        try:
            while True:
                msg = self._results.recv()
                if msg[0] == "dead":
                    self._progressed()
                    self._error = RuntimeError(f"the engine process failed: {msg[2]}")
                    log.error("%s", self._error)
                    break
                self._on_event(msg)
        except (EOFError, OSError) as e:
            if self._error is None:
                self._error = EngineDeadError(f"the engine process ended ({e!r})")
        finally:
            self._close_streams()
            self._fail_pending(EngineDeadError(f"the engine loop stopped ({self._error!r})"))


# ---------------------------------------------------------------------- engine process
def engine_main(factory: Callable, commands, results, idle_wait_s: float) -> None:
    """The engine process: build the engine, then drain commands → step → send, until told
    to stop or the web process goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        engine = factory()
    except BaseException as e:  # noqa: BLE001 - reported to the web process
        results.send(("dead", type(e).__name__, str(e)))
        return
    results.send(("ready", dict(engine.stats())))
    def next_command(wait_s: float):
        return commands.recv() if commands.poll(wait_s) else NO_COMMAND

    try:
        run_engine_loop(engine, next_command, results.send, idle_wait_s=idle_wait_s,
                        heartbeat_s=HEARTBEAT_S)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return                           # the web process is gone: nobody to serve
    except BaseException:  # noqa: BLE001 - reported to the web process
        results.send(("dead", "crash", traceback.format_exc(limit=8)))
