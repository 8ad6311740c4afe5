"""How to pick each next token, and when to stop: :class:`SamplingParams`.

The knobs of the OpenAI completions API and of vLLM's ``SamplingParams``, validated once, when
the object is made:

* ``temperature`` T: p_i = softmax(z / T)_i; T = 0 means greedy (argmax), no randomness;
* ``top_k``: keep only the k largest logits (Fan et al. 2018, arXiv:1805.04833, §5.4);
* ``top_p``: keep the smallest set of tokens whose probabilities sum to at least p, the nucleus
  (Holtzman et al. 2020, arXiv:1904.09751, §3.1);
* ``n`` completions per prompt, ``seed`` for reproducible sampling (completion j draws from a
  ``torch.Generator`` seeded ``seed + j``), ``stop`` strings that end a completion (the stop
  string itself is not returned), ``max_tokens`` new tokens at most; ``ignore_eos`` keeps
  generating past the model's end-of-sequence tokens (vLLM's extension, for load tests that
  want outputs of a set length).

Taught in chapter 05.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request; bad values raise ``ValueError`` naming what is allowed.

    >>> SamplingParams(max_tokens=8).greedy
    True
    >>> SamplingParams(temperature=0.8, top_p=0.9, seed=1).greedy
    False
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | tuple[str, ...] | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        def positive_int(name, value):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        positive_int("max_tokens", self.max_tokens)
        positive_int("n", self.n)
        if self.top_k is not None:
            positive_int("top_k", self.top_k)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or self.seed < 0):
            raise ValueError(f"seed must be None or an int >= 0, got {self.seed!r}")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is not None:
            stop = tuple(stop)
            if not all(isinstance(s, str) and s for s in stop):
                raise ValueError(f"stop must be a non-empty string or a list of them, got "
                                 f"{self.stop!r}")
        object.__setattr__(self, "stop", stop)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax (temperature 0)."""
        return self.temperature == 0

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings as a tuple (empty when none)."""
        return self.stop or ()
