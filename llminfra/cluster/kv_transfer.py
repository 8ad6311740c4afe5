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
completion per request (``n = 1``) and no speculative decoding.

A handoff that crosses a process boundary travels as data only: :func:`handoff_meta` is its
metadata as a JSON object (no code, no class names), :func:`handoff_from_meta` reads one back
and checks every field (types, ranges, lengths, the K/V dtype against :data:`KV_DTYPES`, a
five-dimensional K/V shape), raising ``ValueError`` naming the field at fault. Taught in
chapter 11.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from llminfra.engine.sampling_params import SamplingParams, clip_repr
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


#: K/V dtypes a handoff may carry, by name (an integer K/V would be cast silently into wrong
#: values); the largest element is 8 bytes
KV_DTYPES = {str(t): t for t in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}
#: the most tokens (prompt or generated), token times and characters a handoff's metadata holds
MAX_META_ITEMS = 2**20
#: the fields of the metadata object (:func:`handoff_meta`)
META_FIELDS = ("request_id", "prompt", "prompt_token_ids", "output_token_ids", "params",
               "arrival_time", "first_scheduled_time", "token_times", "generator_state",
               "output_logprobs", "kv")
_PARAM_FIELDS = tuple(f.name for f in fields(SamplingParams))


def handoff_meta(h: KVHandoff) -> dict:
    """The JSON-ready metadata of ``h``: every field but the K/V values, which travel apart;
    ``"kv"`` gives their ``shape`` and ``dtype`` name. The generator state is base64 text,
    ``logit_bias`` a list of ``[token id, bias]`` pairs (JSON keys are strings)."""
    params = {name: getattr(h.params, name) for name in _PARAM_FIELDS}
    if params["logit_bias"] is not None:
        params["logit_bias"] = [[int(k), float(v)] for k, v in params["logit_bias"].items()]
    if params["stop"] is not None:
        params["stop"] = list(params["stop"])
    state = h.generator_state
    return {"request_id": h.request_id, "prompt": h.prompt,
            "prompt_token_ids": [int(t) for t in h.prompt_token_ids],
            "output_token_ids": [int(t) for t in h.output_token_ids], "params": params,
            "arrival_time": float(h.arrival_time),
            "first_scheduled_time": (None if h.first_scheduled_time is None
                                     else float(h.first_scheduled_time)),
            "token_times": [float(t) for t in h.token_times],
            "generator_state": (None if state is None else base64.b64encode(
                state.to(torch.uint8).numpy().tobytes()).decode("ascii")),
            "output_logprobs": (None if h.output_logprobs is None else
                                [[int(t), float(lp), [[int(i), float(v)] for i, v in top]]
                                 for t, lp, top in h.output_logprobs]),
            "kv": {"shape": [int(n) for n in h.kv.shape], "dtype": str(h.kv.dtype)}}


def _bad(name: str, value, allowed: str) -> ValueError:
    return ValueError(f"handoff metadata: {name} must be {allowed}, got {clip_repr(value)}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _token_ids(name: str, v) -> list[int]:
    if not isinstance(v, list) or len(v) > MAX_META_ITEMS \
            or not all(_is_int(t) and 0 <= t < 2**31 for t in v):
        raise _bad(name, v, f"a list of at most {MAX_META_ITEMS} token ids (ints in [0, 2**31))")
    return v


def _time(name: str, v, optional: bool = False) -> float | None:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(name, v, "a finite number" + (" or null" if optional else ""))
    return float(v)


def _params(v) -> SamplingParams:
    if not isinstance(v, dict) or not set(v) <= set(_PARAM_FIELDS):
        raise _bad("params", v, f"an object with keys among {', '.join(_PARAM_FIELDS)}")
    v = dict(v)
    bias = v.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, list) or not all(isinstance(p, list) and len(p) == 2
                                                 and _is_int(p[0]) for p in bias):
            raise _bad("params.logit_bias", bias, "null or a list of [token id, bias] pairs")
        v["logit_bias"] = {k: b for k, b in bias}
    if isinstance(v.get("stop"), list):
        v["stop"] = tuple(v["stop"])
    try:
        return SamplingParams(**v)                 # validates every value
    except (TypeError, ValueError) as err:
        raise ValueError(f"handoff metadata: params: {err}") from None


