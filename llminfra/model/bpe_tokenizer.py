"""The real model's tokenizer: byte-level BPE built with Hugging Face ``tokenizers``, and its chat
template rendered with jinja2.

Byte-level BPE (Radford et al. 2019, GPT-2; Sennrich et al. 2016, arXiv:1508.07909) maps every
byte to a printable character (so ``Ġ`` is a space), splits the text into words with a regular
expression, and merges adjacent symbols in the order of the learned merge list. SmolLM2's 49,152
tokens and 48,900 merges come from the GGUF file's ``tokenizer.ggml.*`` fields (or from a Hugging
Face ``tokenizer.json``); the library, not this module, does the merging. The split before BPE is
the one the file's ``tokenizer.ggml.pre`` names: ``smollm`` isolates every digit (llama.cpp's
``LLAMA_VOCAB_PRE_TYPE_SMOLLM`` and the released ``tokenizer.json`` both do), then GPT-2's
pattern. Tokens of type CONTROL (``<|im_start|>``, ``<|im_end|>`` …) are special: matched whole
in the text, never split.

The chat template is the Jinja text stored in the file (``tokenizer.chat_template``), rendered in
a sandbox with ``trim_blocks`` and ``lstrip_blocks``, as ``transformers`` renders it.

Taught in chapter 05 (and met in 02 and 04).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path

#: GGUF ``tokenizer.ggml.token_type`` of a control (special) token
CONTROL = 3
#: pre-tokenizer names (``tokenizer.ggml.pre``) -> whether digits are split one by one first
_DIGIT_SPLIT = {"smollm": True, "starcoder": True, "refact": True, "gpt2": False,
                "default": False}


class BPETokenizer:
    """``encode`` / ``decode`` / ``apply_chat_template`` over a ``tokenizers.Tokenizer``.

    The same interface as :class:`llminfra.model.ByteTokenizer`: ``vocab_size``,
    ``eos_token_id`` and ``stop_token_ids`` (generation ends on any of them). ``encode`` never
    adds a BOS token (SmolLM2's ``add_bos_token`` is false; the chat template writes what the
    model expects). Special tokens written in the text (``<|im_end|>``) encode to their id.
    """

    def __init__(self, backend, *, eos_token_id: int | None, bos_token_id: int | None = None,
                 stop_token_ids: Iterable[int] = (), chat_template: str | None = None,
                 name: str = "bpe"):
        self.backend = backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.eos_token_id, self.bos_token_id = eos_token_id, bos_token_id
        stops = {int(t) for t in stop_token_ids}
        if eos_token_id is not None:
            stops.add(int(eos_token_id))
        self.stop_token_ids = frozenset(stops)
        self.chat_template = chat_template
        self.name = name
        self._special_re = self._plain = self._json = None   # built on first use

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_gguf_metadata(cls, meta: dict, name: str = "gguf") -> "BPETokenizer":
        """Build from a GGUF file's metadata (``tokenizer.ggml.model == "gpt2"``: byte-level BPE).
        ``ValueError`` naming the field for another tokenizer model or a missing field."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"{name}: tokenizer.ggml.model is {kind!r}; only byte-level BPE "
                             f"('gpt2') is supported")
        for field in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if not meta.get(field):
                raise ValueError(f"{name}: metadata field {field!r} is missing")
        tokens = meta["tokenizer.ggml.tokens"]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        backend = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if _DIGIT_SPLIT.get(pre, False):
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()
        types = meta.get("tokenizer.ggml.token_type") or []
        specials = [AddedToken(tok, special=True, normalized=False)
                    for tok, kind in zip(tokens, types) if kind == CONTROL]
        backend.add_special_tokens(specials)
        eos = meta.get("tokenizer.ggml.eos_token_id")
        bos = meta.get("tokenizer.ggml.bos_token_id")
        stops = [i for i, tok in enumerate(tokens) if tok in ("<|endoftext|>", "<|im_end|>",
                                                              "<|eot_id|>", "<|end_of_text|>")]
        return cls(backend, eos_token_id=eos, bos_token_id=bos, stop_token_ids=stops,
                   chat_template=meta.get("tokenizer.chat_template"), name=name)

    @classmethod
    def from_hf_folder(cls, folder: str | Path) -> "BPETokenizer":
        """Build from a Hugging Face folder: ``tokenizer.json`` as it is, ``tokenizer_config.json``
        (chat template, EOS token) and ``generation_config.json`` (EOS ids) where present."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"{folder}: tokenizer.json is missing")
        backend = Tokenizer.from_file(str(path))
        conf = _read_json(folder / "tokenizer_config.json")
        gen = _read_json(folder / "generation_config.json")
        template = conf.get("chat_template")
        if template is None and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        eos_tok = conf.get("eos_token")
        if isinstance(eos_tok, dict):
            eos_tok = eos_tok.get("content")
        eos = backend.token_to_id(eos_tok) if eos_tok else None
        gen_eos = gen.get("eos_token_id")
        stops = gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
        bos_tok = conf.get("bos_token")
        if isinstance(bos_tok, dict):
            bos_tok = bos_tok.get("content")
        return cls(backend, eos_token_id=eos if eos is not None else (stops or [None])[0],
                   bos_token_id=backend.token_to_id(bos_tok) if bos_tok else None,
                   stop_token_ids=stops, chat_template=template, name=str(folder))

    # ------------------------------------------------------------------ the interface
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens in it kept whole; no BOS added). Through
        ``encode_batch``, which releases Python's GIL while it works (``encode`` holds it): a
        server tokenizing a long prompt in a worker thread does not stop its other threads."""
        if not isinstance(text, str):
            raise ValueError(f"encode wants a str, got {type(text).__name__}")
        try:
            return self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        except TypeError:
            _utf8(text)                 # a lone surrogate: a UnicodeEncodeError naming it
            raise

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; bytes that do not complete a UTF-8 character become U+FFFD (a
        stream holds those back: :func:`llminfra.serving.relay.stable_delta`)."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got {bad[:5]}")
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True
                            ) -> str:
        """The prompt text for chat ``messages`` (``[{"role", "content"}, …]``), rendered from the
        model's own template. ``ValueError`` when the model has none."""
        if not self.chat_template:
            raise ValueError(f"{self.name} has no chat template (tokenizer.chat_template)")
        return render_chat_template(self.chat_template, messages, add_generation_prompt,
                                    bos_token=self._token(self.bos_token_id),
                                    eos_token=self._token(self.eos_token_id))

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True
                    ) -> list[int]:
        """Token ids of the chat prompt, where only the template writes control tokens.

        The template is rendered with a unique mark in place of each message's ``content``;
        control-token strings (``<|im_start|>`` …) are parsed in the template's own text only,
        and everything between two of them (template text and message content alike) is encoded
        with special-token parsing off. A user who writes ``<|im_end|>\\n<|im_start|>system`` in a
        message gets the ordinary tokens of those characters, not a forged system turn. For
        content without such strings the ids equal ``encode(apply_chat_template(messages))``
        (the library splits text at special tokens before BPE in both cases).
        ``ValueError`` when the model has no template, or when the template rewrites message
        content (the marks do not come back once each, in order) and a content holds a
        special-token string, so that content cannot be told apart from template.
        """
        if not self.chat_template:
            raise ValueError(f"{self.name} has no chat template (tokenizer.chat_template)")
        msgs = [dict(m) for m in messages]
        nonce = secrets.token_hex(8)
        marks = {}
        for i, m in enumerate(msgs):
            if isinstance(m.get("content"), str):
                mark = f"\x00llminfra-content-{nonce}-{i}\x00"
                marks[mark], m["content"] = m["content"], mark
        skeleton = render_chat_template(self.chat_template, msgs, add_generation_prompt,
                                        bos_token=self._token(self.bos_token_id),
                                        eos_token=self._token(self.eos_token_id))
        pieces = re.split("(" + "|".join(map(re.escape, marks)) + ")", skeleton) if marks \
            else [skeleton]
        found = pieces[1::2]
        if found != list(marks):
            special = self._special_pattern()
            if any(special.search(c) for c in marks.values()):
                raise ValueError(f"{self.name}'s chat template rewrites message content, so a "
                                 "content holding a special-token string cannot be kept plain")
            return self.encode(self.apply_chat_template(messages, add_generation_prompt))
        # (text, trusted) segments: template text is trusted, message content is not
        segments = [(p, True) if k % 2 == 0 else (marks[p], False) for k, p in enumerate(pieces)]
        return self._encode_segments(segments)

    @property
    def backend_json(self) -> str:
        """The backend as Hugging Face ``tokenizer.json`` text (what the structured-output
        grammar compiles against), serialised once."""
        if getattr(self, "_json", None) is None:
            self._json = self.backend.to_str()
        return self._json

    def _special_pattern(self):
        """A regex of every special added token, longest first (leftmost-longest match)."""
        if getattr(self, "_special_re", None) is None:
            specials = sorted((t.content for t in self.backend.get_added_tokens_decoder().values()
                               if t.special), key=len, reverse=True)
            self._special_re = re.compile("|".join(map(re.escape, specials)) or "(?!)")
        return self._special_re

    def _plain_backend(self):
        """A copy of the backend that encodes special-token strings as ordinary text."""
        if getattr(self, "_plain", None) is None:
            from tokenizers import Tokenizer
            plain = Tokenizer.from_str(self.backend.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain

    def _encode_segments(self, segments: list[tuple[str, bool]]) -> list[int]:
        """Ids of the concatenated segments: special tokens only where a trusted segment writes
        them, every run of text between two of them encoded plain."""
        special = self._special_pattern()
        runs, controls, current = [], [], []
        for text, trusted in segments:
            if not trusted:
                current.append(text)
                continue
            at = 0
            for m in special.finditer(text):
                current.append(text[at:m.start()])
                runs.append("".join(current))
                controls.append(self.backend.token_to_id(m.group()))
                current, at = [], m.end()
            current.append(text[at:])
        runs.append("".join(current))
        try:
            encoded = self._plain_backend().encode_batch(runs, add_special_tokens=False)
        except TypeError:
            for run in runs:
                _utf8(run)              # a lone surrogate: a UnicodeEncodeError naming it
            raise
        ids = []
        for k, enc in enumerate(encoded):
            ids.extend(enc.ids)
            if k < len(controls):
                ids.append(controls[k])
        return ids

    def _token(self, i: int | None) -> str:
        return "" if i is None else (self.backend.id_to_token(int(i)) or "")

    def __repr__(self) -> str:
        return f"BPETokenizer({self.name!r}, vocab_size={self.vocab_size})"


def _utf8(text: str) -> None:
    """``UnicodeEncodeError`` (a ``ValueError``) if ``text`` holds a lone surrogate such as
    ``"\\ud800"``, which Python strings (and JSON) allow and no tokenizer can encode."""
    text.encode("utf-8")


def render_chat_template(template: str, messages: Sequence[dict], add_generation_prompt: bool,
                         **extra) -> str:
    """Render a Hugging Face chat template with jinja2 in a sandbox, ``trim_blocks`` and
    ``lstrip_blocks`` on and ``raise_exception`` defined, as ``transformers`` does; a template
    error (its own ``raise_exception`` included) is a ``ValueError``."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    msgs = [dict(m) for m in messages]
    for m in msgs:
        if "role" not in m or "content" not in m:
            raise ValueError(f"a chat message needs 'role' and 'content', got keys {sorted(m)}")
    try:
        return env.from_string(template).render(messages=msgs,
                                                add_generation_prompt=add_generation_prompt,
                                                **extra)
    except TemplateError as e:          # the template's raise_exception, or a template bug
        raise ValueError(f"the chat template refused the messages: {e}") from None


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
