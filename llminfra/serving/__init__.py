"""The OpenAI front end of chapter 05, on top of :mod:`llminfra.engine` (which knows no HTTP).

Modules, one concept each:

* :mod:`.openai_protocol` — the API's request / response bodies (pydantic);
* :mod:`.server` — the OpenAI routes, methods of one service, on a FastAPI app (and what the
  routers in front of a fleet ask a replica);
* :mod:`.server_metrics` — ``/metrics`` in Prometheus' text format, one registry per server;
* :mod:`.router_fields` — the engine fields routers forward, and what this server does with
  each;
* :mod:`.relay` — what the routes share: prompt checks, sampling parameters, queueing, relaying
  whole or as server-sent events (with the one rule for text deltas);
* :mod:`.api_errors` — OpenAI's error body for every refusal;
* :mod:`.engine_core` — the one engine-core loop and its message format (commands, events),
  and the one judge of a stalled loop;
* :mod:`.async_engine` — the caller side, and the loop in a thread of this process;
* :mod:`.engine_process` — the same loop in a process of its own (no shared GIL);
* :mod:`.http_limits` — what one client can make the server hold;
* :mod:`.body_limits` — the middleware that holds request bodies to those limits;
* :mod:`.serve` — ``python -m llminfra serve``;
* :mod:`.background` — start and stop a server from a notebook or a test;
* :mod:`.loadtest` — ``python -m llminfra loadtest``, for any OpenAI-compatible endpoint.

Routers over replicas and prefill/decode disaggregation (more than one engine) live in
:mod:`llminfra.cluster`, which builds on this loop; nothing here imports it.

Nothing is imported here: ``llminfra.serving.loadtest`` must not load FastAPI, nor the server
torch.
"""
