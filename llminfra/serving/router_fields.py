"""Engine fields a router forwards, and what this server does with each.

A router in front of a fleet forwards each request with the engine
fields of the server it was written for: ``vllm-router`` 0.1.17 and ``sglang-router`` 0.3.2
(``--policy cache_aware``) add ``no_stop_trim``, ``ignore_eos``, ``skip_special_tokens`` and
``return_hidden_states`` to every completion, and ``continue_final_message``,
``separate_reasoning``, ``stream_reasoning`` and ``include_reasoning`` to every chat request
(their bodies captured on loopback; ``tests/test_real_routers.py``). vLLM's and SGLang's OpenAI
servers accept them, so this one does too, by an explicit allow list —
:data:`ENGINE_FIELDS` (each field, the value this server honours, what it means here). A field
is *honoured* where it has a meaning here (``ignore_eos``), *ignored* where no value can change
the answer (no reasoning parser: the three reasoning switches; the tiny model has no special
tokens and the engine's text never shows the stop token that ended it:
``skip_special_tokens``, ``spaces_between_special_tokens`` — the one difference left, a
special token the real model generates mid-text, stays in the text), and *refused* (400 naming
it and why) at a value that would change the answer in a way this server cannot give —
``no_stop_trim`` / ``include_stop_str_in_output`` true (the text keeps its stop string),
``return_hidden_states`` true, ``continue_final_message`` true. Any other unknown field, a
typo included, is still a 400 (``extra="forbid"``).
"""

from __future__ import annotations

import json


#: engine fields vLLM's and SGLang's OpenAI servers accept that routers forward:
#: name -> (the one value this server honours, or None for any; what the field means here).
#: A value other than the honoured one is refused with a 400 naming the field and this reason.
ENGINE_FIELDS: dict[str, tuple[object, str]] = {
    "no_stop_trim": (False, "SGLang's switch to keep the matched stop string at the end of the "
                            "text; this server always trims it"),
    "include_stop_str_in_output": (False, "vLLM's name for keeping the matched stop string in "
                                          "the text; this server always trims it"),
    "return_hidden_states": (False, "SGLang's switch to return the last layer's hidden states; "
                                    "this server returns text, token log-probabilities only"),
    "skip_special_tokens": (None, "no effect: the text never shows the stop token that ended "
                                  "it (EOS, <|im_end|>) and the tiny model has no special "
                                  "tokens; a special token the real model generates mid-text "
                                  "stays"),
    "spaces_between_special_tokens": (None, "no effect (as skip_special_tokens)"),
}
#: the chat-only ones, as :data:`ENGINE_FIELDS`
CHAT_ENGINE_FIELDS: dict[str, tuple[object, str]] = {
    "continue_final_message": (False, "continuing the last assistant message instead of "
                                      "opening a new one; this server's chat templates always "
                                      "open a new assistant turn"),
    "separate_reasoning": (None, "no effect: the served models have no reasoning parser"),
    "stream_reasoning": (None, "no effect: the served models have no reasoning parser"),
    "include_reasoning": (None, "no effect: the served models have no reasoning parser"),
}


def honoured_value(table: dict, name: str, value):
    """``value`` if this server can give the answer it asks for (:data:`ENGINE_FIELDS`), else
    ``ValueError`` naming the field and why."""
    honoured, meaning = table[name]
    if honoured is not None and value != honoured:
        raise ValueError(f"{name}: {json.dumps(value)} is not supported: {meaning} (send "
                         f"{json.dumps(honoured)} or leave it out)")
    return value


__all__ = ["CHAT_ENGINE_FIELDS", "ENGINE_FIELDS", "honoured_value"]
