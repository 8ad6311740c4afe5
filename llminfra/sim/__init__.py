"""The simulated engine and its workloads: serving at scale without a GPU (chapters 05 and 11).

What the engine would do, computed instead of run: the engine's own scheduler against a
roofline step time, timelines counted in steps, the scheduler's rules in closed form, and
prefill/decode disaggregation across many GPUs. Builds on :mod:`llminfra.engine` (its
scheduler, sequences and metrics); nothing in the engine imports it. Modules, one concept each:

* :mod:`.workload` — a seeded workload: the chapter-04 trace's lengths, Poisson arrivals;
* :mod:`.simulator` — the same scheduler against a step-time model (the roofline by default);
* :mod:`.timeline` — who ran when: the real engine on a step clock, one row per request;
* :mod:`.scheduling_rules` — admission, TTFT / TPOT and chunked prefill on plain numbers;
* :mod:`.goodput` — requests per second within a TTFT and a TPOT target;
* :mod:`.disagg` — colocated vs prefill/decode-disaggregated serving at scale (chapter 11).

Nothing is imported here: import the module you need.
"""
