"""LLMEngine: continuous batching on a paged KV cache, for any model of the package.

Each :meth:`LLMEngine.step` is one iteration of the serving loop (the structure of vLLM's
``LLMEngine.step`` and of nano-vllm's ``LLMEngine``)::

    schedule  ─▶  reserve slots + StepMetadata  ─▶  model(tokens, cache, meta)  ─▶  sample
        ▲              (cache.prepare_step)            one ragged forward pass        │
        └──────────── retire finished sequences, free their blocks ◀───────────────────┘

The scheduler (:mod:`.scheduler`) decides which sequences run and how many tokens each brings (a
prompt chunk or one decode token); the paged cache reserves their slots once per step; the
model runs every token of the step in one flat batch; the sampler draws one token for every
sequence whose known tokens are now all in the cache. Under static and dynamic batching the
flat batch also holds the *padding rows* of finished batch members (one pad token each, computed
and thrown away: :mod:`.scheduler`), so a step has the shape a fixed-batch baseline would run. Timestamps of every request are kept
(:mod:`.metrics`). One request cannot stop the others: a step whose sampling (or stop-string
check) fails for a sequence fails that sequence's request — finish reason ``"error"``, the
reason in ``RequestOutput.error``, its blocks freed — and serves the rest; a forward pass that
raises fails the requests of that step (whose row broke it cannot be told) and the engine goes
on with the next. The engine runs whatever model it is given — the tiny model, a
``quantize_model`` copy of it, the ``bench-100m`` preset — on the device and dtype of its
weights. Taught in chapter 05.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence as Seq
from dataclasses import replace

import torch

from llminfra.engine.metrics import RequestMetrics
from llminfra.engine.model_runner import make_runner
from llminfra.engine.sampler import sample_step
from llminfra.engine.sampling_params import (InvalidParameter, SamplingParams, max_tokens_for,
                                              pair_with_params)
from llminfra.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from llminfra.engine.sequence import (Request, RequestOutput, Sequence, SequenceStatus,
                                      request_output)
from llminfra.engine.spec_decode import SpeculativeConfig, Speculator
from llminfra.kvcache.blocks import blocks_needed
from llminfra.kvcache.paged_cache import PagedKVCache
from llminfra.kvcache.prefix_cache import PrefixCachingAllocator

log = logging.getLogger(__name__)

#: default pool when num_blocks is None: max_num_seqs full contexts, but at most this many bytes
DEFAULT_KV_BYTES_CAP = 256 * 2**20


def _weight(model: torch.nn.Module) -> torch.Tensor:
    """The first floating-point parameter: its device and dtype become the cache's."""
    for p in model.parameters():
        if p.is_floating_point():
            return p
    raise ValueError("the model has no floating-point parameter to take a device/dtype from")


