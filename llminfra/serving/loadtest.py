"""A load generator for any OpenAI-compatible endpoint: real HTTP, streamed, timed per token.

Arrivals (the two regimes of serving benchmarks, e.g. vLLM's ``benchmark_serving``):

* **open loop** — requests arrive at ``rate`` per second whether or not earlier ones finished:
  Poisson (exponential gaps with mean 1/rate, Kwon et al., 2023, arXiv:2309.06180, §6.1) or
  fixed gaps (``arrivals="fixed"``);
* **closed loop** — ``concurrency`` clients each send their next request when the last one
  finished.

Requests come from :func:`llminfra.engine.workload.serving_workload` (the chapter-04 trace,
the vLLM paper's ShareGPT / Alpaca means), capped to the server's context (``max_model_len`` from
``/v1/models`` when it reports one). A prompt of P tokens is P·``chars_per_token`` characters
of held-out text: exact for the byte-level tiny model (1), about 4 for a BPE model's English.
Outputs are forced to their drawn length with ``max_tokens`` (and vLLM's ``ignore_eos`` when
asked), so the same workload runs on the tiny model or on vLLM on a GPU.

Per request (client clock, :func:`time.perf_counter`): TTFT = first text chunk − send;
time per output token = (last − first chunk) / (tokens − 1); e2e. Tokens are the usage the
server reports (``stream_options.include_usage``), else one per chunk. Summary: percentiles,
output tokens/s over the wall time, requests/s, errors.

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
from dataclasses import asdict, dataclass, field

import httpx
import torch

from llminfra.engine.metrics import percentile
from llminfra.engine.workload import WorkloadRequest, serving_workload

#: the longest open-loop schedule a run accepts: (requests − 1) / rate seconds, one day
MAX_SCHEDULE_S = 86_400.0
#: requests in one run (each is a record in memory and a line of the JSON file)
MAX_REQUESTS = 1_000_000
#: prompt characters per token: about 1 for a byte model, about 4 for a BPE model's English
MAX_CHARS_PER_TOKEN = 100.0


@dataclass
class RequestRecord:
    """What one request measured (seconds on the client's clock, from the start of the run)."""

    index: int
    prompt_len: int
    max_tokens: int
    sent_s: float = math.nan
    first_token_s: float = math.nan
    done_s: float = math.nan
    output_tokens: int = 0
    chunk_times_s: list = field(default_factory=list)
    error: str | None = None

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.sent_s

    @property
    def tpot_s(self) -> float:
        if self.output_tokens < 2:
            return math.nan
        return (self.done_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float:
        return self.done_s - self.sent_s


def loadtest_requests(num_requests: int, seed: int, max_model_len: int, *,
                      rate: float | None = None, arrivals: str = "poisson",
                      workload_name: str = "sharegpt",
                      max_output_tokens: int | None = None) -> list[WorkloadRequest]:
    """The requests of a run: :func:`llminfra.engine.workload.serving_workload` (trace lengths
    that fit ``max_model_len``; Poisson arrivals at ``rate``, or all at t = 0 without a rate),
    with ``arrivals="fixed"`` gaps of exactly 1/rate, and outputs capped at
    ``max_output_tokens``."""
    check_request_settings(num_requests, seed, rate=rate, arrivals=arrivals,
                           max_output_tokens=max_output_tokens)
    g = torch.Generator().manual_seed(seed)
    reqs = serving_workload(num_requests, g, rate_per_s=rate or math.inf,
                            workload=workload_name, max_seq_len=max_model_len)
    return [WorkloadRequest(i / rate if (rate and arrivals == "fixed") else r.arrival_time_s,
                            r.prompt_len,
                            r.output_len if max_output_tokens is None
                            else max(1, min(r.output_len, max_output_tokens)))
            for i, r in enumerate(reqs)]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_request_settings(num_requests: int, seed: int, *, rate: float | None = None,
                           arrivals: str = "poisson",
                           max_output_tokens: int | None = None) -> None:
    """``ValueError`` naming the setting when a run's requests cannot be drawn sensibly:
    ``num_requests`` in 1..:data:`MAX_REQUESTS`, ``seed`` in 0..2**64 − 1 (a
    ``torch.Generator`` seed), ``arrivals`` ``"poisson"`` or ``"fixed"``, ``rate`` a finite
    number > 0 whose schedule, ``(num_requests − 1) / rate`` seconds on average, fits in
    :data:`MAX_SCHEDULE_S`, and ``max_output_tokens`` None or an int >= 1."""
    if not _is_int(num_requests) or not 1 <= num_requests <= MAX_REQUESTS:
        raise ValueError(f"num_requests must be an int in 1..{MAX_REQUESTS:,}, "
                         f"got {num_requests!r}")
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in 0..2**64 - 1, got {seed!r}")
    if arrivals not in ("poisson", "fixed"):
        raise ValueError(f"arrivals must be 'poisson' or 'fixed', got {arrivals!r}")
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
                rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a finite number of requests per second > 0, "
                             f"got {rate!r}")
        span_s = (num_requests - 1) / rate
        if span_s > MAX_SCHEDULE_S:
            raise ValueError(f"rate {rate:g} requests/s spreads {num_requests} requests over "
                             f"about {span_s:.3g} s, beyond the {MAX_SCHEDULE_S:,.0f} s (one "
                             "day) a load test may last: raise the rate or send fewer requests")
    if max_output_tokens is not None and (not _is_int(max_output_tokens)
                                          or max_output_tokens < 1):
        raise ValueError(f"max_output_tokens must be None or an int >= 1, "
                         f"got {max_output_tokens!r}")


def prompt_texts(lengths: list[int], chars_per_token: float = 1.0) -> list[str]:
    """Prompts cut from the held-out corpus (ASCII-only, so 1 char = 1 byte = 1 tiny token)."""
    from llminfra.model import heldout_tokens
    text = bytes(b for b in heldout_tokens(8192).tolist() if 32 <= b < 127 or b == 10).decode()
    out = []
    for i, n in enumerate(lengths):
        n_chars = max(1, int(round(n * chars_per_token)))
        start = (i * 997) % max(1, len(text) - n_chars)
        out.append((text * (1 + n_chars // len(text)))[start:start + n_chars])
    return out


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


def percentiles(values: list[float], qs=(50, 90, 99)) -> dict:
    """``{"mean", "p50", "p90", "p99"}`` of the finite values (NaN when there are none), with
    the engine's :func:`~llminfra.engine.metrics.percentile` (linear interpolation)."""
    v = [x for x in values if math.isfinite(x)]
    if not v:
        return {"mean": math.nan, **{f"p{q}": math.nan for q in qs}}
    return {"mean": sum(v) / len(v), **{f"p{q}": percentile(v, q) for q in qs}}


def summarize(records: list[RequestRecord], wall_s: float) -> dict:
    """Latency percentiles (s), throughput (output tokens/s, requests/s) and errors."""
    ok = [r for r in records if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    return {"num_requests": len(records), "num_ok": len(ok),
            "num_errors": len(records) - len(ok),
            "errors": sorted({r.error for r in records if r.error})[:5],
            "wall_s": wall_s, "output_tokens": tokens,
            "prompt_tokens": sum(r.prompt_len for r in ok),
            "output_tokens_per_s": tokens / wall_s if wall_s > 0 else math.nan,
            "requests_per_s": len(ok) / wall_s if wall_s > 0 else math.nan,
            "ttft_s": percentiles([r.ttft_s for r in ok]),
            "tpot_s": percentiles([r.tpot_s for r in ok]),
            "e2e_s": percentiles([r.e2e_s for r in ok])}


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


def run_loadtest(base_url: str, *, rate: float | None = None, concurrency: int | None = None,
                 num_requests: int = 100, model: str | None = None, workload_name: str =
                 "sharegpt", arrivals: str = "poisson", seed: int = 0,
                 max_model_len: int | None = None, max_output_tokens: int | None = None,
                 chars_per_token: float = 1.0, temperature: float = 0.0,
                 ignore_eos: bool = False, timeout_s: float = 300.0,
                 progress: bool = True, clock: Callable[[], float] = time.perf_counter,
                 transport: httpx.MockTransport | None = None) -> dict:
    """Drive ``base_url`` (e.g. ``http://127.0.0.1:8000``) with ``num_requests`` streamed
    completions; return :func:`summarize`'s dict plus the settings and per-request records.

    Exactly one of ``rate`` (requests/s, open loop) or ``concurrency`` (closed loop) is given.
    Every setting is checked (:func:`check_request_settings`) before the first request.
    ``clock`` (seconds) and ``transport`` (an httpx transport serving both the model list and
    the streams, e.g. ``httpx.MockTransport``) let a test replace the wall clock and the
    server, so that every time measured is exact.
    """
    if (rate is None) == (concurrency is None):
        raise ValueError("give exactly one of rate (requests/s) or concurrency (clients)")
    if concurrency is not None and (not _is_int(concurrency) or concurrency < 1):
        raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
    check_request_settings(num_requests, seed, rate=rate, arrivals=arrivals,
                           max_output_tokens=max_output_tokens)
    if max_model_len is not None and (not _is_int(max_model_len) or max_model_len < 2):
        raise ValueError(f"max_model_len must be None or an int >= 2 (a prompt token and an "
                         f"output token), got {max_model_len!r}")
    if not (isinstance(chars_per_token, (int, float)) and 0 < chars_per_token
            <= MAX_CHARS_PER_TOKEN):
        raise ValueError(f"chars_per_token must be a number in (0, {MAX_CHARS_PER_TOKEN:g}], "
                         f"got {chars_per_token!r}")
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    base_url = base_url.rstrip("/").removesuffix("/v1")
    model, served_len = _server_max_len(base_url, model, timeout_s, transport)
    max_len = max_model_len or served_len or 2048
    reqs = loadtest_requests(num_requests, seed, max_len, rate=rate, arrivals=arrivals,
                             workload_name=workload_name, max_output_tokens=max_output_tokens)
    prompts = prompt_texts([r.prompt_len for r in reqs], chars_per_token)
    bodies = [{"model": model, "prompt": text, "max_tokens": r.output_len,
               "temperature": temperature, "stream": True,
               "stream_options": {"include_usage": True},
               **({"ignore_eos": True} if ignore_eos else {})}
              for text, r in zip(prompts, reqs)]
    records = [RequestRecord(i, r.prompt_len, r.output_len) for i, r in enumerate(reqs)]
    times = [r.arrival_time_s for r in reqs]
    wall = _run_sync(_run(base_url, bodies, records, times, concurrency, timeout_s, progress,
                          clock, transport))
    result = summarize(records, wall)
    result["settings"] = {"base_url": base_url, "model": model, "rate": rate,
                          "concurrency": concurrency, "arrivals": arrivals if rate else None,
                          "workload": workload_name, "seed": seed, "max_model_len": max_len}
    result["requests"] = [dict(asdict(r), chunk_times_s=None) for r in records]
    return result


def format_summary(r: dict) -> str:
    """Plain-text table of :func:`run_loadtest`'s result."""
    s = r["settings"]
    mode = (f"concurrency {s['concurrency']}" if s["concurrency"]
            else f"{s['arrivals']} arrivals at {s['rate']:g} req/s")
    lines = [f"{r['num_requests']} requests to {s['base_url']} ({s['model']}), {mode}: "
             f"{r['num_ok']} ok, {r['num_errors']} errors, {r['wall_s']:.3g} s",
             f"throughput: {r['output_tokens_per_s']:.4g} output tokens/s, "
             f"{r['requests_per_s']:.4g} requests/s",
             f"{'':24}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}"]
    for key, name in (("ttft_s", "TTFT (ms)"), ("tpot_s", "time/output token (ms)"),
                      ("e2e_s", "end-to-end (ms)")):
        v = r[key]
        lines.append(f"{name:24}" + "".join(f"{1e3 * v[q]:10.4g}" for q in
                                             ("mean", "p50", "p90", "p99")))
    lines += [f"error: {e}" for e in r["errors"]]
    return "\n".join(lines)
