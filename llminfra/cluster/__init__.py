"""More than one engine (chapter 11): the KV handoff, prefill/decode disaggregation, routers.

Two engines that split a request's prefill and decode between them, and replicas behind a
router. Builds on :mod:`llminfra.engine` (and on the engine loop of :mod:`llminfra.serving`
for the replicas); nothing in the engine or in the front end imports it. Modules, one concept
each:

* :mod:`.kv_transfer` — export a request's KV blocks from one engine, import them into another;
* :mod:`.disagg` — a prefill worker and a decode worker, the KV handed from one to the other;
* :mod:`.kv_link` — a handoff on a ``torch.distributed`` link (gloo): messages, receiving
  thread, measured rate;
* :mod:`.disagg_process` — the two workers in two processes, the K/V over that link;
* :mod:`.router` — routing policies over replicas (round robin, least loaded, prefix-cache
  aware);
* :mod:`.router_workload` — requests that share prompt prefixes, for the router;
* :mod:`.router_run` — data-parallel replicas (engine processes) behind a router, run for real.

Nothing is imported here: import the module you need.
"""
