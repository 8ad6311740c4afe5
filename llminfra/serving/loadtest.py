"""A load generator for any OpenAI-compatible endpoint: real HTTP, streamed, timed per token.

Arrivals (the two regimes of serving benchmarks, e.g. vLLM's ``vllm bench serve``):

* **open loop** — requests arrive at ``rate`` per second whether or not earlier ones finished:
  Poisson (exponential gaps with mean 1/rate, Kwon et al., 2023, arXiv:2309.06180, §6.1), gamma
  gaps of shape ``burstiness`` (vLLM's ``--burstiness``) or fixed gaps (``arrivals="fixed"``);
  a list of rates is a **sweep**: one run a rate, one after another; a **ramp-up**
  (:class:`~llminfra.serving.loadtest_workload.RampUp`, vLLM's ``--ramp-up-strategy``) in
  place of a rate takes the rate from a start to an end over the run, request by request;
* **closed loop** — ``concurrency`` clients each send their next request when the last one
  finished.

Requests come from :mod:`llminfra.serving.loadtest_workload` (the chapter-04 trace, capped to
the server's context, ``max_model_len`` from ``/v1/models`` when it reports one; optionally a
shared-prefix workload). A prompt of P tokens is P·``chars_per_token`` characters of held-out
text: exact for the byte-level tiny model (1), about 4 for a BPE model's English. Outputs are
forced to their drawn length with ``max_tokens`` (and vLLM's ``ignore_eos`` when asked), so
the same workload runs on the tiny model or on vLLM on a GPU.

Per request (client clock, :func:`time.perf_counter`) every streamed chunk is timed: TTFT,
TPOT, inter-token latencies and end-to-end latency, summarised with goodput under SLOs, the
peak output tokens per second and the peak requests in flight, and vLLM's result names by
:mod:`llminfra.serving.loadtest_stats`. Tokens are the usage the server reports
(``stream_options.include_usage``), else one per chunk.

Settings are checked before the first request leaves: an open-loop schedule must fit in a day
(:data:`MAX_SCHEDULE_S`; ``rate = 1e-300`` would otherwise wait ~1e300 s), outputs are at
least one token, and sizes stay within :data:`MAX_REQUESTS` and :data:`MAX_CHARS_PER_TOKEN`.

Taught in chapter 05.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import httpx

from llminfra.serving.loadtest_stats import (RequestRecord, format_summary, parse_goodput,
                                             percentiles, summarize)
from llminfra.serving.loadtest_workload import (MAX_CHARS_PER_TOKEN, MAX_REQUESTS,
                                                MAX_SCHEDULE_S, RampUp, _is_int,
                                                check_prefix_settings, check_request_settings,
                                                loadtest_requests, prompt_texts,
                                                shared_prefix_ids)

__all__ = ["MAX_CHARS_PER_TOKEN", "MAX_REQUESTS", "MAX_SCHEDULE_S", "RampUp", "RequestRecord",
           "check_request_settings", "format_summary", "loadtest_requests", "parse_goodput",
           "percentiles", "prompt_texts", "run_loadtest", "summarize"]


async def _one(client: httpx.AsyncClient, rec: RequestRecord, body: dict, t0: float,
               timeout_s: float, clock: Callable[[], float] = time.perf_counter) -> None:
    rec.sent_s = clock() - t0
    usage_tokens = None
    try:
        async with client.stream("POST", "/v1/completions", json=body,
                                 timeout=timeout_s) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                rec.error = f"HTTP {resp.status_code}: {text[:200]}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec.error = str(chunk["error"])[:200]
                    return
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                if any(c.get("text") for c in chunk.get("choices", [])):
                    now = clock() - t0
                    if not rec.chunk_times_s:
                        rec.first_token_s = now
                    rec.chunk_times_s.append(now)
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:200]
        return
    rec.done_s = clock() - t0
    rec.output_tokens = usage_tokens if usage_tokens is not None else len(rec.chunk_times_s)
    if not rec.chunk_times_s:
        rec.error = "no tokens received"


def _server_max_len(base_url: str, model: str | None, timeout_s: float,
                    transport=None) -> tuple[str, int | None]:
    try:
        with httpx.Client(transport=transport, timeout=timeout_s) as client:
            data = client.get(f"{base_url}/v1/models").json()["data"]
    except (httpx.HTTPError, ValueError, KeyError) as e:
        raise ValueError(f"no OpenAI-compatible model list at {base_url}/v1/models "
                         f"({type(e).__name__}: {e})") from None
    card = next((m for m in data if model in (None, m["id"])), None)
    if card is None:
        raise KeyError(f"model {model!r} not served at {base_url}; it serves "
                       f"{[m['id'] for m in data]}")
    return card["id"], card.get("max_model_len")


async def _run(base_url, bodies, records, times, concurrency, timeout_s, progress,
               clock=time.perf_counter, transport=None) -> float:
    from tqdm.auto import tqdm
    clients = min(concurrency, len(records)) if concurrency else 0   # no idle workers
    limits = httpx.Limits(max_connections=max(clients, 64))
    bar = tqdm(total=len(records), desc="requests", disable=not progress, leave=False)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout_s,
                                 transport=transport) as client:
        t0 = clock()

        async def send(i):
            await _one(client, records[i], bodies[i], t0, timeout_s, clock)
            bar.update(1)

        if concurrency:
            todo = iter(range(len(records)))

            async def worker():
                for i in todo:
                    await send(i)
            await asyncio.gather(*(worker() for _ in range(clients)))
        else:
            async def at(i, t):
                await asyncio.sleep(max(0.0, t - (clock() - t0)))
                await send(i)
            await asyncio.gather(*(at(i, t) for i, t in enumerate(times)))
        wall = clock() - t0
    bar.close()
    return wall


def _run_sync(coro):
    """``asyncio.run(coro)``, also from code that already runs an event loop (a Jupyter
    kernel): then in a fresh thread with its own loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _check_client_settings(rate, concurrency, max_model_len, chars_per_token,
                           timeout_s, ramp_up=None) -> list:
    """The rates of the run(s) (``[None]`` for a closed loop or a ramp-up), after checking the
    settings that are not the requests' own."""
    if isinstance(rate, (list, tuple)) and not rate:
        raise ValueError(f"a rate sweep needs at least one rate (requests/s > 0), got {rate!r}")
    if sum(x is not None for x in (rate, concurrency, ramp_up)) != 1:
        raise ValueError("give exactly one of rate (requests/s, or a list of them: a sweep), "
                         "ramp_up (a RampUp: the rate from a start to an end) or concurrency "
                         "(clients)")
    if concurrency is not None and (not _is_int(concurrency) or concurrency < 1):
        raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
    if max_model_len is not None and (not _is_int(max_model_len) or max_model_len < 2):
        raise ValueError(f"max_model_len must be None or an int >= 2 (a prompt token and an "
                         f"output token), got {max_model_len!r}")
    if not (isinstance(chars_per_token, (int, float)) and 0 < chars_per_token
            <= MAX_CHARS_PER_TOKEN):
        raise ValueError(f"chars_per_token must be a number in (0, {MAX_CHARS_PER_TOKEN:g}], "
                         f"got {chars_per_token!r}")
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    return list(rate) if isinstance(rate, (list, tuple)) else [rate]