def _generator_state(v) -> torch.Tensor | None:
    if v is None:
        return None
    try:
        if not isinstance(v, str) or len(v) > MAX_META_ITEMS:
            raise ValueError
        raw = base64.b64decode(v, validate=True)
    except (ValueError, binascii.Error):
        raise _bad("generator_state", v, "null or base64 text") from None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(
        0, dtype=torch.uint8)


def _logprobs(v) -> list | None:
    if v is None:
        return None

    def pair(p) -> bool:
        return isinstance(p, list) and len(p) == 2 and _is_int(p[0]) \
            and isinstance(p[1], (int, float)) and not isinstance(p[1], bool)
    if not isinstance(v, list) or len(v) > MAX_META_ITEMS or not all(
            isinstance(e, list) and len(e) == 3 and pair(e[:2]) and isinstance(e[2], list)
            and all(pair(p) for p in e[2]) for e in v):
        raise _bad("output_logprobs", v, "null or a list of [token, logprob, [[id, logprob], "
                                         "...]] entries")
    return [(t, float(lp), [(i, float(x)) for i, x in top]) for t, lp, top in v]


def _kv_spec(v) -> tuple[tuple[int, ...], str]:
    shape = v.get("shape") if isinstance(v, dict) else None
    if not isinstance(shape, list) or len(shape) != 5 \
            or not all(_is_int(n) and 0 <= n < 2**31 for n in shape):
        raise _bad("kv.shape", shape, "a list of five ints in [0, 2**31): (2, L, T, H_kv, d)")
    dtype = v.get("dtype")
    if dtype not in KV_DTYPES:
        raise _bad("kv.dtype", dtype, "one of " + ", ".join(KV_DTYPES))
    return tuple(shape), dtype


def handoff_from_meta(meta) -> tuple[KVHandoff, tuple[int, ...], str]:
    """The handoff :func:`handoff_meta` described (its ``kv`` an empty placeholder), the K/V
    shape and dtype name; ``ValueError`` naming the first field that is missing, of the wrong
    type or out of range (no field is trusted: it came from another process)."""
    if not isinstance(meta, dict) or set(meta) != set(META_FIELDS):
        got = sorted(meta) if isinstance(meta, dict) else meta
        raise _bad("the metadata", got, "an object with exactly the keys "
                                        + ", ".join(META_FIELDS))
    rid, prompt = meta["request_id"], meta["prompt"]
    if not isinstance(rid, str) or not 0 < len(rid) <= 256:
        raise _bad("request_id", rid, "a string of 1 to 256 characters")
    if prompt is not None and (not isinstance(prompt, str) or len(prompt) > MAX_META_ITEMS):
        raise _bad("prompt", prompt, f"null or a string of at most {MAX_META_ITEMS} characters")
    times = meta["token_times"]
    if not isinstance(times, list) or len(times) > MAX_META_ITEMS:
        raise _bad("token_times", times, f"a list of at most {MAX_META_ITEMS} numbers")
    h = KVHandoff(rid, prompt, _token_ids("prompt_token_ids", meta["prompt_token_ids"]),
                  _token_ids("output_token_ids", meta["output_token_ids"]),
                  _params(meta["params"]), torch.empty(0),
                  _time("arrival_time", meta["arrival_time"]),
                  _time("first_scheduled_time", meta["first_scheduled_time"], optional=True),
                  [_time("token_times[]", t) for t in times],
                  _generator_state(meta["generator_state"]), _logprobs(meta["output_logprobs"]))
    return (h, *_kv_spec(meta["kv"]))


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
