"""The OpenAI front end of chapter 05, on top of :mod:`llminfra.engine` (which knows no HTTP).

Modules, one concept each:

* :mod:`.openai_protocol` — the API's request / response bodies (pydantic);
* :mod:`.server` — FastAPI routes, streaming by server-sent events;
* :mod:`.server_metrics` — ``/metrics`` in Prometheus' text format;
* :mod:`.async_engine` — the engine loop: one owner steps the engine, the web layer queues work;
* :mod:`.engine_process` — the same loop in a process of its own (no shared GIL);
* :mod:`.http_limits` — what one client can make the server hold;
* :mod:`.serve` — ``python -m llminfra serve``;
* :mod:`.background` — start and stop a server from a notebook or a test;
* :mod:`.loadtest` — ``python -m llminfra loadtest``, for any OpenAI-compatible endpoint.

Nothing is imported here: ``llminfra.serving.loadtest`` must not load FastAPI, nor the server
torch.
"""
