"""Helpers shared by the server tests (``test_server.py``, ``test_hardening_server.py``); their
``client`` fixture lives in ``conftest.py``."""

import httpx

from llminfra.serving.server import parse_metrics


def metrics(server) -> dict:
    """The server's ``/metrics`` page, parsed: metric name -> value."""
    return parse_metrics(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
