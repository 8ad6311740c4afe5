"""The engine in a process of its own (:mod:`llminfra.serving.engine_process`, what
``python -m llminfra serve`` runs): a bad setting fails before the server listens, an engine
that crashes ends every open request with an error and turns ``/health`` to 503, and no engine
process outlives its server — after SIGTERM, after SIGKILL of the server, and Ctrl-C reaches
only the server.

Every wait is bounded."""

import signal
import subprocess
import sys
import time
from functools import partial

import httpx
import psutil
import pytest

from llminfra.serving.background import ServerProcess, ServerThread, free_port
from llminfra.serving.engine_process import EngineProcess
from llminfra.serving.serve import build_engine
from llminfra.serving.server import create_app
from llminfra.model import ByteTokenizer

pytestmark = pytest.mark.slow   # each test starts server processes

MODEL = "llminfra-tiny"


def crashing_engine(after_steps: int):
    """A tiny-model engine whose step raises after ``after_steps`` steps (runs in the child)."""
    engine = build_engine(num_threads=1, num_blocks=64)
    step, calls = engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) > after_steps:
            raise RuntimeError("injected engine failure")
        return step()

    engine.step = failing_step
    return engine


def wait_gone(pid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def engine_child(server_pid: int) -> psutil.Process:
    """The server's engine process (multiprocessing's spawn runs it as a child of the
    server, next to a resource tracker)."""
    kids = [p for p in psutil.Process(server_pid).children()
            if "spawn_main" in " ".join(p.cmdline())]
    assert len(kids) == 1, [p.cmdline() for p in kids]
    return kids[0]


def test_a_bad_setting_fails_before_listening():
    r = subprocess.run([sys.executable, "-m", "llminfra", "serve", "--num-blocks", "0",
                        "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "argument --num-blocks: must be an integer number of blocks" in r.stderr
    assert "Traceback" not in r.stderr


def test_factory_errors_are_reported():
    loop = EngineProcess(partial(build_engine, max_num_seqs=0))
    with pytest.raises(ValueError, match="max_num_seqs must be an int >= 1"):
        loop.start()
    assert not loop.is_running
    with pytest.raises(ValueError, match="factory must be callable"):
        EngineProcess(42)


def engine_seeing_env(name: str, value: str):
    """The tiny engine, built only where the process started with ``name=value``."""
    import os
    if os.environ.get(name) != value:
        raise ValueError(f"{name} is {os.environ.get(name)!r} in the engine process")
    return build_engine()


def test_the_engine_process_starts_with_its_env_and_this_one_keeps_its_own(monkeypatch):
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    loop = EngineProcess(partial(engine_seeing_env, "GOMP_SPINCOUNT", "123"),
                         env={"GOMP_SPINCOUNT": "123"})
    try:
        loop.start()
        assert loop.is_running
    finally:
        loop.stop()
    import os
    assert os.environ["GOMP_SPINCOUNT"] == "7"
    with pytest.raises(ValueError, match="GOMP_SPINCOUNT is '7' in the engine process"):
        EngineProcess(partial(engine_seeing_env, "GOMP_SPINCOUNT", "123")).start()


def test_an_engine_process_on_the_c_kernels_spins_briefly_unless_told_otherwise(monkeypatch):
    from llminfra.serving.serve import C_KERNELS_GOMP_SPINCOUNT, engine_env
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert engine_env("w4a8") == {"GOMP_SPINCOUNT": C_KERNELS_GOMP_SPINCOUNT}
    assert engine_env(None, "skinny") == {"GOMP_SPINCOUNT": C_KERNELS_GOMP_SPINCOUNT}
    assert engine_env(None) == engine_env(None, "onednn") == engine_env(None, "plain") == {}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")       # the caller's choice is kept
    assert engine_env("w4a8") == {}


def test_an_engine_crash_ends_open_requests_and_health():
    app = create_app(EngineProcess(partial(crashing_engine, 3)), ByteTokenizer(),
                     model_name=MODEL, max_model_len=256)
    with ServerThread(app) as srv:
        body = {"model": MODEL, "prompt": "abc", "max_tokens": 50}
        r = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 503, r.text                  # never a hang, never a 500
        assert "injected engine failure" in r.json()["error"]["message"]
        deadline = time.monotonic() + 10
        while httpx.get(f"{srv.base_url}/health", timeout=10).status_code != 503:
            assert time.monotonic() < deadline, "health still ok after the engine crashed"
            time.sleep(0.05)
        r = httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"


def test_sigterm_leaves_no_engine_process():
    srv = ServerProcess(["--threads", "1", "--log-level", "info"]).start()
    try:
        child = engine_child(srv.proc.pid)
        r = httpx.post(f"{srv.base_url}/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": "a", "max_tokens": 4})
        assert r.json()["usage"]["completion_tokens"] == 4
    finally:
        srv.stop(timeout_s=30)
    assert wait_gone(child.pid), "the engine process outlived its server"
    assert "engine loop stopped (engine process exit code 0)" in srv.output, srv.output


def test_a_killed_server_takes_its_engine_with_it():
    srv = ServerProcess(["--threads", "1", "--log-level", "warning"]).start()
    child = engine_child(srv.proc.pid)
    srv.proc.kill()                      # SIGKILL: no shutdown code runs in the server
    srv.proc.wait(30)
    try:
        assert wait_gone(child.pid), "the engine process outlived a killed server"
    finally:
        if child.is_running():
            child.kill()                 # a failed test leaves no process behind either
        srv.stop()


def test_ctrl_c_reaches_only_the_server():
    """A terminal's Ctrl-C sends SIGINT to the whole process group: the engine process ignores
    it (it would otherwise die mid-step while the server shuts down gracefully)."""
    srv = ServerProcess(["--threads", "1", "--log-level", "warning"]).start()
    try:
        child = engine_child(srv.proc.pid)
        child.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        r = httpx.post(f"{srv.base_url}/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": "a", "max_tokens": 4})
        assert r.json()["usage"]["completion_tokens"] == 4
        srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(30) in (0, -signal.SIGINT)
    finally:
        srv.stop()
    assert wait_gone(child.pid)
