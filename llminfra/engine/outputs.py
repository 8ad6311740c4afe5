"""What the engine hands back after a step: :class:`RequestOutput` with its completions.

Each object is a snapshot: ``text`` and ``token_ids`` are cumulative (everything generated so
far), so a streaming server sends the difference from the previous snapshot. The field names
follow vLLM's ``RequestOutput`` / ``CompletionOutput``; ``finish_reason`` uses the OpenAI API's
words. Taught in chapter 05.
"""

from __future__ import annotations

from dataclasses import dataclass

from llminfra.engine.metrics import RequestMetrics


@dataclass
class CompletionOutput:
    """Completion ``index`` of a request: text and token ids so far, and why it ended
    (``None`` while running, ``"stop"``, ``"length"``, ``"abort"`` or ``"error"``). While it
    runs, ``text`` leaves out an end that may still become a stop string
    (:func:`~llminfra.engine.sampling_params.held_back`), so each snapshot's text extends the
    previous one and the last one is the finished text."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        """True once it has a finish reason."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One request's state after a step: prompt, completions, whether all are finished, its
    timestamps (:class:`~llminfra.engine.metrics.RequestMetrics`), and ``error``: why it failed
    (its completions then end with ``"error"``), else None."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    error: str | None = None