def _one_rate(base_url: str, model: str, max_len: int, rate, concurrency, o: dict) -> dict:
    """One run at one rate (or concurrency): draw, send, summarise."""
    n, prefix = o["num_requests"], o["prefix_tokens"]
    ramp = o["ramp_up"]
    reqs = loadtest_requests(n, o["seed"], max_len, rate=rate, arrivals=o["arrivals"],
                             workload_name=o["workload_name"],
                             max_output_tokens=o["max_output_tokens"],
                             burstiness=o["burstiness"], prefix_tokens=prefix, ramp_up=ramp)
    ids = shared_prefix_ids(n, o["num_prefixes"], o["seed"] + 1) if prefix else None
    prompts = prompt_texts([r.prompt_len for r in reqs], o["chars_per_token"],
                           prefix_tokens=prefix, prefix_ids=ids)
    bodies = [{"model": model, "prompt": text, "max_tokens": r.output_len,
               "temperature": o["temperature"], "stream": True,
               "stream_options": {"include_usage": True},
               **({"ignore_eos": True} if o["ignore_eos"] else {})}
              for text, r in zip(prompts, reqs)]
    records = [RequestRecord(i, r.prompt_len, r.output_len) for i, r in enumerate(reqs)]
    times = [r.arrival_time_s for r in reqs]
    wall = _run_sync(_run(base_url, bodies, records, times, concurrency, o["timeout_s"],
                          o["progress"], o["clock"], o["transport"]))
    result = summarize(records, wall, o["goodput"])
    open_loop = bool(rate or ramp)
    ramp_fields = {"ramp_up_strategy": ramp.strategy, "ramp_up_start_rps": ramp.start_rps,
                   "ramp_up_end_rps": ramp.end_rps} if ramp else {}
    result.update(ramp_fields)                   # vLLM's keys, written only with a ramp-up
    result["settings"] = {"base_url": base_url, "model": model, "rate": rate,
                          "concurrency": concurrency,
                          "arrivals": o["arrivals"] if open_loop else None,
                          "burstiness": o["burstiness"] if open_loop else None,
                          "ramp_up_strategy": None, "ramp_up_start_rps": None,
                          "ramp_up_end_rps": None, **ramp_fields,
                          "workload": o["workload_name"], "seed": o["seed"],
                          "max_model_len": max_len, "prefix_tokens": prefix,
                          "num_prefixes": o["num_prefixes"] if prefix else None}
    result["requests"] = [dict(asdict(r), chunk_times_s=None, itl_s=r.itl_s) for r in records]
    return result


