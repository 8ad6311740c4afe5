"""``python -m llminfra serve``: the tiny model behind the OpenAI-compatible server.

Builds ``LLMEngine(load_tiny())`` with the given scheduler settings, wraps it in
:func:`llminfra.engine.server.create_app` and runs uvicorn until SIGINT (Ctrl-C) or SIGTERM,
which uvicorn turns into a graceful shutdown: open responses get ``timeout_graceful_shutdown``
seconds, then the app's shutdown stops the engine loop and the process exits with status 0.

Taught in chapter 05.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

#: seconds uvicorn lets open responses finish after SIGINT / SIGTERM
GRACEFUL_SHUTDOWN_S = 5


def build_tiny_app(*, model_name: str | None = None, num_blocks: int | None = None,
                   block_size: int = 16, max_num_seqs: int = 64,
                   max_num_batched_tokens: int = 512, policy: str = "continuous",
                   enable_chunked_prefill: bool = True, enable_prefix_caching: bool = False,
                   num_threads: int | None = None):
    """The app serving the trained tiny model (``load_tiny()``) on a fresh ``LLMEngine``."""
    import torch

    from llminfra.engine import LLMEngine
    from llminfra.engine.server import DEFAULT_MODEL_NAME, create_app
    from llminfra.model import load_tiny

    if num_threads is not None:
        torch.set_num_threads(num_threads)
    model, tokenizer = load_tiny()
    engine = LLMEngine(model, tokenizer, num_blocks=num_blocks, block_size=block_size,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       policy=policy, enable_chunked_prefill=enable_chunked_prefill,
                       enable_prefix_caching=enable_prefix_caching)
    return create_app(engine, tokenizer, model_name=model_name or DEFAULT_MODEL_NAME)


def run_server(host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
               **engine_kwargs) -> None:
    """Serve until interrupted (blocks). ``engine_kwargs`` go to :func:`build_tiny_app`."""
    import uvicorn

    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    app = build_tiny_app(**engine_kwargs)
    log.info("serving the tiny model at http://%s:%d/v1 (Ctrl-C to stop)", host, port)
    uvicorn.run(app, host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
