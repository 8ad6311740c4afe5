"""Where the time of an ``LLMEngine`` step goes, timed from outside the engine.

:class:`StepProfiler` wraps, on one engine, the scheduler's two halves, the runner's
``forward`` (the step's inputs), the fused step functions, their attention, every fused matrix,
the sampler, the detokenizer's ``decode``, the stop checks and the output snapshots — instance
attributes, or the module globals the engine calls them through — with
:func:`time.perf_counter`. Nothing in the engine is edited, and :meth:`StepProfiler.uninstall`
puts every wrapper back.

Each wrapper counts its own time less the time of the wrappers it calls (an *exclusive* time,
as a profiler's "self" column), and ``step()``'s remainder counts to ``engine, other``, so the
categories of a step add up to its wall time::

    step()  ─ scheduler ─ step inputs ─ [matmuls | attention | other model ops] ─ sampling
              detokenize ─ stop checks ─ output snapshots ─ engine, other

The gap between the end of a step that left work and the start of the next is the engine
loop's own time (delivering the step's outputs, taking commands). Used by
:mod:`llminfra.bench.serving_profile`; chapter 12.
"""

from __future__ import annotations

import functools
import os
import time

import torch

#: (category, what it holds), in a step's order
STEP_CATEGORIES = (
    ("scheduler", "Scheduler.schedule + update_from_output, less the rows below"),
    ("step inputs", "runner.forward less the model: slots, token/position lists, block "
                    "tables, one upload"),
    ("matmuls", "the fused linear layers (qkv, o, gate|up, down) and the LM head (on the C "
                "kernels with the RMSNorm / SwiGLU they form in the same call)"),
    ("attention: K/V gather", "index_select of every sequence's K/V blocks, padded to the "
                              "longest, for every layer"),
    ("attention: SDPA", "decode/prefill attention less the gather: SDPA under the mask"),
    ("attention: C paged kernel", "attention in C (llminfra/kernels/csrc/paged_decode.c), each "
                                  "query reading its sequence's blocks in place (a decode "
                                  "step's, a prompt chunk's as rows): no gather"),
    ("other model ops", "embedding, RMSNorm, RoPE, K/V write (index_copy_), SiLU·up"),
    ("sampling", "sample_step(): the logits rows, sample_tokens"),
    ("detokenize", "tokenizer.decode of the incremental detokenizer"),
    ("stop checks", "check_stop"),
    ("output snapshots", "request_output: a RequestOutput with text and token lists per "
                         "request"),
    ("engine, other", "step() and _run() themselves: metrics, counters"),
)
#: the kinds of step, by what the runner ran: every sequence one token / a prompt chunk or
#: drafts too / no forward pass (a step that only hands over aborted requests)
KINDS = ("decode", "mixed", "none")


