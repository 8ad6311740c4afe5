"""The sampling arithmetic every decoder of the package shares: logits processors (bias,
repetition / presence / frequency penalties) and the filters (top-k, top-p, min-p).

:func:`llminfra.model.generate`'s sampler and the serving engine's
(:mod:`llminfra.engine.sampler`, which also verifies speculative drafts) both call these, so a
rule is written once. Worked example (top-p): probabilities [0.5, 0.3, 0.15, 0.05], p = 0.8 ->
the sorted cumulative sums before each token are [0, 0.5, 0.8, 0.95]; a token is kept while the
mass before it is < p, so {0.5, 0.3} survive. The most likely token is always kept: its mass
before is 0, and a p as small as 1e-46 rounds to 0 in float32, which would otherwise drop every
token and leave softmax nothing but -inf (NaN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch


def apply_penalties(logits: torch.Tensor, prompt_ids: Sequence[int], output_ids: Sequence[int],
                    *, logit_bias: Mapping[int, float] | None = None,
                    repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                    frequency_penalty: float = 0.0) -> torch.Tensor:
    """Logits processors on one row ``(V,)``, in vLLM's order: ``logit_bias`` added; the
    repetition penalty r over prompt and output tokens (a positive logit divided by r, a
    negative one multiplied: Keskar et al. 2019, arXiv:1909.05858, §4.1); then
    z -= count · frequency + [count > 0] · presence over the output tokens (OpenAI's rule). A new
    float32 tensor."""
    z = logits.float().clone()
    if logit_bias:
        ids = torch.tensor(list(logit_bias), dtype=torch.long, device=z.device)
        z[ids] += torch.tensor(list(logit_bias.values()), dtype=z.dtype, device=z.device)
    if repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long,
                            device=z.device)
        if seen.numel():
            vals = z[seen]
            z[seen] = torch.where(vals > 0, vals / repetition_penalty, vals * repetition_penalty)
    if (frequency_penalty or presence_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(list(output_ids), dtype=torch.long,
                                             device=z.device), minlength=z.numel()).to(z.dtype)
        z -= counts * frequency_penalty + (counts > 0).to(z.dtype) * presence_penalty
    return z


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float = 1.0,
                  min_p: float = 0.0) -> torch.Tensor:
    """Set every logit outside the top-k (Fan et al. 2018, arXiv:1805.04833, §5.4), the top-p
    nucleus (Holtzman et al. 2020, arXiv:1904.09751, §3.1) and, for ``min_p`` > 0, the tokens
    less than min_p times as likely as the most likely (Nguyen et al. 2024, arXiv:2407.01082)
    to -inf; the most likely token always stays. ``(V,)`` -> ``(V,)``."""
    z = logits.clone()
    if min_p > 0.0:                 # p_i >= min_p * p_max  <=>  z_i >= z_max + ln(min_p)
        z = z.masked_fill(z < z.max() + math.log(min_p), float("-inf"))
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
