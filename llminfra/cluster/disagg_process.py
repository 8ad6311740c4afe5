"""Prefill and decode workers in two processes, the KV cache sent over torch.distributed (gloo).

``serve_disaggregated(requests, model="tiny")`` spawns two ranks of a gloo group on this
machine: rank 0 runs a :class:`~llminfra.cluster.disagg.PrefillWorker` (requests enter it when
their arrival time has passed), rank 1 a :class:`~llminfra.cluster.disagg.DecodeWorker`. Each
handoff goes rank 0 → rank 1 as the three messages of :mod:`llminfra.cluster.kv_link`: the
decode process receives on a thread of its own, so its decode steps never wait for a transfer;
the prefill process sends synchronously, so each handoff's transfer time is measured there.
The link's rate on this machine is measured at start-up (``link``: MB/s per message size, one
way plus a one-element acknowledgement).

Both processes time events on ``time.monotonic`` (one system-wide clock on Linux), so TTFT,
TPOT and the handoff delay are read across them. Failures: every request comes back — a
worker that dies (exit code, no report) fails the requests it held with the reason named;
the surviving decode worker finishes what it has already adopted. (That is why the two
ranks are spawned here rather than by :func:`llminfra.parallel.launch.launch`, which stops
every rank as soon as one dies: the survivor's outputs would be lost.) Each worker reports its
pool's free blocks at the end (``blocks_free == blocks_total``: nothing leaked). Taught in
chapter 11.
"""

from __future__ import annotations

import datetime
import math
import multiprocessing as mp
import os
import queue
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from llminfra.cluster.disagg import DecodeWorker, PrefillWorker, failed_output
from llminfra.cluster.kv_link import (CORRUPTIONS, DONE, Refused, measure_link, recv_loop,
                                      send_done, send_handoff)
from llminfra.engine.engine import LLMEngine
from llminfra.engine.metrics import RequestMetrics
from llminfra.engine.sampling_params import SamplingParams
from llminfra.engine.sequence import CompletionOutput, RequestOutput
from llminfra.model import load_model
from llminfra.parallel.launch import free_port


@dataclass(frozen=True)
class TimedRequest:
    """A prompt (text or token ids), its sampling parameters, and when it arrives (seconds
    after the start)."""

    prompt: str | list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    arrival_s: float = 0.0


@dataclass(frozen=True)
class WorkerConfig:
    """What both ranks need: the model (a name :func:`llminfra.model.load_model` takes), engine
    keyword arguments, threads per worker, and the fault injections of the tests."""

    model: str = "tiny"
    engine_kwargs: tuple = ()
    threads: int = 1
    max_import_retries: int = 1
    fail_on: tuple = ()
    prefill_exit_after: int | None = None
    timeout_s: float = 120.0
    corrupt: tuple = ()


def _prefill(engine, cfg: WorkerConfig, requests, t0: float, out: mp.Queue) -> dict:
    pw, i, transfers = PrefillWorker(engine), 0, []
    while i < len(requests) or pw.has_work():
        while i < len(requests) and requests[i].arrival_s <= time.monotonic() - t0:
            r = requests[i]
            try:
                pw.add_request(r.prompt, r.params, str(i), arrival_time=t0 + r.arrival_s)
            except ValueError as err:         # too long for the context, a bad parameter …
                out.put(("output", _lost(str(i), r, t0, f"refused: {err}")))
            i += 1
        if not pw.has_work():
            time.sleep(max(0.0, min(0.05, t0 + requests[i].arrival_s - time.monotonic())))
            continue
        handoffs, finished = pw.step()
        for o in finished:
            out.put(("output", o))
        for h in handoffs:
            t = time.monotonic()
            send_handoff(h, dst=1, corrupt=dict(cfg.corrupt).get(h.request_id))
            transfers.append({"request_id": h.request_id, "bytes": h.nbytes,
                              "tokens": h.num_tokens, "seconds": time.monotonic() - t})
            if cfg.prefill_exit_after is not None and pw.num_handed_off >= \
                    cfg.prefill_exit_after:
                out.close()
                out.join_thread()                      # what was put gets out first
                os._exit(3)                            # injected: the prefill worker dies
    send_done(dst=1)
    return {"transfers": transfers, "num_handed_off": pw.num_handed_off}


