"""Turn each sequence's logits into its next token: greedy, temperature, top-k, top-p.

For logits z ``(V,)`` and temperature T > 0: z' = z / T; top-k keeps the k largest z' (Fan et al.
2018, arXiv:1805.04833, §5.4); top-p keeps the smallest set of most likely tokens whose
probability sums to at least p (Holtzman et al. 2020, arXiv:1904.09751, §3.1); the token is
drawn from softmax of what is kept, with the sequence's own ``torch.Generator`` — so a seeded
request gives the same tokens whatever else shares its batch. T = 0 is argmax.

Worked example (top-p): probabilities [0.5, 0.3, 0.15, 0.05], p = 0.8 -> the sorted cumulative
sums before each token are [0, 0.5, 0.8, 0.95]; a token is kept while the mass before it is
< p, so {0.5, 0.3} survive. Taught in chapter 05.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llminfra.engine.sampling_params import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """Set every logit outside the top-k and the top-p nucleus to -inf. ``(V,)`` -> ``(V,)``."""
    z = logits.clone()
    if top_k is not None and top_k < z.numel():
        kth = torch.topk(z, top_k).values[-1]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        p_sorted, order = torch.sort(torch.softmax(z, dim=-1), descending=True)
        mass_before = torch.cumsum(p_sorted, dim=-1) - p_sorted
        drop = order[mass_before >= top_p]
        z[drop] = float("-inf")
    return z


def sample_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                  generators: Sequence[torch.Generator | None]) -> list[int]:
    """One token per row of ``logits`` ``(n, V)``; row i uses ``params[i]`` and
    ``generators[i]`` (needed when its temperature is > 0)."""
    if logits.dim() != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(f"need logits (n, V) with n = len(params) = len(generators); got "
                         f"{tuple(logits.shape)}, {len(params)}, {len(generators)}")
    greedy = logits.argmax(dim=-1).tolist()
    out = []
    for i, (p, g) in enumerate(zip(params, generators)):
        if p.greedy:
            out.append(int(greedy[i]))
            continue
        if g is None:
            raise ValueError(f"row {i} samples (temperature {p.temperature}) but has no "
                             "torch.Generator")
        z = filter_logits(logits[i].float() / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(z, dim=-1)
        out.append(int(torch.multinomial(probs.to(g.device), 1, generator=g)))
    return out
