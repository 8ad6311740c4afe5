"""``python -m llminfra bench serving-profile``: what a step of ``llminfra serve`` costs outside
the matmuls, at 16 closed-loop streaming clients.

The server is built as ``serve`` builds it — :func:`llminfra.serving.serve.build_engine` on the
model (default runner and matmul: the fused fast runner, oneDNN's prepacked weights on a real
model; torch's threads as ``serve`` leaves them: all cores), its engine in a process of its own
(or, ``engine_in_thread``, in a thread of the web process), uvicorn in a thread of this
process — and :func:`llminfra.serving.loadtest.run_loadtest` drives it from a spawned process of
its own (16 clients, greedy, ``ignore_eos``, outputs capped at 64 tokens), after one warm-up
request.

In the profiled run the engine's factory is :func:`profiled_engine`: the same engine with a
:class:`~llminfra.bench.step_profiler.StepProfiler` installed, whose totals travel to the web
process with the engine's ``stats()``. Reported per category: seconds, share of the steps' wall
time, µs per decode step; then, outside the steps, the engine loop's time between steps and the
CPU seconds of the web process's threads (HTTP, SSE, JSON, asyncio; the reader thread that
unpickles the engine's events), which in process mode run beside the engine on another core.
Profiled runs alternate with runs of the same server without the wrappers, and the fastest of
each kind counts (the least disturbed on a shared machine); their ratio bounds what the timers
cost, and the timers' own cost (timed calls × the cost of one, measured) is recorded beside it.
The JSON records the load average: the machine may be shared.
Chapter 12 (the serving profile beside the three-engine comparison).
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from llminfra.bench.step_profiler import KINDS, STEP_CATEGORIES, StepProfiler, wrapper_cost_s
from llminfra.bench.timing import cpu_name, environment
from llminfra.serving.background import ServerThread
from llminfra.serving.loadtest import run_loadtest
from llminfra.runner.kernel_choice import resolve_matmul
from llminfra.serving.serve import build_app, build_engine, served_name

#: the measured setting of issue 40: 16 clients, 64-token answers, the real model
CONCURRENCY, OUTPUT_TOKENS, NUM_REQUESTS, MODEL = 16, 64, 48, "smollm2-135m"
#: prompts drawn from the trace to fit this many tokens (the model allows 8192)
MAX_MODEL_LEN = 512
#: the web process's threads (CPU seconds): thread name -> (row, what it holds)
WEB_THREADS = {
    "llminfra-uvicorn": ("front end CPU: event loop", "uvicorn + FastAPI: HTTP, SSE, JSON, "
                                                      "asyncio"),
    "llminfra-engine-reader": ("front end CPU: engine reader", "unpickling the engine "
                                                               "process's events, routing them"),
    "llminfra-engine": ("engine thread CPU (in the web process)", "the engine loop, when it "
                                                                  "runs in a thread"),
    "other": ("web process CPU: unnamed threads", "torch's workers, the client pool's manager"),
}


def profiled_engine(model: str, **engine_kwargs):
    """``build_engine(model, **engine_kwargs)`` with a :class:`StepProfiler` installed (its
    totals in ``engine.stats()["profile"]``): a picklable factory for the engine process."""
    engine = build_engine(model, **engine_kwargs)
    engine.step_profiler = StepProfiler().install(engine)
    return engine


# ---------------------------------------------------------------------- the runs
def _drive(base_url: str, options: dict) -> dict:
    """The load test, in the client's own process; with its CPU seconds."""
    def cpu_s():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    before = cpu_s()
    result = run_loadtest(base_url, progress=False, **options)
    result["client_cpu_s"] = cpu_s() - before
    result.pop("requests")
    return result


def _ready() -> bool:
    """Nothing: the client's process has started and imported this module (before the
    timing)."""
    return True


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads, by thread name (unnamed ones —
    torch's workers — as ``other``)."""
    import psutil
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "other")
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def _process_cpu_s(pid: int) -> float:
    import psutil
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _diff(after, before):
    """``after − before``, key by key, for nested dicts of numbers."""
    if isinstance(after, dict):
        return {k: _diff(v, before.get(k, 0) if isinstance(before, dict) else 0)
                for k, v in after.items()}
    if isinstance(after, (int, float)) and isinstance(before, (int, float)):
        return after - before
    return after                            # the pid, the thread count, the missing list


def _app(model: str, engine_in_thread: bool, profiled: bool, engine_kwargs: dict):
    """The app ``serve`` builds (:func:`~llminfra.serving.serve.build_app`); ``profiled``:
    the same with :func:`profiled_engine` as the engine's factory. With the in-thread engine's
    profiler (to uninstall: its wrappers sit in this process's modules), else None."""
    app = build_app(model, engine_process=not engine_in_thread, start_timeout_s=600,
                    factory=profiled_engine if profiled else None, **engine_kwargs)
    engine = getattr(app.state.service.loop, "engine", None)     # in a thread of this process
    return app, getattr(engine, "step_profiler", None)


