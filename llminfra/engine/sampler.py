"""Turn each sequence's logits into its next token: greedy, temperature, top-k, top-p.

For logits z ``(V,)`` and temperature T > 0: z' = z / T; top-k keeps the k largest z' (Fan et al.
2018, arXiv:1805.04833, §5.4); top-p keeps the smallest set of most likely tokens whose
probability sums to at least p (Holtzman et al. 2020, arXiv:1904.09751, §3.1); the token is
drawn from softmax of what is kept, with the sequence's own ``torch.Generator`` — so a seeded
request gives the same tokens whatever else shares its batch. T = 0 is argmax, and so is any
T below :data:`~llminfra.engine.sampling_params.MIN_TEMPERATURE` (z / 1e-39 overflows float32).

Worked example (top-p): probabilities [0.5, 0.3, 0.15, 0.05], p = 0.8 -> the sorted cumulative
sums before each token are [0, 0.5, 0.8, 0.95]; a token is kept while the mass before it is
< p, so {0.5, 0.3} survive. The most likely token is always kept: its mass before is 0, and a
p as small as 1e-46 rounds to 0 in float32, which would otherwise drop every token and leave
softmax nothing but -inf (NaN). Taught in chapter 05.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llminfra.engine.sampling_params import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Set every logit outside the top-k and the top-p nucleus to -inf (the most likely token
    always stays). ``(V,)`` -> ``(V,)``."""
    z = logits.clone()
    if top_k is not None and top_k < z.numel():
        kth = torch.topk(z, top_k).values[-1]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        p_sorted, order = torch.sort(torch.softmax(z, dim=-1), descending=True)
        mass_before = torch.cumsum(p_sorted, dim=-1) - p_sorted
        drop = mass_before >= top_p
        drop[0] = False                                   # the nucleus is never empty
        z[order[drop]] = float("-inf")
    return z


def sample_token(logits: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator) -> int:
    """One token drawn from ``logits`` ``(V,)`` at ``params``' temperature, top-k and top-p
    (a sampling, not a greedy, ``params``)."""
    z = filter_logits(logits.float() / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(z, dim=-1)
    return int(torch.multinomial(probs.to(generator.device), 1, generator=generator))


def sample_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                  generators: Sequence[torch.Generator | None], *,
                  errors: str = "raise") -> list:
    """One token per row of ``logits`` ``(n, V)``; row i uses ``params[i]`` and
    ``generators[i]`` (needed when it samples: temperature >= ``MIN_TEMPERATURE``).

    ``errors="return"``: a row whose sampling raises gets the exception in its place and the
    other rows are still drawn, each from its own generator as if nothing had failed (the
    engine fails that one request and serves the rest)."""
    if logits.dim() != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(f"need logits (n, V) with n = len(params) = len(generators); got "
                         f"{tuple(logits.shape)}, {len(params)}, {len(generators)}")
    if errors not in ("raise", "return"):
        raise ValueError(f"errors must be 'raise' or 'return', got {errors!r}")
    greedy = logits.argmax(dim=-1).tolist()
    out = []
    for i, (p, g) in enumerate(zip(params, generators)):
        try:
            if p.greedy:
                out.append(int(greedy[i]))
                continue
            if g is None:
                raise ValueError(f"row {i} samples (temperature {p.temperature}) but has no "
                                 "torch.Generator")
            out.append(sample_token(logits[i], p, g))
        except Exception as err:  # noqa: BLE001 - handed back when errors="return"
            if errors == "raise":
                raise
            out.append(err)
    return out
