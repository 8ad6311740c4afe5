"""Prefill/decode disaggregation: one engine reads prompts, another generates, the KV cache
moves between them.

In one engine (*colocated*) every step mixes the prompts of new requests with the decode
tokens of running ones, so a long prompt stretches the step every running request waits on:
its time per output token (TPOT) jumps whenever a prefill arrives. Disaggregation gives each
phase its own engine (its own GPUs, in production)::

    requests ──▶ PrefillWorker ──(first token + K/V of the prompt)──▶ DecodeWorker ──▶ outputs
                 LLMEngine: prompts only                               LLMEngine: decodes only
                 (chunked, batched)                                    (never interrupted)

A request's first token comes out of the prefill engine (its time to first token, TTFT, is
queueing + prefill there); its K/V then move (:mod:`llminfra.cluster.kv_transfer`) and the
decode engine continues it to the end. Each phase can then meet its own latency target with
its own resources: DistServe's goodput argument (Zhong et al. 2024, arXiv:2401.09670, §2-3),
Splitwise's "phase splitting" (Patel et al. 2024, arXiv:2311.18677, §4). The price: the KV
transfer, and two pools that each sit idle when the load leans to the other phase
(:mod:`llminfra.sim.disagg` shows both at scale).

This module holds the two workers and an in-process driver (:func:`run_local`: both engines
stepped in turn, the handoff passed by reference) — what the fast tests and chapter 11's first
cells run. :mod:`.disagg_process` runs each worker in a process of its own and moves the K/V
over torch.distributed (gloo). Failures never lose a request: a handoff whose import fails is
retried ``max_import_retries`` times, then the request ends with finish reason ``"error"`` and
its reason; an import that fails leaves no block behind (``import_kv`` is all or nothing).
Taught in chapter 11.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence as Seq

from llminfra.cluster.kv_transfer import KVHandoff, can_import, hand_off, import_kv
from llminfra.engine.engine import LLMEngine
from llminfra.engine.metrics import RequestMetrics
from llminfra.engine.sampling_params import SamplingParams, pair_with_params
from llminfra.engine.sequence import CompletionOutput, RequestOutput
from llminfra.validate import non_negative_int

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """A failure a test asked for (:class:`DecodeWorker`'s ``fail_on``)."""


class PrefillWorker:
    """Runs prompts on its engine; each request leaves as a :class:`KVHandoff` right after the
    step that sampled its first token (so this engine never runs a decode step). A request that
    finished at its first token (EOS, ``max_tokens = 1``, a stop string) or failed comes back
    as a final :class:`RequestOutput` instead."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.num_handed_off = 0

    def add_request(self, prompt, params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a request (:meth:`LLMEngine.add_request`, ``n = 1`` only)."""
        if params is not None and params.n != 1:
            raise ValueError(f"disaggregated serving hands off one completion per request; "
                             f"got n = {params.n}")
        return self.engine.add_request(prompt, params, request_id, arrival_time)

    def has_work(self) -> bool:
        """True while a prompt waits or runs."""
        return self.engine.has_unfinished_requests()

    def step(self) -> tuple[list[KVHandoff], list[RequestOutput]]:
        """One engine step: the handoffs of requests that got their first token, and the final
        outputs of requests that ended here."""
        handoffs, finished = [], []
        for out in self.engine.step():
            if out.finished:
                finished.append(out)
            elif out.outputs[0].token_ids:
                handoffs.append(hand_off(self.engine, out.request_id))
        self.num_handed_off += len(handoffs)
        return handoffs, finished


def failed_output(handoff: KVHandoff, reason: str, now: float) -> RequestOutput:
    """The final output of a handed-off request that could not go on: finish reason
    ``"error"``, the tokens it had, and ``reason``."""
    metrics = RequestMetrics(arrival_time=handoff.arrival_time,
                             first_scheduled_time=handoff.first_scheduled_time)
    for t in handoff.token_times:
        metrics.record_token(t, False)
    metrics.finished_time = now
    comp = CompletionOutput(0, "", list(handoff.output_token_ids), "error")
    return RequestOutput(handoff.request_id, handoff.prompt, list(handoff.prompt_token_ids),
                         [comp], True, metrics, reason)


class DecodeWorker:
    """Adopts handed-off requests into its engine (as blocks and ``max_num_seqs`` allow; the
    rest wait in ``inbox``, first come first served) and runs their decode steps.

    ``max_import_retries``: how often a failed import is tried again before the request ends
    with ``"error"``. ``fail_on`` {request id: number of imports to fail} injects faults
    (:class:`InjectedFault`, raised after the K/V are written, so the clean-up is exercised).
    """

    def __init__(self, engine: LLMEngine, max_import_retries: int = 1,
                 fail_on: Mapping[str, int] | None = None):
        non_negative_int("max_import_retries", max_import_retries)
        self.engine, self.max_import_retries = engine, max_import_retries
        self.inbox: deque[KVHandoff] = deque()
        self.fail_on = dict(fail_on or {})
        self.attempts: dict[str, int] = {}
        self.num_retries = 0
        self._failed: list[RequestOutput] = []

    def receive(self, handoff: KVHandoff) -> None:
        """Queue a handoff for adoption."""
        self.inbox.append(handoff)

    def has_work(self) -> bool:
        """True while a handoff waits or a request runs (or a failure is still to report)."""
        return bool(self.inbox or self._failed) or self.engine.has_unfinished_requests()

    def _fault(self, rid: str):
        if self.fail_on.get(rid, 0) <= 0:
            return None

        def fail() -> None:
            self.fail_on[rid] -= 1
            raise InjectedFault(f"injected fault importing request {rid!r}")
        return fail

    def adopt(self) -> int:
        """Import waiting handoffs while they fit; returns how many were adopted."""
        adopted = 0
        while self.inbox and can_import(self.engine, self.inbox[0]):
            h = self.inbox.popleft()
            try:
                import_kv(self.engine, h, before_commit=self._fault(h.request_id))
                adopted += 1
            except Exception as err:  # noqa: BLE001 - retried, or this request fails alone
                n = self.attempts[h.request_id] = self.attempts.get(h.request_id, 0) + 1
                log.warning("import of request %s failed (attempt %d): %s", h.request_id, n, err)
                if n <= self.max_import_retries:
                    self.num_retries += 1
                    self.inbox.appendleft(h)
                else:
                    self._failed.append(failed_output(
                        h, f"KV import failed after {n} attempts: {type(err).__name__}: {err}",
                        self.engine.clock()))
        return adopted

    def step(self) -> list[RequestOutput]:
        """Adopt what fits, run one engine step; the final outputs of requests that ended."""
        self.adopt()
        done, self._failed = self._failed, []
        if self.engine.has_unfinished_requests():
            done += [o for o in self.engine.step() if o.finished]
        return done


def run_local(prefill_engine: LLMEngine, decode_engine: LLMEngine, prompts,
              sampling_params: SamplingParams | Seq[SamplingParams] | None = None, *,
              max_import_retries: int = 1, fail_on: Mapping[str, int] | None = None,
              ) -> list[RequestOutput]:
    """Serve ``prompts`` disaggregated inside this process: the prefill and the decode worker
    step in turn, handoffs pass by reference. Final outputs in prompt order (request ids
    ``"0"``, ``"1"``, ...); greedy outputs equal :meth:`LLMEngine.generate` on one engine."""
    if prefill_engine is decode_engine:
        raise ValueError("run_local needs two engines (a prefill and a decode one)")
    pw = PrefillWorker(prefill_engine)
    dw = DecodeWorker(decode_engine, max_import_retries, fail_on)
    ids = [pw.add_request(p, sp) for p, sp in pair_with_params(prompts, sampling_params)]
    final: dict[str, RequestOutput] = {}
    while pw.has_work() or dw.has_work():
        handoffs, finished = pw.step() if pw.has_work() else ([], [])
        for h in handoffs:
            dw.receive(h)
        for out in finished + dw.step():
            final[out.request_id] = out
        if not pw.has_work() and dw.inbox and not dw.engine.has_unfinished_requests() \
                and not can_import(dw.engine, dw.inbox[0]):
            h = dw.inbox.popleft()                       # can never fit this engine
            final[h.request_id] = failed_output(h, "the decode engine's pool cannot hold "
                                                   f"{h.num_tokens} tokens", dw.engine.clock())
    return [final[i] for i in ids]