def _drain(inbox: queue.Queue, block: bool) -> list:
    """Everything in ``inbox`` now (waiting up to 50 ms for a first item if ``block``)."""
    items = []
    try:
        items.append(inbox.get(timeout=0.05) if block else inbox.get_nowait())
        while True:
            items.append(inbox.get_nowait())
    except queue.Empty:
        return items


def _decode(engine, cfg: WorkerConfig, out: mp.Queue) -> dict:
    dw = DecodeWorker(engine, cfg.max_import_retries, dict(cfg.fail_on))
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=recv_loop, args=(0, inbox), daemon=True).start()
    ended, lost, delays, refused, refused_ids = False, None, [], [], {}
    while True:
        for item in _drain(inbox, block=not dw.has_work() and not ended):
            if isinstance(item, int) and item == DONE:
                ended = True
            elif isinstance(item, Exception):
                ended, lost = True, f"{type(item).__name__}: {item}"
            elif isinstance(item, Refused):
                refused.append(item.reason)
                if item.request_id is not None:
                    refused_ids[item.request_id] = item.reason
                if item.handoff is not None:
                    out.put(("output", failed_output(item.handoff, item.reason,
                                                     engine.clock())))
            else:
                delays.append(time.monotonic() - item.token_times[0])
                dw.receive(item)
        if dw.has_work():
            for o in dw.step():
                out.put(("output", o))
        elif ended and inbox.empty():
            break
    return {"link_lost": lost, "num_retries": dw.num_retries,
            "handoff_delay_s": delays, "refused": refused, "refused_ids": refused_ids}


def _worker(rank: int, port: int, cfg: WorkerConfig, requests, out: mp.Queue) -> None:
    """One rank: init gloo, load the model, measure the link, agree on t0, serve, report."""
    torch.set_num_threads(cfg.threads)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2, timeout=datetime.timedelta(seconds=cfg.timeout_s))
        model, tok = load_model(cfg.model)
        engine = LLMEngine(model, tok, clock=time.monotonic, **dict(cfg.engine_kwargs))
        link = measure_link(rank)
        t0 = torch.tensor([time.monotonic() + 0.05], dtype=torch.float64)
        dist.send(t0, dst=1) if rank == 0 else dist.recv(t0, src=0)
        out.put(("t0", float(t0)))
        stats = (_prefill(engine, cfg, requests, float(t0), out) if rank == 0
                 else _decode(engine, cfg, out))
        alloc = engine.cache.allocator
        alloc.check_invariants()
        stats.update(link_mb_per_s=link, blocks_free=alloc.num_free,
                     blocks_total=alloc.num_blocks, threads=torch.get_num_threads())
        out.put(("result", rank, stats))
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        out.put(("error", rank, f"{type(err).__name__}: {err}"))
    out.close()
    out.join_thread()
    os._exit(0)            # skip gloo's teardown (its receiving thread may still be blocked)


def _collect(procs, out: mp.Queue, deadline: float) -> tuple[dict, dict, float]:
    outputs, reports, t0 = {}, {}, math.nan
    while len(reports) < 2 and time.monotonic() < deadline:
        try:
            item = out.get(timeout=0.1)
        except queue.Empty:
            for r, p in enumerate(procs):
                if r not in reports and p.exitcode not in (None, 0) and out.empty():
                    reports[r] = {"died": f"exit code {p.exitcode}"}
            continue
        if item[0] == "output":
            outputs[item[1].request_id] = item[1]
        elif item[0] == "t0":
            t0 = item[1]
        elif item[0] == "result":
            reports[item[1]] = item[2]
        else:
            reports[item[1]] = {"died": item[2]}
    return outputs, reports, t0


