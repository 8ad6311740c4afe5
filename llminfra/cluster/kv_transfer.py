"""Moving a request's KV cache from one engine to another: the seam of prefill/decode
disaggregation.

A *prefill* engine runs a request's prompt and samples its first token; at that moment the
request's K/V (one vector pair per prompt token and layer) sit in that engine's paged pool,
scattered over the blocks its block table lists. :func:`hand_off` reads exactly those blocks
out of the pool (``pool[:, blocks]``, then the first T token slots) into one tensor and drops
the request from the prefill engine, its blocks freed. A *decode* engine then
:func:`import_kv`: it allocates blocks for the T tokens in its own pool (any physical ids, any
block size), writes the K/V into their slots, and puts the sequence straight into its running
queue with ``num_computed_tokens = T`` and the first token already generated, so the next step
is that request's first decode step. Nothing is recomputed::

    prefill engine                                        decode engine
    pool (L, NB, B, H_kv, d) ──gather blocks──▶ kv (2, L, T, H_kv, d) ──scatter slots──▶ pool'
    block table [7, 2, 9]                       (+ prompt, first token,   block table' [0, 1, 4]
                                                 sampler state, times)

This is the KV-cache transfer of DistServe (Zhong et al. 2024, arXiv:2401.09670, §4) and
Splitwise (Patel et al. 2024, arXiv:2311.18677, §4.2), in our engine's accounting: a sequence
is just tokens plus a count of computed tokens (:mod:`~llminfra.engine.scheduler`), so
"adopting" one whose K/V came from elsewhere is setting that count. The sampler's generator
state travels too, so seeded sampling continues exactly as one engine would have gone on. One
completion per request (``n = 1``) and no speculative decoding. Taught in chapter 11.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llminfra.engine.sampling_params import SamplingParams
from llminfra.engine.sequence import SequenceStatus
from llminfra.kvcache.blocks import BlockPoolExhausted, blocks_needed


@dataclass
class KVHandoff:
    """Everything a decode engine needs to continue a request: prompt, the tokens generated so
    far (the first one), the K/V of the ``T`` computed tokens ``kv`` ``(2, L, T, H_kv, d)``
    (K then V), the sampling parameters and generator state, and its timestamps (seconds on
    the clock the engines share)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    kv: torch.Tensor
    arrival_time: float
    first_scheduled_time: float | None
    token_times: list[float]
    generator_state: torch.Tensor | None = None
    output_logprobs: list | None = None

    @property
    def num_tokens(self) -> int:
        """T: tokens whose K/V travel."""
        return int(self.kv.shape[2])

    @property
    def nbytes(self) -> int:
        """Bytes of K/V moved: ``2 · L · T · H_kv · d · bytes(dtype)``."""
        return self.kv.numel() * self.kv.element_size()


def _request(engine, request_id: str):
    req = engine.requests.get(str(request_id))
    if req is None:
        raise KeyError(f"no live request {request_id!r}; live: {sorted(engine.requests)[:10]}")
    return req


def export_kv(engine, request_id: str) -> KVHandoff:
    """A copy of request ``request_id``'s state and K/V, read from ``engine``'s pool through its
    block table; the engine keeps the request. ``ValueError`` unless it has one completion,
    has generated at least one token, still holds its blocks, and the engine does not
    speculate."""
    req = _request(engine, request_id)
    if engine.speculator is not None:
        raise ValueError("export_kv: an engine with speculative decoding cannot hand off "
                         "requests (drafts sit in the cache past num_computed_tokens)")
    if len(req.seqs) != 1:
        raise ValueError(f"export_kv: request {request_id!r} has n = {len(req.seqs)} "
                         "completions; only n = 1 can be handed off")
    seq = req.seqs[0]
    if seq.status is not SequenceStatus.RUNNING or not seq.output_token_ids:
        raise ValueError(f"export_kv: request {request_id!r} must be running with its first "
                         f"token sampled, it is {seq.status.name} with "
                         f"{len(seq.output_token_ids)} tokens")
    kv = engine.cache.read_kv(seq.cache_seq, seq.num_computed_tokens)  # (2, L, T, H_kv, d)
    m = req.metrics
    return KVHandoff(req.request_id, req.prompt, list(req.prompt_token_ids),
                     list(seq.output_token_ids), req.params, kv,
                     m.arrival_time, m.first_scheduled_time, list(m.token_times),
                     None if seq.generator is None else seq.generator.get_state(),
                     list(seq.output_logprobs) if seq.params.logprobs is not None else None)


