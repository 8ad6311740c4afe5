"""Run the server in the background and stop it cleanly: in a thread of this process
(:class:`ServerThread`, for tests) or as ``python -m llminfra serve`` in a child process
(:class:`ServerProcess`, what the chapter-05 notebook does, as a deployment would).

Both bind to a loopback address only, wait (bounded) until ``GET /health`` answers, and stop
within a timeout: uvicorn handles SIGINT / SIGTERM by finishing open responses (at most
``timeout_graceful_shutdown``) and running the app's shutdown, which stops the engine loop.

Taught in chapter 05.
"""

from __future__ import annotations

import atexit
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

from llminfra.serving.http_limits import UVICORN_LIMITS

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, timeout_s: float, alive=lambda: True) -> None:
    """Poll ``{base_url}/health`` until it answers 200; ``TimeoutError`` after ``timeout_s``,
    ``RuntimeError`` as soon as ``alive()`` turns false (the server died)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"the server at {base_url} exited before it was healthy")
        try:
            if httpx.get(f"{base_url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"no healthy server at {base_url} after {timeout_s} s")


class ServerThread:
    """uvicorn serving ``app`` in a daemon thread on ``127.0.0.1:port`` (a free one by default).

    ``with ServerThread(app) as srv: …srv.base_url…`` — started and healthy inside, stopped
    on exit. uvicorn runs with the bounds ``python -m llminfra serve`` uses
    (:data:`~llminfra.serving.http_limits.UVICORN_LIMITS`); ``uvicorn_options`` override them.
    """

    def __init__(self, app, port: int | None = None, start_timeout_s: float = 30.0,
                 **uvicorn_options):
        import uvicorn

        self.port = port or free_port()
        self.base_url = f"http://{LOOPBACK}:{self.port}"
        config = uvicorn.Config(app, host=LOOPBACK, port=self.port, log_level="warning",
                                timeout_graceful_shutdown=5, lifespan="on",
                                **{**UVICORN_LIMITS, **uvicorn_options})
        self.server = uvicorn.Server(config)
        self.start_timeout_s = start_timeout_s
        self._thread: threading.Thread | None = None

    def start(self) -> "ServerThread":
        self._thread = threading.Thread(target=self.server.run, name="llminfra-uvicorn",
                                        daemon=True)
        self._thread.start()
        wait_healthy(self.base_url, self.start_timeout_s, alive=self._thread.is_alive)
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self.server.force_exit = True
                self._thread.join(timeout_s)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ServerProcess:
    """``python -m llminfra serve --host 127.0.0.1 --port P [extra_args]`` as a child process.

    ``stop()`` sends SIGTERM (SIGINT's twin for uvicorn) and waits. uvicorn shuts down
    gracefully, then re-raises the signal (since 0.29), so the status is ``-SIGTERM`` (or 0).
    If it does not stop within ``timeout_s`` it is killed and
    ``stop`` raises ``TimeoutError`` — no stray process either way.
    """

    def __init__(self, extra_args: list[str] | None = None, port: int | None = None,
                 start_timeout_s: float = 60.0):
        self.port = port or free_port()
        self.base_url = f"http://{LOOPBACK}:{self.port}"
        self.args = [sys.executable, "-m", "llminfra", "serve", "--host", LOOPBACK,
                     "--port", str(self.port), *(extra_args or [])]
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        self._log = tempfile.TemporaryFile(mode="w+")  # a pipe could fill up and block it
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     text=True)
        atexit.register(self.stop)  # the parent exits (a kernel shut down): no stray server
        try:
            wait_healthy(self.base_url, self.start_timeout_s,
                         alive=lambda: self.proc.poll() is None)
        except (TimeoutError, RuntimeError):
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, wait, return the exit status (kill and raise if it hangs)."""
        if self.proc is None:
            return 0
        atexit.unregister(self.stop)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
                raise TimeoutError(f"the server did not stop within {timeout_s} s; killed")
        return self.proc.returncode

    @property
    def output(self) -> str:
        """What the process has printed so far."""
        if self.proc is None:
            return ""
        self._log.seek(0)
        return self._log.read()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