def _one_run(pool, model: str, engine_in_thread: bool, profiled: bool, engine_kwargs: dict,
             options: dict) -> dict:
    """Serve, warm up with one request, drive the load test; the client's summary, the CPU
    seconds of each process (and of the web process's threads) and the profile of the run."""
    import httpx

    app, profiler = _app(model, engine_in_thread, profiled, engine_kwargs)
    loop = app.state.service.loop
    try:
        with ServerThread(app, start_timeout_s=600) as srv:
            httpx.post(f"{srv.base_url}/v1/completions", timeout=600,
                       json={"model": served_name(model), "prompt": "Hello",
                             "max_tokens": 4}).raise_for_status()
            time.sleep(1.2)                 # a heartbeat: the stats after the warm-up
            before, before_tokens = loop.stats.get("profile"), loop.stats[
                "generation_tokens_total"]
            pid = (before or {}).get("pid") or getattr(getattr(loop, "_proc", None), "pid",
                                                       os.getpid())
            web0, eng0 = _thread_cpu_s(), _process_cpu_s(pid)
            result = pool.submit(_drive, srv.base_url, options).result()
            time.sleep(0.3)                 # the reader thread has handed over the last step
            web1, eng1 = _thread_cpu_s(), _process_cpu_s(pid)
            after_stats = dict(loop.stats)
    finally:
        if profiler is not None:
            profiler.uninstall()
    result["web_thread_cpu_s"] = {k: v - web0.get(k, 0.0) for k, v in web1.items()}
    result["engine_process_cpu_s"] = None if pid == os.getpid() else eng1 - eng0
    result["engine_generated_tokens"] = after_stats["generation_tokens_total"] - before_tokens
    after = after_stats.get("profile")
    if profiled:                            # the totals of the load test alone
        result["profile"] = {**_diff(after, before), "torch_threads": after["torch_threads"],
                             "pid": after["pid"], "missing": after["missing"]}
    return result


def profile_serving(model: str = MODEL, *, concurrency: int = CONCURRENCY,
                    num_requests: int = NUM_REQUESTS, max_output_tokens: int = OUTPUT_TOKENS,
                    max_model_len: int | None = MAX_MODEL_LEN, chars_per_token: float = 4.0,
                    engine_in_thread: bool = False, num_threads: int | None = None,
                    repeats: int = 2, unprofiled: bool = True, seed: int = 0,
                    matmul: str = "auto") -> dict:
    """Profile ``serve`` on ``model`` under ``concurrency`` closed-loop streaming clients
    (``num_requests`` chapter-04 trace requests fitting ``max_model_len``, outputs capped at
    ``max_output_tokens``, greedy, ``ignore_eos``): ``repeats`` profiled runs, each after a run
    of the same server without the wrappers (``unprofiled``); the fastest of each kind counts
    (the least disturbed on a shared machine), every run is kept. ``num_threads``: torch's
    threads in the engine (None: serve's default, all cores); ``matmul``: serve's ``--matmul``.
    Returns the settings, every run,
    and the categories of the counted profiled run (:func:`categories`)."""

    load_before = os.getloadavg()
    options = dict(concurrency=concurrency, num_requests=num_requests, seed=seed,
                   max_model_len=max_model_len, max_output_tokens=max_output_tokens,
                   chars_per_token=chars_per_token, temperature=0.0, ignore_eos=True)
    engine_kwargs = dict(max_num_seqs=max(concurrency, 1), num_threads=num_threads,
                         matmul=matmul)
    order = ([False, True] if unprofiled else [True]) * repeats
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(_ready).result()
        runs = [_one_run(pool, model, engine_in_thread, p, engine_kwargs, options)
                for p in order]
    profiled = max((r for r, p in zip(runs, order) if p),
                   key=lambda r: r["output_tokens_per_s"])
    plain = [r for r, p in zip(runs, order) if not p]
    best = max((r["output_tokens_per_s"] for r in plain), default=None)
    return {"suite": "serving-profile",
            "environment": {**environment(), "cpu_name": cpu_name(),
                            "cpu_count": os.cpu_count(), "load_average_before": load_before,
                            "load_average_after": os.getloadavg()},
            "settings": {"model": model, **options, "engine": "thread" if engine_in_thread
                         else "process", **_served_kinds(model, matmul),
                         "engine_torch_threads": profiled["profile"]["torch_threads"],
                         "num_threads_setting": num_threads,
                         "method": "time.perf_counter wrappers installed from outside "
                                   "(exclusive: a wrapper's time less its wrapped callees')"},
            "profiled_run": profiled, "unprofiled_runs": plain,
            "profiled_runs_output_tokens_per_s": [r["output_tokens_per_s"]
                                                  for r, p in zip(runs, order) if p],
            "profiled_output_tokens_per_s": profiled["output_tokens_per_s"],
            "unprofiled_output_tokens_per_s": best,
            "profiling_overhead": None if best is None
            else 1 - profiled["output_tokens_per_s"] / best,
            "timer_cost_s_per_call": wrapper_cost_s(),
            **categories(profiled)}


