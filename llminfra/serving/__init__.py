"""The OpenAI front end of chapter 05, on top of :mod:`llminfra.engine` (which knows no HTTP).

Modules, one concept each:

* :mod:`.openai_protocol` — the API's request / response bodies (pydantic);
* :mod:`.server` — FastAPI routes, streaming by server-sent events;
* :mod:`.server_metrics` — ``/metrics`` in Prometheus' text format;
* :mod:`.engine_core` — the one engine-core loop and its message format (commands, events);
* :mod:`.async_engine` — the caller side, and the loop in a thread of this process;
* :mod:`.engine_process` — the same loop in a process of its own (no shared GIL);
* :mod:`.http_limits` — what one client can make the server hold;
* :mod:`.serve` — ``python -m llminfra serve``;
* :mod:`.background` — start and stop a server from a notebook or a test;
* :mod:`.loadtest` — ``python -m llminfra loadtest``, for any OpenAI-compatible endpoint;
* :mod:`.router`, :mod:`.router_run`, :mod:`.router_workload` — data-parallel replicas behind
  a router (round robin, least loaded, prefix-cache aware; chapter 11);
* :mod:`.disagg`, :mod:`.disagg_process` — prefill/decode disaggregation: two engines, the KV
  blocks moved between them (chapter 11).

Nothing is imported here: ``llminfra.serving.loadtest`` must not load FastAPI, nor the server
torch.
"""