def _lost(rid: str, r: TimedRequest, t0: float, reason: str) -> RequestOutput:
    m = RequestMetrics(arrival_time=t0 + r.arrival_s, finished_time=time.monotonic())
    ids = r.prompt if isinstance(r.prompt, list) else []
    return RequestOutput(rid, r.prompt if isinstance(r.prompt, str) else None, ids,
                         [CompletionOutput(0, "", [], "error")], True, m, reason)


def serve_disaggregated(requests: list[TimedRequest], *, model: str = "tiny",
                        engine_kwargs: dict | None = None, threads_per_worker: int = 1,
                        max_import_retries: int = 1, fail_on: dict | None = None,
                        prefill_exit_after: int | None = None,
                        timeout_s: float = 120.0,
                        corrupt_handoffs: dict | None = None) -> dict:
    """Serve ``requests`` (request ids ``"0"``, ``"1"``, ... in list order) on a prefill and a
    decode process. Returns ``{"outputs": [RequestOutput in order], "prefill": {...},
    "decode": {...}}`` — each worker's report (transfers, link MB/s, free / total blocks,
    retries) or ``{"died": reason}``. Every request has an output: one a dead worker held ends
    with ``"error"`` and says so, as does one refused (too long for the context, a bad
    parameter) or whose handoff the decode worker refused (``report["decode"]["refused"]``;
    the request's own reason where its id could be read, ``report["decode"]["refused_ids"]``).
    ``fail_on`` / ``prefill_exit_after`` / ``corrupt_handoffs`` ({request id: one of
    :data:`CORRUPTIONS` or ``"pickle:PATH"``}) inject faults."""
    for rid, how in (corrupt_handoffs or {}).items():
        if how not in CORRUPTIONS and not (isinstance(how, str) and how.startswith("pickle:")):
            raise ValueError(f"corrupt_handoffs[{rid!r}] must be one of {CORRUPTIONS} or "
                             f"'pickle:PATH', got {how!r}")
    if not requests:
        raise ValueError("requests is empty; give at least one TimedRequest")
    if sorted(r.arrival_s for r in requests) != [r.arrival_s for r in requests]:
        raise ValueError("requests must be in arrival order (arrival_s non-decreasing)")
    cfg = WorkerConfig(model, tuple(sorted((engine_kwargs or {}).items())), threads_per_worker,
                       max_import_retries, tuple(sorted((fail_on or {}).items())),
                       prefill_exit_after, timeout_s,
                       tuple(sorted((corrupt_handoffs or {}).items())))
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, cfg, list(requests), out), daemon=True)
             for r in range(2)]
    try:
        for p in procs:
            p.start()
        outputs, reports, t0 = _collect(procs, out, time.monotonic() + timeout_s)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    for rank in (0, 1):
        reports.setdefault(rank, {"died": f"no report within {timeout_s} s"})
    dead = [f"{('prefill', 'decode')[k]} worker died ({reports[k]['died']})"
            for k in (0, 1) if "died" in reports[k]]
    if reports[1].get("link_lost"):
        dead.append(f"the link to the decode worker was lost ({reports[1]['link_lost']})")
    if reports[1].get("refused"):
        dead.append("the decode worker refused: " + "; ".join(reports[1]["refused"]))
    by_id = reports[1].get("refused_ids", {})
    final = [outputs.get(str(i)) or (
        _lost(str(i), r, t0, "refused by the decode worker: " + by_id[str(i)])
        if str(i) in by_id else
        _lost(str(i), r, t0, "lost: " + "; ".join(dead or ["no output"])))
        for i, r in enumerate(requests)]
    return {"outputs": final, "prefill": reports[0], "decode": reports[1]}