def _served_kinds(model: str, matmul: str = "auto") -> dict:
    """The runner ``serve``'s default gives ``model``, and the matmul ``matmul`` means."""
    return {"runner": "auto (fast where the fused weights take the model)",
            "matmul": resolve_matmul(matmul, model)}


def categories(run: dict) -> dict:
    """Per category: seconds over all steps, share of the steps' wall time, µs per decode
    step (decode steps only); then the rows outside the step. ``categories_sum_s`` against
    ``step_wall_s`` is the check that they add up."""
    p = run["profile"]
    n_dec = p["steps"]["decode"]
    n_all = sum(p["steps"].values())
    wall = sum(p["step_wall_s"].values())
    rows = []
    for name, holds in STEP_CATEGORIES:
        s = sum(p["seconds"][k][name] for k in KINDS)
        rows.append({"category": name, "where": "engine step", "holds": holds, "seconds": s,
                     "share_of_step_wall": s / wall,
                     "us_per_decode_step": 1e6 * p["seconds"]["decode"][name] / max(n_dec, 1)})
    total = sum(r["seconds"] for r in rows)
    rows.append({"category": "engine loop between steps", "where": "engine loop",
                 "holds": "delivering a step's outputs (pickle + pipe in process mode), "
                          "taking commands, stats", "seconds": p["between_steps_s"],
                 "share_of_step_wall": p["between_steps_s"] / wall,
                 "us_per_decode_step": 1e6 * p["between_steps_s"] / max(p["gaps"], 1)})
    for thread, cpu in sorted(run["web_thread_cpu_s"].items(), key=lambda kv: -kv[1]):
        if cpu > 0 or thread.startswith("llminfra-"):   # our threads even at 0 (10 ms ticks)
            name, holds = WEB_THREADS.get(thread, (f"web process CPU: {thread}", thread))
            rows.append({"category": name, "where": "web process", "holds": holds,
                         "seconds": cpu,
                         "share_of_step_wall": cpu / wall,
                         "us_per_decode_step": 1e6 * cpu / max(n_all, 1)})
    return {"categories": rows, "categories_sum_s": total, "step_wall_s": wall,
            "timed_calls": p["timed_calls"],
            "steps": p["steps"], "decode_batch_mean": p["decode_rows"] / max(n_dec, 1),
            "timed_calls_per_step": p["timed_calls"] / max(n_all, 1)}


def table(result: dict):
    """The categories as a DataFrame (what a notebook cell shows)."""
    import pandas as pd
    df = pd.DataFrame(result["categories"])
    return pd.DataFrame({"category": df["category"], "where": df["where"],
                         "time (s)": df["seconds"].round(3),
                         "share of step wall (%)": (100 * df["share_of_step_wall"]).round(1),
                         "per decode step (µs)": df["us_per_decode_step"].round(0)})


def format_table(result: dict) -> str:
    """The table and one line of context above it."""
    s = result["settings"]
    over = result["profiling_overhead"]
    head = (f"serve {s['model']} (engine in a {s['engine']}, {s['engine_torch_threads']} torch "
            f"threads), {s['concurrency']} clients: {result['steps']['decode']} decode steps "
            f"(mean batch {result['decode_batch_mean']:.1f}) + {result['steps']['mixed']} "
            f"mixed, {result['profiled_output_tokens_per_s']:.1f} tokens/s profiled")
    if over is not None:
        head += (f", {result['unprofiled_output_tokens_per_s']:.1f} without the timers "
                 f"(overhead {100 * over:.1f} %)")
    cost = result["timer_cost_s_per_call"]
    share = result["timed_calls"] * cost / result["step_wall_s"]
    head += (f"; the timers' own cost {result['timed_calls_per_step']:.0f} calls a step × "
             f"{1e6 * cost:.2f} µs = {100 * share:.1f} % of the step wall")
    env = result["environment"]
    head += (f"; load average {env['load_average_before'][0]:.1f} before, "
             f"{env['load_average_after'][0]:.1f} after")
    return head + "\n" + table(result).to_string(index=False)


def run(quick: bool = False) -> dict:
    """``bench serving-profile``: SmolLM2-135M at 16 clients; ``--quick``: the tiny model,
    4 clients, 8 requests of 16 tokens, one run of each kind."""
    if quick:
        return profile_serving("tiny", concurrency=4, num_requests=8, max_output_tokens=16,
                               max_model_len=256, chars_per_token=1.0, repeats=1)
    return profile_serving()
