"""An OpenAI-compatible server under test, for ``make compare-engines``
(:mod:`llminfra.bench.compare_engines`): a process in its own group on a free port, ready when
``/health`` answers, paused (SIGSTOP) while another is measured, stopped on exit; and the greedy
probes whose texts are compared engine against engine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

#: the probes: (kind, prompt or messages) — English, code, Korean, a chat turn
PROBES = [
    ("completion", "The three most important ideas in operating systems are"),
    ("completion", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("completion", "대한민국의 수도는"),
    ("chat", [{"role": "user", "content": "What is a KV cache, in one sentence?"}]),
]
PROBE_TOKENS = 32


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process in its own process group, stopped (SIGINT, then SIGKILL) on exit."""

    def __init__(self, argv: list[str], port: int, log: Path, env: dict | None = None):
        self.argv, self.port, self.log = argv, port, log
        self.url = f"http://127.0.0.1:{port}"
        self._log = open(log, "w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, start_new_session=True)
        self.started = time.perf_counter()

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ``/health`` answers 200; ``RuntimeError`` with the log's tail if the
        process exits or the time runs out."""
        while time.perf_counter() - self.started < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[:4]} exited with {self.proc.returncode}:\n"
                                   f"{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"{self.argv[:4]} not ready after {timeout_s:.0f} s:\n{self.tail()}")

    def pause(self) -> None:
        """SIGSTOP the whole process group: an idle server that polls (vLLM's workers spin on
        their shared-memory queue) takes no CPU from the one being measured."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        """``sig`` to the process group; nothing if the server has exited already (its exit
        status and log tell why: a signal's error would hide them)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def tail(self, n: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def probe(url: str, name: str) -> list[str]:
    """The greedy texts of :data:`PROBES` from the server at ``url``."""
    out = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for kind, content in PROBES:
            body = {"model": name, "max_tokens": PROBE_TOKENS, "temperature": 0}
            if kind == "chat":
                r = client.post("/v1/chat/completions", json={**body, "messages": content})
                r.raise_for_status()
                out.append(r.json()["choices"][0]["message"]["content"])
            else:
                r = client.post("/v1/completions", json={**body, "prompt": content})
                r.raise_for_status()
                out.append(r.json()["choices"][0]["text"])
    return out


def agreement(a: list[str], b: list[str]) -> list[dict]:
    """Per probe: equal, and the length of the common prefix (characters)."""
    out = []
    for x, y in zip(a, b):
        k = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        out.append({"equal": x == y, "common_prefix_chars": k, "chars": [len(x), len(y)]})
    return out