def release(engine, request_id: str) -> None:
    """Drop request ``request_id`` from ``engine`` without an output (it lives on elsewhere):
    its sequences leave every queue and their blocks go back to the pool."""
    req = _request(engine, request_id)
    req.forks_pending = []
    for seq in req.seqs:
        if not seq.status.is_finished:
            engine.scheduler.abort(seq, SequenceStatus.FINISHED_ABORTED)
    engine.requests.pop(req.request_id, None)


def hand_off(engine, request_id: str) -> KVHandoff:
    """:func:`export_kv` then :func:`release`: the request leaves ``engine`` with its K/V."""
    handoff = export_kv(engine, request_id)
    release(engine, request_id)
    return handoff


def can_import(engine, handoff: KVHandoff) -> bool:
    """True if ``engine`` has the free blocks for the handoff's T tokens plus the next one, and
    room under ``max_num_seqs``."""
    need = blocks_needed(handoff.num_tokens + 1, engine.cache.block_size)
    running = sum(s.group_size for s in engine.scheduler.running)
    return (need <= engine.cache.num_free_blocks
            and running + 1 <= engine.config.max_num_seqs)


def import_kv(engine, handoff: KVHandoff,
              before_commit: Callable[[], None] | None = None) -> str:
    """Adopt a handed-off request into ``engine``: allocate blocks for its T tokens, write the
    K/V into their slots, and queue the sequence as running with ``num_computed_tokens = T``
    and its generated tokens; its next step is a decode step. Returns the request id.

    All or nothing: if anything fails — no free block (:class:`BlockPoolExhausted`), a shape
    that does not fit the pool or a K/V that is not floating point (``ValueError``), or ``before_commit`` (a fault-injection point
    for tests, called once the K/V are written) raising — the blocks go back and the engine
    holds nothing of the request; the exception propagates.
    """
    try:
        engine.cache.check_kv(handoff.kv)            # before the request is registered
    except ValueError as err:
        raise ValueError(f"import_kv: {err}") from None
    T = handoff.num_tokens
    if T != len(handoff.prompt_token_ids) + len(handoff.output_token_ids) - 1:
        raise ValueError(f"import_kv: {T} tokens of K/V for {len(handoff.prompt_token_ids)} "
                         f"prompt + {len(handoff.output_token_ids)} generated tokens; expected "
                         "all but the last")
    if blocks_needed(T, engine.cache.block_size) > engine.cache.num_free_blocks:
        raise BlockPoolExhausted(f"import_kv: {T} tokens need "
                                 f"{blocks_needed(T, engine.cache.block_size)} blocks, "
                                 f"{engine.cache.num_free_blocks} free")
    rid = engine.add_request(handoff.prompt_token_ids, handoff.params, handoff.request_id,
                             arrival_time=handoff.arrival_time)
    req = engine.requests[rid]
    seq = req.seqs[0]

    def fill(cache_seq: int) -> None:
        engine.cache.write_kv(cache_seq, handoff.kv)
        _restore(engine, seq, handoff)
        if before_commit is not None:
            before_commit()
    try:
        engine.scheduler.adopt(seq, T, fill, handoff.output_token_ids, handoff.output_logprobs)
    except BaseException:
        engine.requests.pop(rid, None)
        raise
    req.prompt = handoff.prompt
    m = req.metrics
    m.first_scheduled_time = handoff.first_scheduled_time
    for t in handoff.token_times:
        m.record_token(t, False)
    return rid


def _restore(engine, seq, handoff: KVHandoff) -> None:
    """The state an adopted request's sequence holds beside its fields: its grammar and its
    generator (its generated tokens and log-probabilities the scheduler writes, in
    :meth:`~llminfra.engine.scheduler.Scheduler.adopt`)."""
    if seq.grammar is not None:
        for token in handoff.output_token_ids:
            seq.grammar.advance(token)
    if seq.generator is not None and handoff.generator_state is not None:
        seq.generator.set_state(handoff.generator_state)
