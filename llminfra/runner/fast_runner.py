"""The fast runner: the readable runner's step on the same weights fused from outside
(:mod:`llminfra.runner.fused`) and run by :mod:`llminfra.runner.fast_step` — 25 torch calls a
layer instead of about 110, the same answers (the tests tie them). The engine takes it from
outside: ``LLMEngine(model, tokenizer, runner=fast_runner(kernels=…))`` (:func:`fast_runner`);
nothing in :mod:`llminfra.engine` imports this package.

The step's inputs (tokens, positions, slots, block tables) are built on the host in one array
and copied into one persistent device buffer per step. With ``cuda_graphs`` a decode step runs
from a CUDA graph captured once per batch-size bucket (:func:`graph_buckets`: 1, 2, 4, 8, then
every 16 up to ``max_num_seqs``): the batch is padded to its bucket (padding lanes write and
read the cache's scratch block) and the graph replays the whole step as one launch. On a CPU
``cuda_graphs="emulate"`` takes the same path — the same buffers, the same padded function
call, without a graph — so the tests check every bucket's tokens against the eager step where
no GPU is. Chapter 12 (making it fast), chapter 05 (the engine) and chapter 08 (why a GPU
decode step needs graphs: on a GPU each kernel a step launches costs host time, whatever the
kernel does).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from llminfra.engine.readable_runner import PAD_TOKEN_ID, ReadableRunner
from llminfra.runner.fast_step import (PrefillInputs, decode_step, layer_pools, mixed_step,
                                      uses_c_rows)
from llminfra.runner.fused import FusedWeights


def fast_runner(*, kernels=None, cuda_graphs: bool | str | None = None):
    """What :class:`~llminfra.engine.LLMEngine` takes as ``runner=``: a factory
    ``(model, cache, device, *, max_num_seqs) -> FastRunner`` on ``kernels`` (a
    :class:`~llminfra.runner.kernel_set.KernelSet`, None: the model's own matmul), with
    ``cuda_graphs`` as :class:`FastRunner` takes it."""
    return functools.partial(FastRunner, kernels=kernels, cuda_graphs=cuda_graphs)


def runner_for(name: str, *, kernels=None, cuda_graphs: bool | str | None = None):
    """``LLMEngine``'s ``runner=`` for a runner's name: ``"readable"`` as it is, ``"fast"`` as
    :func:`fast_runner`; ``ValueError`` for another name, or for settings the readable runner
    cannot take."""
    if name == "readable":
        if cuda_graphs:
            raise ValueError("CUDA graphs need runner='fast'; the readable runner runs eagerly")
        if kernels is not None:
            raise ValueError("kernels need runner='fast' (the fused weights are what they "
                             "apply to)")
        return "readable"
    if name == "fast":
        return fast_runner(kernels=kernels, cuda_graphs=cuda_graphs)
    raise ValueError(f"runner {name!r}; allowed: 'readable', 'fast'")


def graph_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes a decode graph is captured for: 1, 2, 4, 8, then every 16 up to
    ``max_num_seqs`` (vLLM's default ladder, shortened)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 16))
    return sorted(set(sizes + [max_num_seqs]))


class FastRunner(ReadableRunner):
    """The fused step (:mod:`llminfra.runner.fast_step`) on the same cache.

    ``cuda_graphs``: ``None`` — on where the weights are on CUDA; ``True`` (CUDA only);
    ``False``; ``"emulate"`` — the graph path's buffers and padding, without a graph (any
    device: how the CPU tests check it). ``kernels``: a
    :class:`~llminfra.runner.kernel_set.KernelSet` (w4a8, the fp32 C kernels, …), else the
    model's own kind of matmul. ``ValueError`` for a model the fused
    weights do not take (mixture of experts, quantized layers)."""

    name = "fast"

    def __init__(self, model, cache, device: torch.device, *, max_num_seqs: int = 64,
                 cuda_graphs: bool | str | None = None, kernels=None):
        super().__init__(model, cache, device)
        self.weights = FusedWeights(model, kernels)
        self.pools = layer_pools(cache)
        #: the decode step in one C call where the weights bring one (int4 or fp32 on the C
        #: kernels: :mod:`llminfra.runner.decode_stack`, the same logits), else None
        build = self.weights.decode_stack
        self.stack = None if build is None else build(self.weights, self.pools)
        #: steps with prompt chunks as decode_step's rows (a query each, on the C kernels)
        self.c_rows = uses_c_rows(self.weights, self.pools)
        self.num_blocks, self.B = cache.allocator.num_blocks, cache.block_size
        self.scratch_slot = cache.scratch_block * self.B
        if cuda_graphs is None:
            cuda_graphs = device.type == "cuda"
        if cuda_graphs is True and device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs the model on CUDA, it is on {device}; "
                             "use cuda_graphs='emulate' to run the graph path without graphs")
        if cuda_graphs not in (True, False, "emulate"):
            raise ValueError(f"cuda_graphs must be True, False, None or 'emulate', got "
                             f"{cuda_graphs!r}")
        self.cuda_graphs = cuda_graphs
        self.buckets = graph_buckets(max_num_seqs) if cuda_graphs else []
        self.max_blocks = -(-model.config.max_seq_len // self.B)
        #: an eager step's inputs: tokens | positions | slots | tables | … (grows as needed)
        self.buffer = torch.zeros(1024, dtype=torch.long, device=device)
        #: the graph buckets' inputs, fixed for good (a captured graph reads this memory)
        self.graph_buffer = torch.zeros(max(self.buckets, default=0) * (3 + self.max_blocks),
                                        dtype=torch.long, device=device)
        self._graphs: dict[int, tuple] = {}
        self._pool = None
        self.graph_replays = 0

    # ------------------------------------------------------------------ inputs
    def _tables(self, seqs, width: int, pad: int = 0) -> np.ndarray:
        """``(len(seqs) + pad, width)`` block tables, past each sequence's blocks — and in the
        ``pad`` padding lanes' rows — the scratch block (read under a mask, never used)."""
        out = np.full((len(seqs) + pad, width), self.cache.scratch_block, dtype=np.int64)
        for i, s in enumerate(seqs):
            blocks = self.cache.block_table(s)
            out[i, :len(blocks)] = blocks
        return out

    def _upload(self, *parts: np.ndarray) -> list[torch.Tensor]:
        """Copy ``parts`` into the persistent buffer with one host-to-device copy; their views."""
        host = np.concatenate([p.ravel() for p in parts])
        if host.size > self.buffer.numel():
            self.buffer = torch.zeros(host.size, dtype=torch.long, device=self.device)
        used = self.buffer[:host.size]
        used.copy_(torch.from_numpy(host))
        views = used.split([p.size for p in parts])
        return [v if p.ndim == 1 else v.view(p.shape) for v, p in zip(views, parts)]

    # ----------------------------------------------------------------- forward
    def forward(self, scheduled, padding, caught: dict) -> torch.Tensor:
        seqs = [s for s, _ in scheduled] + padding
        lens = [n for _, n in scheduled] + [1] * len(padding)
        cache_ids = [s.cache_seq for s in seqs]
        slots = self.cache.reserve_slots(cache_ids, lens)
        try:
            with torch.no_grad():
                if max(lens) == 1:
                    return self._decode(scheduled, padding, cache_ids, slots, caught)
                return self._mixed(scheduled, padding, cache_ids, slots, lens, caught)
        except BaseException:
            self.cache.rollback_last()            # a failed step leaves the cache as it was
            raise

    def _decode(self, scheduled, padding, cache_ids, slots, caught) -> torch.Tensor:
        """Every sequence brings one token: the graph bucket, or the eager step at the
        batch's exact width. Logits of the caught-up sequences, then of the padding rows."""
        tokens = [s.step_tokens(1)[0] for s, _ in scheduled] + [PAD_TOKEN_ID] * len(padding)
        positions = [self.cache.seq_len(c) - 1 for c in cache_ids]
        n = len(tokens)
        bucket = next((b for b in self.buckets if b >= n), None)
        if bucket is not None:
            logits = self._replay(bucket, tokens, positions, slots, cache_ids)[:n]
        else:
            width = max(-(-(p + 1) // self.B) for p in positions)
            t, p, s, bt = self._upload(np.array(tokens), np.array(positions), np.array(slots),
                                       self._tables(cache_ids, width))
            stack = self._stack_for(n)
            logits = (stack(t, p, s, bt) if stack is not None else
                      decode_step(self.weights, self.pools, t, p, s, bt))
        keep = [i for i, (seq, _) in enumerate(scheduled) if seq in caught]
        if len(keep) < len(scheduled):             # a one-token prompt chunk: no logits wanted
            logits = logits[keep + list(range(len(scheduled), n))]
        return logits

    def _mixed(self, scheduled, padding, cache_ids, slots, lens, caught) -> torch.Tensor:
        """One-token sequences first, then the multi-token ones padded to the longest; on the
        C kernels (:func:`uses_c_rows`) a row per query instead (:meth:`_rows`)."""
        if self.c_rows:
            return self._rows(scheduled, padding, cache_ids, slots, lens, caught)
        order = sorted(range(len(lens)), key=lambda i: lens[i] > 1)   # stable: decodes first
        start = np.cumsum([0] + [lens[i] for i in order])
        row_of = {i: int(start[k]) for k, i in enumerate(order)}     # first flat row of each
        sched_all = list(scheduled) + [(s, 1) for s in padding]
        tokens, positions, flat_slots = [], [], []
        slot_at = np.cumsum([0] + lens)
        for i in order:
            seq, n = sched_all[i]
            toks = seq.step_tokens(n) if i < len(scheduled) else [PAD_TOKEN_ID]
            end = self.cache.seq_len(cache_ids[i])
            tokens += toks
            positions += range(end - n, end)
            flat_slots += slots[slot_at[i]:slot_at[i] + n]
        nd = sum(1 for i in order if lens[i] == 1)
        multi = order[nd:]
        T = max(lens[i] for i in multi)
        pad_rows, pad_pos, unpad = [], [], []
        for k, i in enumerate(multi):
            n, r0 = lens[i], row_of[i]
            pad_rows += list(range(r0 - nd, r0 - nd + n)) + [r0 - nd] * (T - n)
            pad_pos += positions[r0:r0 + n] + [0] * (T - n)
            unpad += range(k * T, k * T + n)
        widths = [-(-self.cache.seq_len(cache_ids[i]) // self.B) for i in multi]
        dec_ids = [cache_ids[i] for i in order[:nd]]
        logits_rows = []
        for i, (seq, n) in enumerate(scheduled):
            if seq in caught:
                logits_rows += range(row_of[i] + n - caught[seq] - 1, row_of[i] + n)
        logits_rows += [row_of[i] for i in range(len(scheduled), len(sched_all))]
        parts = [np.array(tokens), np.array(positions), np.array(flat_slots),
                 np.array(pad_rows), np.array(pad_pos), np.array(unpad),
                 self._tables([cache_ids[i] for i in multi], max(widths)),
                 np.array(logits_rows, dtype=np.int64)]
        if nd:
            dec_width = max(-(-self.cache.seq_len(c) // self.B) for c in dec_ids)
            parts.append(self._tables(dec_ids, dec_width))
        views = self._upload(*parts)
        t, p, s, pr, pp, up, pbt, lr = views[:8]
        pre = PrefillInputs(T, pr, pp, up, pbt)
        return mixed_step(self.weights, self.pools, t, p, s, nd, views[8] if nd else None,
                          pre, lr)

    def _rows(self, scheduled, padding, cache_ids, slots, lens, caught) -> torch.Tensor:
        """A step with prompt chunks as :func:`decode_step` rows: every query its own row of
        block tables (its sequence's) and position, attention read in place by the C kernel;
        the logits of the caught-up rows (each sequence's last ``caught`` + 1), then of the
        padding rows. In one C call where the weights bring the stack."""
        sched_all = list(scheduled) + [(s, 1) for s in padding]
        tokens, positions, logits_rows = [], [], []
        for i, (seq, n) in enumerate(sched_all):
            end = self.cache.seq_len(cache_ids[i])
            if i >= len(scheduled):
                logits_rows.append(len(tokens))
            elif seq in caught:
                logits_rows += range(len(tokens) + n - caught[seq] - 1, len(tokens) + n)
            tokens += seq.step_tokens(n) if i < len(scheduled) else [PAD_TOKEN_ID]
            positions += range(end - n, end)
        width = max(-(-self.cache.seq_len(c) // self.B) for c in cache_ids)
        tables = np.repeat(self._tables(cache_ids, width), lens, axis=0)
        t, p, s, bt, lr = self._upload(np.array(tokens), np.array(positions), np.array(slots),
                                       tables, np.array(logits_rows, dtype=np.int64))
        stack = self._stack_for(len(tokens))
        if stack is not None:
            return stack(t, p, s, bt, logits_rows=lr)
        return decode_step(self.weights, self.pools, t, p, s, bt, logits_rows=lr)

    def _stack_for(self, rows: int):
        """The one-call step where the weights bring one that takes this many rows, else
        None (the Python step)."""
        return self.stack if self.stack is not None and rows <= self.stack.max_batch else None

    # ------------------------------------------------------------------ graphs
    def _bucket_inputs(self, bucket: int) -> tuple[torch.Tensor, ...]:
        """The persistent input views of a bucket: tokens, positions, slots ``(bucket,)``,
        block tables ``(bucket, max_blocks)`` — the same memory every step."""
        W = self.max_blocks
        b = self.graph_buffer
        return (b[:bucket], b[bucket:2 * bucket], b[2 * bucket:3 * bucket],
                b[3 * bucket:3 * bucket + bucket * W].view(bucket, W))

    def _replay(self, bucket, tokens, positions, slots, cache_ids) -> torch.Tensor:
        """Fill the bucket's buffers (padding lanes: token 0 at position 0, slot and blocks
        the scratch block) and run the captured graph (or, emulated, the same call)."""
        n = len(tokens)
        pad = bucket - n
        host = np.concatenate([
            np.array(tokens + [PAD_TOKEN_ID] * pad), np.array(positions + [0] * pad),
            np.array(list(slots) + [self.scratch_slot] * pad),
            self._tables(cache_ids, self.max_blocks, pad).ravel()])
        self.graph_buffer[:host.size].copy_(torch.from_numpy(host))
        self.graph_replays += 1
        if self.cuda_graphs == "emulate":
            return decode_step(self.weights, self.pools, *self._bucket_inputs(bucket))
        if bucket not in self._graphs:
            self._capture(bucket)
        graph, out = self._graphs[bucket]
        graph.replay()
        return out

    def _capture(self, bucket: int) -> None:
        """Capture the decode step of ``bucket`` lanes; its buffers hold padding lanes while
        the warm-up and the capture run, so they write only the scratch block."""
        t, p, s, bt = self._bucket_inputs(bucket)
        saved = self.graph_buffer.clone()
        t.fill_(PAD_TOKEN_ID), p.fill_(0), s.fill_(self.scratch_slot)
        bt.fill_(self.cache.scratch_block)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                decode_step(self.weights, self.pools, t, p, s, bt)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            out = decode_step(self.weights, self.pools, t, p, s, bt)
        self._graphs[bucket] = (graph, out)
        self.graph_buffer.copy_(saved)

    def capture_all(self) -> int:
        """Capture every bucket now, largest first (they share one memory pool); returns how
        many. Without CUDA graphs, 0."""
        if self.cuda_graphs is not True:
            return 0
        with torch.no_grad():
            for bucket in sorted(self.buckets, reverse=True):
                if bucket not in self._graphs:
                    self._capture(bucket)
        return len(self._graphs)