class StepProfiler:
    """Exclusive wall-clock timers around an ``LLMEngine``'s parts (see the module docstring);
    :meth:`install` wraps them, :meth:`snapshot` reads the totals (cumulative, per kind of
    step: ``decode`` — every sequence brings one token, ``mixed`` — a prompt chunk too,
    ``none`` — no forward pass)."""

    def __init__(self):
        self.seconds = {k: dict.fromkeys((c for c, _ in STEP_CATEGORIES), 0.0) for k in KINDS}
        self.step_wall_s = dict.fromkeys(KINDS, 0.0)
        self.steps = dict.fromkeys(KINDS, 0)
        self.decode_rows = 0
        self.timed_calls = 0
        self.between_steps_s, self.gaps = 0.0, 0
        self._stack: list[list] = []        # per open wrapper: [category, time of children]
        self._step: dict | None = None      # the open step's seconds per category
        self._kind = "none"
        self._gap_from: float | None = None
        self._undo: list = []
        #: what could not be wrapped (its time counts to the caller's category)
        self.missing: list[str] = []

    # ------------------------------------------------------------------ timing
    def timed(self, category: str, fn):
        """``fn`` whose time inside a step, less that of timed calls it makes, counts to
        ``category``."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if self._step is None:
                return fn(*args, **kwargs)
            frame = [category, 0.0]
            self._stack.append(frame)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                self._stack.pop()
                self._step[category] += dt - frame[1]
                self.timed_calls += 1
                if self._stack:
                    self._stack[-1][1] += dt
        return wrapper

    def _timed_step(self, engine, step):
        """``engine.step`` timed whole: its remainder counts to ``engine, other``; the kind of
        step is what the runner ran; the time since the last step counts as the loop's own
        when that step left work."""
        def wrapper():
            t0 = time.perf_counter()
            if self._gap_from is not None:
                self.between_steps_s += t0 - self._gap_from
                self.gaps += 1
            self._step, self._kind = dict.fromkeys(self.seconds["none"], 0.0), "none"
            frame = ["engine, other", 0.0]
            self._stack = [frame]
            try:
                return step()
            finally:
                t1 = time.perf_counter()
                self._step["engine, other"] += (t1 - t0) - frame[1]
                for c, s in self._step.items():
                    self.seconds[self._kind][c] += s
                self.step_wall_s[self._kind] += t1 - t0
                self.steps[self._kind] += 1
                self._step, self._stack = None, []
                self._gap_from = t1 if engine.has_unfinished_requests() else None
        return wrapper

    # ------------------------------------------------------------------ wrapping
    def _patch(self, obj, name: str, new) -> None:
        """Set ``obj.name`` (or ``obj[name]`` of a module's globals) to ``new``, remembering
        how to put it back."""
        had = name in getattr(obj, "__dict__", {})
        old = getattr(obj, name) if not isinstance(obj, dict) else obj[name]
        if isinstance(obj, dict):
            obj[name] = new
            self._undo.append(lambda: obj.__setitem__(name, old))
        else:
            setattr(obj, name, new)
            self._undo.append(lambda: setattr(obj, name, old) if had else delattr(obj, name))

    def _kind_marker(self, kind: str, fn):
        """``fn`` (a fused step function) that marks the open step's kind, and counts the
        rows of a decode step. ``decode_step`` with ``logits_rows`` is a step with prompt
        chunks as rows (the fast runner on the C kernels): ``mixed``."""
        def wrapper(*args, **kwargs):
            if self._step is not None:
                self._kind = "mixed" if kwargs.get("logits_rows") is not None else kind
                if self._kind == "decode" and len(args) > 2:
                    self.decode_rows += len(args[2])       # tokens (n,)
            return fn(*args, **kwargs)
        return wrapper

    def _wrap_global(self, category: str, owners, names, marker=None) -> bool:
        """Wrap the first of ``names`` found in the module globals of the functions
        ``owners`` (where the engine calls it from); False (and noted in :attr:`missing`) if
        none is there: its time then counts to its caller's category."""
        for fn in owners:
            g = getattr(fn, "__globals__", None)
            for name in names:
                if g is not None and callable(g.get(name)):
                    new = self.timed(category, g[name])
                    self._patch(g, name, new if marker is None else self._kind_marker(marker,
                                                                                       new))
                    return True
        self.missing.append(f"{category}: {'/'.join(names)}")
        return False

    def install(self, engine) -> "StepProfiler":
        """Wrap ``engine``'s step, scheduler, runner, fused matrices, sampler, detokenizer,
        stop checks and output snapshots; module functions are wrapped in the globals of the
        module that calls them (:meth:`uninstall` puts everything back)."""
        sched, runner = engine.scheduler, engine.runner
        E, S, R = type(engine), type(sched), type(runner)
        for name in ("schedule", "update_from_output"):
            self._patch(sched, name, self.timed("scheduler", getattr(sched, name)))
        self._patch(sched, "decode", self.timed("detokenize", sched.decode))
        self._wrap_global("stop checks", [getattr(S, "_append", None)], ["check_stop"])
        self._wrap_global("output snapshots", [E.step], ["request_output"])
        self._wrap_global("sampling", [E._run, getattr(R, "execute", None)],
                          ["sample_step", "sample"])
        self._patch(runner, "forward", self.timed("step inputs", runner.forward))
        if hasattr(runner, "weights"):                  # the fast runner: split the model
            self._wrap_fast_model(runner)
        else:                                           # the readable model, not split
            self._patch(runner, "model", self.timed("other model ops", runner.model))
        self._patch(engine, "step", self._timed_step(engine, engine.step))
        stats = engine.stats
        self._patch(engine, "stats", lambda: {**stats(), "profile": self.snapshot()})
        return self

    def _wrap_fast_model(self, runner) -> None:
        """The fast runner's model split: the step functions (their own time: embedding,
        norms, RoPE, K/V write, SiLU), their attention, and every fused matrix. A decode step
        the runner makes in one C call (``runner.stack``) runs as its Python account here, the
        same calls one by one, so that each is timed (and the calls between them cost what
        they cost in Python)."""
        R = type(runner)
        if getattr(runner, "stack", None) is not None:    # the decode step in one C call: its
            self._patch(runner, "stack", None)           # Python account makes the same calls
        owners = [getattr(R, n, None) for n in ("_decode", "_mixed", "forward")]
        steps = [g[n] for fn in owners if fn is not None for g in [fn.__globals__]
                 for n in ("decode_step", "mixed_step") if callable(g.get(n))]
        self._wrap_global("other model ops", owners, ["decode_step"], marker="decode")
        self._wrap_global("other model ops", owners, ["mixed_step"], marker="mixed")
        inner = [getattr(f, "__wrapped__", f) for f in steps]
        self._wrap_global("attention: SDPA", inner, ["decode_attention"])
        self._wrap_global("attention: SDPA", inner, ["_prefill_attention"])
        self._wrap_global("attention: K/V gather", inner, ["_gather"])
        self._wrap_c_attention(inner)
        w = runner.weights
        for layer in w.layers:
            for name in ("wqkv", "wo", "w13", "w2"):
                self._patch(layer, name, _TimedMatmul(getattr(layer, name), self))
        self._patch(w, "output", _TimedMatmul(w.output, self))

    def _wrap_c_attention(self, steps) -> None:
        """The C decode attention: ``c_attend`` builds a step's ``attend`` closure; the
        closure it returns is timed."""
        for fn in steps:
            g = getattr(fn, "__globals__", None)
            if g is not None and callable(g.get("c_attend")):
                real = g["c_attend"]
                self._patch(g, "c_attend", lambda *a, **k: self.timed(
                    "attention: C paged kernel", real(*a, **k)))
                return

    def uninstall(self) -> None:
        """Undo every wrapper, last first."""
        while self._undo:
            self._undo.pop()()

    def snapshot(self) -> dict:
        """The totals so far (plain numbers: it travels with the engine's stats)."""
        return {"seconds": {k: dict(v) for k, v in self.seconds.items()},
                "step_wall_s": dict(self.step_wall_s), "steps": dict(self.steps),
                "decode_rows": self.decode_rows, "timed_calls": self.timed_calls,
                "between_steps_s": self.between_steps_s, "gaps": self.gaps,
                "torch_threads": torch.get_num_threads(), "pid": os.getpid(),
                "missing": list(self.missing)}


def wrapper_cost_s(calls: int = 20_000) -> float:
    """Seconds one timed call adds to a call (a wrapped no-op inside an open step, less the
    bare no-op; best of 3): times the profile's timed calls, the timers' own cost."""
    prof = StepProfiler()
    prof._step, prof._stack = dict.fromkeys(prof.seconds["none"], 0.0), [["engine, other", 0.0]]

    def noop():
        return None
    timed = prof.timed("scheduler", noop)

    def per_call(fn) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls)
        return best
    return max(0.0, per_call(timed) - per_call(noop))


class _TimedMatmul:
    """A fused matrix (:class:`~llminfra.runner.fused.Matmul`) whose ``__call__`` and ``add``
    count to ``matmuls``."""

    def __init__(self, inner, profiler: StepProfiler):
        self.inner = inner
        self._call = profiler.timed("matmuls", inner.__call__)
        self.add = profiler.timed("matmuls", inner.add)
        if hasattr(inner, "fused"):       # the C kernels form RMSNorm / SwiGLU in the call
            self.fused = profiler.timed("matmuls", inner.fused)

    def __call__(self, x):
        return self._call(x)

    def __getattr__(self, name):
        return getattr(self.inner, name)
