"""A fleet on loopback: ``llminfra serve`` replicas as processes, and a real router in front.

The tools a team puts in front of a fleet are the vLLM project's router (``pip install
vllm-router``) and SGLang's (``pip install sglang-router``, SGLang Model Gateway): Rust binaries
in PyPI wheels, each started with the replicas' URLs and a policy::

    client ──▶ vllm-router / sglang-router  ──▶ llminfra serve :p1  (engine, KV cache)
               --worker-urls … --policy …   ├──▶ llminfra serve :p2
                                            └──▶ …

:class:`ServeReplicas` starts N replicas of the tiny model on 127.0.0.1, each on a port the OS
picked (:func:`~llminfra.serving.background.free_port`), and waits for each ``/health`` — 200
only once its engine is built, since ``llminfra serve`` builds the engine before it listens
(a router that polls it never sends a request to an engine still loading). :class:`RealRouter`
starts one router over them and waits for its ``/readiness`` to count every replica healthy
(sglang-router registers workers in the background after it listens). What each router asks a
replica, captured with a stand-in worker that logged every request, and from their own logs
(vllm-router 0.1.17, sglang-router 0.3.2, both ``--policy cache_aware``): ``GET /health`` (at
start, then every ``--health-check-interval-secs``), ``GET /v1/models`` (vllm-router forwards
the client's); vllm-router ``POST /v1/completions/render`` or ``/v1/chat/completions/render``
on *every* replica for every request, to match its prefix tree on token ids; sglang-router
``GET /server_info`` and ``/model_info`` (then the older ``/get_…`` names) once per replica
when it registers it. For ``--policy power_of_two`` both binaries name SGLang's ``GET
/get_load`` for their load monitors (sglang-router's runs every 30 s; not exercised here). The
server answers all of them (:class:`~llminfra.serving.server.OpenAIService`). Taught in chapter 11.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import httpx

from llminfra.serving.background import free_port
from llminfra.serving.serve import run_server

#: router name -> (the wheel that installs it, its command line before the common flags)
ROUTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "vllm-router": ("vllm-router", ("vllm-router",)),
    "sglang-router": ("sglang-router", ("sglang-router", "launch")),
}
#: seconds to wait for a replica's engine or a router to be ready
START_TIMEOUT_S = 60.0


def router_executable(name: str) -> str | None:
    """The path of router ``name``'s command (:data:`ROUTERS`), next to this Python first
    (the wheel's script in the same environment), else on ``PATH``; None when not installed."""
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; allowed: {sorted(ROUTERS)}")
    command = ROUTERS[name][1][0]
    beside = Path(sys.executable).with_name(command)
    return str(beside) if beside.exists() else shutil.which(command)


def wait_until(check, timeout_s: float, what: str, proc: subprocess.Popen | None = None,
               log: Path | None = None) -> None:
    """Poll ``check()`` (True when ready) until ``timeout_s``; ``RuntimeError`` naming ``what``
    (and the end of ``log``) on timeout or when ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before it was "
                               f"ready{_tail(log)}")
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready within {timeout_s:g} s{_tail(log)}")


def _tail(log: Path | None, chars: int = 2000) -> str:
    if log is None or not log.exists():
        return ""
    return "; its log ends:\n" + log.read_text(errors="replace")[-chars:]


def _ok(url: str) -> bool:
    return httpx.get(url, timeout=2).status_code == 200


class ServeReplicas:
    """``num_replicas`` ``llminfra serve`` processes of ``model`` on 127.0.0.1 (one torch
    thread each, prefix caching on; ``engine_in_thread``: the engine in a thread of the server
    process, as ``serve --engine-in-thread``, half the processes to start; ``num_blocks``: each
    one's KV pool, default ``build_engine``'s), logs under ``log_dir``. ``start()`` launches
    them all at once and waits for every ``/health``; ``kill(i)`` ends replica ``i`` at once
    (SIGKILL: a crash, not a shutdown); ``stop()`` ends the rest; also a context manager.
    Chapter 11."""

    def __init__(self, num_replicas: int, log_dir: Path, *, model: str = "tiny",
                 prefix_caching: bool = True, threads: int = 1, engine_in_thread: bool = False,
                 num_blocks: int | None = None):
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) \
                or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        self.log_dir, self.model = Path(log_dir), model
        self.prefix_caching, self.threads = prefix_caching, threads
        self.engine_in_thread, self.num_blocks = engine_in_thread, num_blocks
        self.ports = [free_port() for _ in range(num_replicas)]
        self.procs: list[subprocess.Popen] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def log(self, i: int) -> Path:
        return self.log_dir / f"replica{i}.log"

    def start(self) -> "ServeReplicas":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads))
        for i, port in enumerate(self.ports):
            command = [sys.executable, "-m", "llminfra.bench.router_fleet", "--port",
                       str(port), "--model", self.model, "--threads", str(self.threads)]
            if self.prefix_caching:
                command.append("--prefix-caching")
            if self.engine_in_thread:
                command.append("--engine-in-thread")
            if self.num_blocks is not None:
                command += ["--num-blocks", str(self.num_blocks)]
            with open(self.log(i), "wb") as out:
                self.procs.append(subprocess.Popen(command, stdout=out,
                                                   stderr=subprocess.STDOUT, env=env))
        atexit.register(self.stop)          # the caller exits: no stray replica
        try:
            for i, url in enumerate(self.urls):
                wait_until(lambda u=url: _ok(f"{u}/health"), START_TIMEOUT_S,
                           f"replica {i} ({url})", self.procs[i], self.log(i))
        except Exception:
            self.stop()
            raise
        return self

    def kill(self, i: int) -> None:
        """SIGKILL replica ``i`` (its engine process, a child, then sees its pipe close)."""
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(10)

    def stop(self) -> None:
        atexit.unregister(self.stop)
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

    def __enter__(self) -> "ServeReplicas":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __len__(self) -> int:
        return len(self.ports)


class RealRouter:
    """Router ``name`` (:data:`ROUTERS`) over ``worker_urls`` with ``policy`` on 127.0.0.1
    (its own port and Prometheus port, both picked by the OS); ``extra_args`` go on its command
    line. ``start()`` waits until its ``/readiness`` counts every worker healthy. Chapter 11."""

    def __init__(self, name: str, worker_urls: list[str], log_dir: Path, *,
                 policy: str = "cache_aware", extra_args: tuple[str, ...] = ()):
        executable = router_executable(name)
        if executable is None:
            raise FileNotFoundError(f"{name} is not installed: pip install "
                                    f"{ROUTERS[name][0]}")
        self.name, self.worker_urls, self.policy = name, list(worker_urls), policy
        self.port, self.prometheus_port = free_port(), free_port()
        self.log_path = Path(log_dir) / f"{name}-{policy}.log"
        self.command = [executable, *ROUTERS[name][1][1:], "--host", "127.0.0.1", "--port",
                        str(self.port), "--worker-urls", *self.worker_urls, "--policy", policy,
                        "--prometheus-host", "127.0.0.1", "--prometheus-port",
                        str(self.prometheus_port), *extra_args]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def readiness(self) -> dict:
        """The router's ``GET /readiness``: ``{"status", "healthy_workers", "total_workers"}``."""
        return httpx.get(f"{self.url}/readiness", timeout=2).json()

    def start(self) -> "RealRouter":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)
        atexit.register(self.stop)
        want = len(self.worker_urls)
        try:
            wait_until(lambda: self.readiness().get("healthy_workers") == want,
                       START_TIMEOUT_S, f"{self.name} on {self.url}", self.proc, self.log_path)
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        atexit.unregister(self.stop)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> "RealRouter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def version(package: str) -> str | None:
    """The installed version of ``package`` (None when absent)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    """One replica: ``python -m llminfra.bench.router_fleet --port P [--prefix-caching]
    [--num-blocks N] [--engine-in-thread]`` —
    ``llminfra serve``'s :func:`~llminfra.serving.serve.run_server` on the tiny model, with
    prefix caching on when asked (the ``serve`` command has no switch for it yet)."""
    ap = argparse.ArgumentParser(prog="python -m llminfra.bench.router_fleet")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefix-caching", action="store_true")
    ap.add_argument("--engine-in-thread", action="store_true")
    ap.add_argument("--num-blocks", type=int, default=None)
    args = ap.parse_args(argv)
    run_server("127.0.0.1", args.port, log_level="warning", model=args.model,
               num_threads=args.threads, enable_prefix_caching=args.prefix_caching,
               engine_process=not args.engine_in_thread, num_blocks=args.num_blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ROUTERS", "RealRouter", "ServeReplicas", "router_executable",
           "version", "wait_until"]
