"""The OpenAI HTTP API's request and response bodies, as pydantic models, plus the error body.

Every field the server implements is modelled, and nothing else is accepted: an unknown field,
or one the API defines that this server does not implement (``tools``, ``suffix`` …), is a 400
naming it (``extra="forbid"``) — a client must
never silently get a default where it asked for something. ``user`` (an end-user id for abuse
monitoring) is accepted and has no effect. ``response_format`` ``json_object`` and
``json_schema`` constrain the output token by token (:mod:`llminfra.engine.structured`).
Implemented beyond the basics: ``logprobs``
(completions: the top N per token; chat: ``logprobs`` + ``top_logprobs``), ``presence_penalty``,
``frequency_penalty``, ``logit_bias`` (token id -> bias), and vLLM's ``repetition_penalty`` and
``min_p``. Field names, defaults and limits follow the
OpenAI API reference (platform.openai.com/docs/api-reference: *Completions*, *Chat*,
*Streaming*; checked 2025): completions default ``max_tokens = 16`` and ``temperature = 1``;
``stop`` holds at most 4 sequences; errors are ``{"error": {"message", "type", "param",
"code"}}``, their message cut at :data:`MAX_ERROR_MESSAGE_CHARS`. ``top_k``, ``seed`` and
``ignore_eos`` are the extensions vLLM also accepts.

Fields routers add (``no_stop_trim`` and others): :mod:`llminfra.serving.router_fields`.

Text must be valid Unicode: JSON can carry a lone surrogate (``"\\ud800"``), which no UTF-8
tokenizer can encode; ``prompt``, chat ``content`` and ``stop`` holding one are refused here
(400 naming the field) instead of failing later.

Chat messages become a prompt through the served tokenizer's ``apply_chat_template``: the real
model's own Jinja template (ChatML for SmolLM2), or the tiny model's plain-text one
(:meth:`llminfra.model.ByteTokenizer.apply_chat_template`).

Taught in chapter 05.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from llminfra.serving.router_fields import CHAT_ENGINE_FIELDS, ENGINE_FIELDS, honoured_value

#: OpenAI allows at most 4 stop sequences
MAX_STOP_SEQUENCES = 4
#: characters in one stop sequence at most: the engine checks, every step, which end of the text
#: may still grow into a stop string, at a cost that grows with its length
MAX_STOP_CHARS = 256
#: most ``logit_bias`` entries (OpenAI's limit)
MAX_LOGIT_BIAS = 300
#: an error message longer than this is cut (a last guard against echoing a huge value)
MAX_ERROR_MESSAGE_CHARS = 1000


def unicode_text(value: str) -> str:
    """``value`` if it encodes as UTF-8; else ``ValueError`` saying where (a lone surrogate
    such as ``"\\ud800"``, which JSON allows and no tokenizer can encode)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"must be valid Unicode text: {e.reason} (character {e.start}, "
                         f"{value[e.start]!r})") from None
    return value


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    user: Optional[str] = None                  # accepted, no effect (abuse monitoring id)
    presence_penalty: Optional[float] = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: Optional[float] = Field(default=1.0, gt=0.0, le=100.0)
    min_p: Optional[float] = Field(default=0.0, ge=0.0, le=1.0)
    logit_bias: Optional[dict[str, float]] = None
    response_format: Optional[dict] = None
    temperature: Optional[float] = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=1.0, gt=0.0, le=1.0)
    top_k: Optional[StrictInt] = Field(default=None, ge=1)
    n: StrictInt = Field(default=1, ge=1)
    stream: StrictBool = False
    stream_options: Optional[dict] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[StrictInt] = None
    ignore_eos: StrictBool = False
    # engine fields routers forward (ENGINE_FIELDS): accepted, ignored or refused by value
    no_stop_trim: StrictBool = False
    include_stop_str_in_output: StrictBool = False
    return_hidden_states: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True

    @field_validator(*ENGINE_FIELDS)
    @classmethod
    def _engine_field(cls, v, info):
        return honoured_value(ENGINE_FIELDS, info.field_name, v)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        if v is None:
            return None
        v = [v] if isinstance(v, str) else v
        if len(v) > MAX_STOP_SEQUENCES or any(not 0 < len(s) <= MAX_STOP_CHARS for s in v):
            raise ValueError(f"stop takes at most {MAX_STOP_SEQUENCES} non-empty strings of at "
                             f"most {MAX_STOP_CHARS} characters")
        return [unicode_text(s) for s in v]

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v is None:
            return None
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias takes at most {MAX_LOGIT_BIAS} entries")
        out = {}
        for k, b in v.items():
            if not k.isdigit():
                raise ValueError(f"logit_bias keys are token ids (digits), got {k[:20]!r}")
            if not -100.0 <= b <= 100.0:
                raise ValueError(f"logit_bias values lie in [-100, 100], got {b!r}")
            out[int(k)] = float(b)
        return out

    @field_validator("response_format")
    @classmethod
    def _format(cls, v):
        kind = None if v is None else v.get("type")
        if v is None or kind in ("text", "json_object"):
            return v
        if kind != "json_schema":
            raise ValueError(f"type must be 'text', 'json_object' or 'json_schema', got "
                             f"{str(kind)[:40]!r}")
        spec = v.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError("json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}")
        return v

    @property
    def json_schema(self) -> dict | None:
        """What the output must match: None (free text), any object (``json_object``) or the
        given schema (``json_schema``)."""
        kind = (self.response_format or {}).get("type")
        if kind == "json_object":
            return {"type": "object"}
        return self.response_format["json_schema"]["schema"] if kind == "json_schema" else None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and
                    self.stream_options.get("include_usage"))