def run_loadtest(base_url: str, *, rate: float | list[float] | None = None,
                 concurrency: int | None = None,
                 num_requests: int = 100, model: str | None = None, workload_name: str =
                 "sharegpt", arrivals: str = "poisson", seed: int = 0,
                 max_model_len: int | None = None, max_output_tokens: int | None = None,
                 chars_per_token: float = 1.0, temperature: float = 0.0,
                 ignore_eos: bool = False, timeout_s: float = 300.0,
                 progress: bool = True, clock: Callable[[], float] = time.perf_counter,
                 transport: httpx.MockTransport | None = None, burstiness: float = 1.0,
                 goodput: str | list[str] | dict | None = None, prefix_tokens: int = 0,
                 num_prefixes: int = 1, ramp_up: RampUp | None = None) -> dict:
    """Drive ``base_url`` (e.g. ``http://127.0.0.1:8000``) with ``num_requests`` streamed
    completions; return :func:`~llminfra.serving.loadtest_stats.summarize`'s dict (our keys
    and vLLM's) plus the settings and per-request records.

    Exactly one of ``rate`` (requests/s, open loop; a list of rates is a sweep: then
    ``{"sweep": [one result a rate], "rates", "num_ok", ...}``), ``ramp_up`` (an open loop
    whose rate goes from ``ramp_up.start_rps`` to ``ramp_up.end_rps`` by request index,
    :class:`~llminfra.serving.loadtest_workload.RampUp`; its settings also under vLLM's keys
    ``ramp_up_strategy``, ``ramp_up_start_rps``, ``ramp_up_end_rps``) or ``concurrency``
    (closed loop) is given. ``burstiness``: gamma arrival gaps (1 = Poisson). ``goodput``:
    SLOs in ms, vLLM's ``"ttft:500 tpot:50 e2el:3000"`` (:func:`parse_goodput`).
    ``prefix_tokens`` > 0: each prompt starts with one of ``num_prefixes`` shared prefixes of
    that many tokens.
    Every setting is checked before the first request. ``clock`` (seconds) and ``transport``
    (an httpx transport serving both the model list and the streams, e.g.
    ``httpx.MockTransport``) let a test replace the wall clock and the server.
    """
    rates = _check_client_settings(rate, concurrency, max_model_len, chars_per_token, timeout_s,
                                   ramp_up)
    for r in rates:
        check_request_settings(num_requests, seed, rate=r, arrivals=arrivals,
                               max_output_tokens=max_output_tokens, burstiness=burstiness,
                               ramp_up=ramp_up)
    check_prefix_settings(prefix_tokens, num_prefixes, max_model_len or 2**62)
    slos = parse_goodput(goodput) if goodput is not None else None
    base_url = base_url.rstrip("/").removesuffix("/v1")
    model, served_len = _server_max_len(base_url, model, timeout_s, transport)
    max_len = max_model_len or served_len or 2048
    check_prefix_settings(prefix_tokens, num_prefixes, max_len)
    o = dict(num_requests=num_requests, seed=seed, arrivals=arrivals,
             workload_name=workload_name, max_output_tokens=max_output_tokens,
             burstiness=burstiness, prefix_tokens=prefix_tokens, num_prefixes=num_prefixes,
             chars_per_token=chars_per_token, temperature=temperature, ignore_eos=ignore_eos,
             timeout_s=timeout_s, progress=progress, clock=clock, transport=transport,
             goodput=slos, ramp_up=ramp_up)
    runs = [_one_rate(base_url, model, max_len, r, concurrency, o) for r in rates]
    if not isinstance(rate, (list, tuple)):
        return runs[0]
    return {"rates": rates, "num_requests": sum(r["num_requests"] for r in runs),
            "num_ok": sum(r["num_ok"] for r in runs),
            "num_errors": sum(r["num_errors"] for r in runs),
            "settings": dict(runs[0]["settings"], rate=rates), "sweep": runs}