def default_num_blocks(config, block_size: int, max_num_seqs: int, dtype: torch.dtype) -> int:
    """Blocks for ``max_num_seqs`` sequences of the full context, capped at
    :data:`DEFAULT_KV_BYTES_CAP` of K/V (``2 · L · H_kv · d · bytes`` per token)."""
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * dtype.itemsize
    tokens = min(max_num_seqs * config.max_seq_len, DEFAULT_KV_BYTES_CAP // per_token)
    return max(blocks_needed(config.max_seq_len, block_size), blocks_needed(tokens, block_size))


class LLMEngine:
    """A serving engine: ``add_request`` / ``step`` / ``abort_request``, or ``generate``.

    ``policy``, ``max_num_seqs``, ``max_num_batched_tokens``, ``enable_chunked_prefill``,
    ``max_prefill_chunk_tokens``, ``preemption``, ``dynamic_window_s`` configure the
    :class:`~llminfra.engine.scheduler.Scheduler`; ``num_blocks`` × ``block_size`` the paged KV
    pool (default :func:`default_num_blocks`); ``enable_prefix_caching`` reuses the K/V of
    shared prompt prefixes; ``speculative`` (a :class:`~.spec_decode.SpeculativeConfig`) turns
    on speculative decoding. ``runner``: ``"readable"`` (the model as chapter 01 writes it,
    the default) or a runner factory from outside the engine, such as
    :func:`llminfra.runner.fast_runner` (fused weights, the C kernels, CUDA graphs:
    :mod:`.model_runner`, chapter 12). ``clock`` gives the timestamps (seconds); ``seed`` seeds the
    sampling of requests that give no seed of their own. Not thread-safe: a server calls
    ``add_request`` / ``abort_request`` / ``step`` from one thread (or under one lock).
    """

    def __init__(self, model, tokenizer, *, num_blocks: int | None = None, block_size: int = 16,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 512,
                 policy: str = "continuous", enable_chunked_prefill: bool = True,
                 enable_prefix_caching: bool = False, preemption: str = "recompute",
                 clock: Callable[[], float] = time.perf_counter,
                 max_prefill_chunk_tokens: int | None = None, dynamic_window_s: float = 0.05,
                 seed: int = 0, speculative: SpeculativeConfig | None = None,
                 runner="readable"):
        if not hasattr(model, "config") or not callable(model):
            raise ValueError("model must be a llminfra Transformer (with .config), got "
                             f"{type(model).__name__}")
        self.model, self.tokenizer, self.clock = model, tokenizer, clock
        #: tokens that end a sequence (the tokenizer's EOS and the chat end-of-turn)
        self.stop_token_ids = frozenset(getattr(tokenizer, "stop_token_ids", ()) or ()) | (
            {tokenizer.eos_token_id} if getattr(tokenizer, "eos_token_id", None) is not None
            else set())
        cfg = model.config
        self.config = SchedulerConfig(
            max_seq_len=cfg.max_seq_len, policy=policy, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            max_prefill_chunk_tokens=max_prefill_chunk_tokens, preemption=preemption,
            dynamic_window_s=dynamic_window_s, enable_prefix_caching=enable_prefix_caching)
        w = _weight(model)
        self.device, self.dtype = w.device, w.dtype
        if num_blocks is None:
            num_blocks = default_num_blocks(cfg, block_size, max_num_seqs, w.dtype)
        allocator = PrefixCachingAllocator(num_blocks, block_size) if enable_prefix_caching \
            else None
        self.cache = PagedKVCache.for_model(cfg, num_blocks, block_size, w.dtype, w.device,
                                            allocator)
        self.scheduler = Scheduler(self.config, self.cache, self.stop_token_ids,
                                   tokenizer.decode)
        #: proposes and verifies speculative drafts (None: plain decoding)
        self.speculator = (None if speculative is None
                           else Speculator(speculative, cfg.max_seq_len))
        #: runs each step on the device: the readable model, or a runner handed in
        #: (:mod:`.model_runner`)
        self.runner = make_runner(runner, model, self.cache, self.device,
                                  max_num_seqs=max_num_seqs)
        self.requests: dict[str, Request] = {}
        self._pending: list[Request] = []
        self._ids = itertools.count()
        self._seq_ids = itertools.count()
        self._seeds = torch.Generator().manual_seed(seed)
        self.counters = {"prompt_tokens_total": 0, "generation_tokens_total": 0,
                         "num_steps": 0, "num_finished": 0}
        #: set to a list to record ``(batch, seconds)`` of every step, batch = [(new, context)],
        #: padding rows last, as ``(1, context)``
        self.step_log: list | None = None
        #: the scheduler's decision of the last step (the batching timeline reads its padding)
        self.last_scheduled: SchedulerOutput | None = None

    # ---------------------------------------------------------------- requests
    def _encode(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            try:
                return prompt, list(self.tokenizer.encode(prompt))
            except UnicodeError as err:       # a lone surrogate such as "\ud800"
                raise InvalidParameter("prompt", f"prompt is not valid Unicode text: "
                                                 f"{err}") from None
        try:
            items = list(prompt)
            not_ids = [t for t in items if isinstance(t, bool) or not hasattr(t, "__index__")]
            ids = [] if not_ids else [t.__index__() for t in items]
        except (TypeError, ValueError) as err:
            raise InvalidParameter("prompt", f"prompt must be a str or a list of token ids, "
                                             f"got {type(prompt).__name__}") from err
        if not_ids:                           # 104.7 or '104' is not a token id
            raise InvalidParameter("prompt", f"token ids must be integers, got "
                                             f"{not_ids[:5]!r}")
        V = self.model.config.vocab_size
        bad = [t for t in ids if not 0 <= t < V]
        if bad:
            raise InvalidParameter("prompt", f"token ids must lie in [0, {V}), got {bad[:5]}")
        return None, ids

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> str:
        """Queue a request; returns its id. ``ValueError`` (an :class:`InvalidParameter` naming
        the field) for a request that breaks the length rule
        (:func:`~llminfra.engine.sampling_params.max_tokens_for`), the server's too (an empty
        prompt, prompt + ``max_tokens`` beyond the model's context or beyond what the KV pool
        holds), ``n`` above ``max_num_seqs`` (it could never run), bad parameters,
        a non-finite ``arrival_time``, or a request id already in use. ``max_tokens = None``
        takes all the room the context and the pool leave."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidParameter("params", f"params must be a SamplingParams, got "
                                             f"{type(params).__name__}")
        text, ids = self._encode(prompt)
        max_tokens = max_tokens_for(len(ids), params.max_tokens, self.model.config.max_seq_len,
                                    (self.cache.allocator.num_blocks, self.cache.block_size))
        if max_tokens != params.max_tokens:               # None: the room, written down
            params = replace(params, max_tokens=max_tokens)
        V = self.model.config.vocab_size
        bad = [t for t in (params.logit_bias or ()) if t >= V]
        if bad:
            raise InvalidParameter("logit_bias", f"logit_bias names token ids outside the "
                                                 f"vocabulary [0, {V}): {bad[:5]}")
        if params.n > self.config.max_num_seqs:
            raise InvalidParameter("n", f"n = {params.n} completions would never fit the running "
                                        f"batch: max_num_seqs = {self.config.max_num_seqs} "
                                        f"sequences")
        if arrival_time is not None and (isinstance(arrival_time, bool) or not isinstance(
                arrival_time, (int, float)) or not math.isfinite(arrival_time)):
            raise InvalidParameter("arrival_time", f"arrival_time must be None or a finite "
                                                   f"number (seconds), got {arrival_time!r}")
        rid = str(next(self._ids)) if request_id is None else str(request_id)
        while request_id is None and rid in self.requests:   # an explicit id took it
            rid = str(next(self._ids))
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        now = self.clock() if arrival_time is None else float(arrival_time)
        req = Request(rid, text, ids, params, RequestMetrics(arrival_time=now))
        for j in range(params.n):
            req.seqs.append(Sequence(next(self._seq_ids), req, j, list(ids), params.max_tokens,
                                     generator=self._generator(params, j),
                                     grammar=self._grammar(params)))
        self.scheduler.add(req.seqs[0])
        req.forks_pending = req.seqs[1:]          # forked once sequence 0 has read the prompt
        self.requests[rid] = req
        return rid

    def _grammar(self, params: SamplingParams):
        """The JSON matcher of a request with a ``json_schema`` (:mod:`.structured`), else
        None. Imported here: the engine itself runs without llguidance (a bare GPU machine)."""
        if params.json_schema is None:
            return None
        from llminfra.engine.structured import request_grammar
        return request_grammar(params, self.tokenizer, self.model.config.vocab_size,
                               self.stop_token_ids)

    def _generator(self, params: SamplingParams, j: int) -> torch.Generator | None:
        if params.greedy:
            return None
        seed = params.seed_of(j) if params.seed is not None else int(
            torch.randint(0, 2**62, (1,), generator=self._seeds))
        return torch.Generator(device=self.device).manual_seed(seed)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request and free its blocks; its final output (finish_reason ``"abort"``)
        comes with the next :meth:`step`. Returns False if it is unknown or already finished."""
        req = self.requests.get(str(request_id))
        if req is None or req.finished:
            return False
        self._end_request(req, SequenceStatus.FINISHED_ABORTED)
        self._pending.append(req)
        return True

    def _end_request(self, req: Request, status: SequenceStatus) -> None:
        """Finish every unfinished sequence of ``req`` with ``status``; free their blocks."""
        req.forks_pending = []
        for seq in req.seqs:
            if not seq.status.is_finished:
                self.scheduler.abort(seq, status)
        req.metrics.finished_time = self.clock()

    def _fail(self, req: Request, err: Exception, touched: dict) -> None:
        """A step failed for ``req``: finish it with ``"error"`` and the reason, free its blocks;
        the other requests go on."""
        if req.finished:
            return
        req.error = f"{type(err).__name__}: {err}"
        log.error("request %s failed: %s", req.request_id, req.error)
        self._end_request(req, SequenceStatus.FINISHED_ERROR)
        touched[req.request_id] = req

    def has_unfinished_requests(self) -> bool:
        """True while any request waits, runs or is swapped out, or an aborted one has still
        to report its final output (so a serving loop steps once more to hand it over)."""
        return self.scheduler.has_unfinished() or bool(self._pending)

    # -------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; one output per request that got tokens or finished."""
        touched: dict[str, Request] = {r.request_id: r for r in self._pending}
        self._pending = []
        sched = self.last_scheduled = self.scheduler.schedule(self.clock())
        if sched.scheduled:
            try:
                self._run(sched, touched)
            except Exception as err:  # noqa: BLE001 - the forward pass: fail this step's requests
                log.exception("a step of %d sequences failed", len(sched.scheduled))
                for seq, _ in sched.scheduled:
                    self._fail(seq.request, err, touched)
        outputs = [request_output(r, self.tokenizer, self.stop_token_ids)
                   for r in touched.values()]
        for r in touched.values():
            if r.finished:
                self.requests.pop(r.request_id, None)
                if self.speculator is not None:
                    for seq in r.seqs:
                        self.speculator.free(seq)
        if self.speculator is not None:     # drafts for the next step, of what still runs
            self.scheduler.set_drafts(self.speculator.propose(self.scheduler.running))
        return outputs

    def _run(self, sched: SchedulerOutput, touched: dict) -> None:
        """The runner's forward pass over the scheduled (sequence, new tokens) pairs and the
        padding rows (:mod:`.model_runner`), the caught-up sequences' tokens sampled from its
        logits (:func:`~llminfra.engine.sampler.sample_step`); then the scheduler writes the
        result (:meth:`Scheduler.update_from_output`)."""
        start = self.clock()
        scheduled, padding = sched.scheduled, sched.padding
        for seq, _ in scheduled:
            m = seq.request.metrics
            if m.first_scheduled_time is None:
                m.first_scheduled_time, m.num_cached_prompt_tokens = start, seq.num_computed_tokens
                self.counters["prompt_tokens_total"] += len(seq.request.prompt_token_ids)
        logits = self.runner.forward(scheduled, padding, sched.caught)
        sampled, logprobs = sample_step(list(sched.caught.items()), logits, self.speculator)
        self.counters["num_steps"] += 1
        now = self.clock()
        if self.step_log is not None:
            self.step_log.append(([(n, s.num_computed_tokens + n) for s, n in scheduled]
                                  + [(1, self.cache.seq_len(s.cache_seq)) for s in padding],
                                  now - start))
        result = self.scheduler.update_from_output(sched, sampled, logprobs)
        for seq, got in result.items():
            if isinstance(got, Exception):         # this request fails, the others go on
                self._fail(seq.request, got, touched)
                continue
            self.counters["generation_tokens_total"] += got
            for _ in range(got):
                if seq.request.metrics.record_token(now, seq.request.finished, seq.index == 0):
                    self.counters["num_finished"] += 1
            touched[seq.request.request_id] = seq.request

    # ---------------------------------------------------------------- generate
    def generate(self, prompts, sampling_params: SamplingParams | Seq[SamplingParams] | None
                 = None) -> list[RequestOutput]:
        """Run ``prompts`` (a str, a list of token ids, or a list of either) to completion;
        the final outputs in prompt order. ``sampling_params``: one for all, or one each."""
        ids = [self.add_request(p, sp) for p, sp in pair_with_params(prompts, sampling_params)]
        final: dict[str, RequestOutput] = {}
        while len(final) < len(ids):
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]

    # ------------------------------------------------------------------- stats
    def stats(self) -> dict:
        """Queue lengths, padding rows held (their blocks count as used), KV blocks used /
        total, preemptions and token counters."""
        alloc = self.cache.allocator
        out = {"num_running": len(self.scheduler.running),
               "num_waiting": len(self.scheduler.waiting),
               "num_swapped": len(self.scheduler.swapped),
               "num_padding": len(self.scheduler.padding),
               "kv_blocks_used": alloc.num_blocks - alloc.num_free,
               "kv_blocks_total": alloc.num_blocks,
               "num_preemptions": self.scheduler.num_preemptions, **self.counters}
        if self.speculator is not None:
            out.update(self.speculator.stats())
        if isinstance(alloc, PrefixCachingAllocator):
            out["prefix_cache_hit_rate"] = alloc.hit_rate()
        return out