class CompletionRequest(_Request):
    """``POST /v1/completions``: ``prompt`` is a string or a list of token ids."""

    prompt: Union[str, list[StrictInt]]
    max_tokens: Optional[StrictInt] = Field(default=16, ge=1)
    echo: StrictBool = False
    logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=5)   # OpenAI's limit: 5

    @field_validator("prompt")
    @classmethod
    def _prompt_text(cls, v):
        return unicode_text(v) if isinstance(v, str) else v

    @property
    def num_logprobs(self) -> int | None:
        """Top log-probabilities per token asked for (None: none)."""
        return self.logprobs


class ChatMessage(BaseModel):
    """One chat message; ``content`` is a string or a list of ``{"type": "text", "text"}``."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[dict], None] = None
    name: Optional[str] = None                  # accepted; the chat template does not use it

    @field_validator("content")
    @classmethod
    def _content_text(cls, v):
        if isinstance(v, str):
            return unicode_text(v)
        for part in v or ():
            if isinstance(part.get("text"), str):
                unicode_text(part["text"])
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported, got "
                                 f"{part.get('type')!r}")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``; ``max_tokens`` (or ``max_completion_tokens``) defaults to
    what is left of the context after the prompt."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    max_completion_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    logprobs: Optional[StrictBool] = None
    top_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=20)
    # chat-only engine fields routers forward (CHAT_ENGINE_FIELDS)
    continue_final_message: StrictBool = False
    separate_reasoning: StrictBool = True
    stream_reasoning: StrictBool = True
    include_reasoning: StrictBool = True

    @field_validator(*CHAT_ENGINE_FIELDS)
    @classmethod
    def _chat_engine_field(cls, v, info):
        return honoured_value(CHAT_ENGINE_FIELDS, info.field_name, v)

    @property
    def num_logprobs(self) -> int | None:
        """Top log-probabilities per token asked for (None: none); ``top_logprobs`` needs
        ``logprobs: true``, as in OpenAI's API."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None


# ---------------------------------------------------------------------- responses
def new_id(prefix: str) -> str:
    """An OpenAI-style id, e.g. ``cmpl-3f2a…`` or ``chatcmpl-…``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    """``created``: Unix seconds."""
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_logprobs(entries: list[tuple], token_text, offset: int = 0) -> dict:
    """The completions API's ``logprobs`` object for ``entries`` ``(token, logprob, top)``:
    ``tokens``, ``token_logprobs``, ``top_logprobs`` ({token text: logprob}) and ``text_offset``
    (each token's start in the text, from ``offset``); ``token_text(id) -> str``."""
    tokens, offsets = [], []
    for tok, _, _ in entries:
        offsets.append(offset)
        tokens.append(token_text(tok))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
            "top_logprobs": [{token_text(i): v for i, v in top} for _, _, top in entries],
            "text_offset": offsets}


def chat_logprobs(entries: list[tuple], token_text) -> dict:
    """The chat API's ``logprobs`` object: ``{"content": [{"token", "logprob", "bytes",
    "top_logprobs": [{"token", "logprob", "bytes"}]}]}``."""
    def item(i, v):
        t = token_text(i)
        return {"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))}
    return {"content": [dict(item(tok, lp), top_logprobs=[item(i, v) for i, v in top])
                        for tok, lp, top in entries]}


def completion_response(rid: str, model: str, choices: list[dict], use: dict) -> dict:
    """``text_completion`` object; ``choices``: ``{"index", "text", "finish_reason"}`` and
    ``logprobs`` (None unless asked for)."""
    return {"id": rid, "object": "text_completion", "created": now_s(), "model": model,
            "choices": [dict(c, logprobs=c.get("logprobs")) for c in choices], "usage": use}


def completion_chunk(rid: str, model: str, index: int, text: str,
                     finish_reason: str | None, logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": now_s(), "model": model,
            "choices": [{"index": index, "text": text, "logprobs": logprobs,
                         "finish_reason": finish_reason}]}


def chat_response(rid: str, model: str, choices: list[dict], use: dict) -> dict:
    """``chat.completion`` object; ``choices``: ``{"index", "text", "finish_reason"}`` and
    ``logprobs``."""
    return {"id": rid, "object": "chat.completion", "created": now_s(), "model": model,
            "choices": [{"index": c["index"], "logprobs": c.get("logprobs"),
                         "finish_reason": c["finish_reason"],
                         "message": {"role": "assistant", "content": c["text"]}}
                        for c in choices],
            "usage": use}


def chat_chunk(rid: str, model: str, index: int, delta: dict,
               finish_reason: str | None, logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": now_s(), "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                         "finish_reason": finish_reason}]}


def usage_chunk(rid: str, model: str, obj: str, use: dict) -> dict:
    """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
    return {"id": rid, "object": obj, "created": now_s(), "model": model, "choices": [],
            "usage": use}


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}``, the body of every 4xx / 5xx;
    ``message`` cut at :data:`MAX_ERROR_MESSAGE_CHARS` (with "…")."""
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        message = message[:MAX_ERROR_MESSAGE_CHARS - 1] + "…"
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
