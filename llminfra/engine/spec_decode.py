"""Speculative decoding: guess several tokens cheaply, let the model check them all in one pass.

A decode step of a small batch reads every weight to produce one token per sequence; reading
them to score γ + 1 positions costs little more (chapter 08's roofline). So a *proposer* guesses
γ draft tokens d_1 .. d_γ, the engine schedules the sequence's last token with the drafts after
it (its computed tokens are then γ + 1 behind: :mod:`.scheduler`), and one forward pass gives
the target's distributions p_0 .. p_γ at those positions. Verification keeps a prefix of the
drafts and always adds one token of its own, so a step yields 1 .. γ + 1 tokens, never fewer than
plain decoding:

* greedy: d_i is kept while it equals argmax p_{i-1}; the first mismatch is replaced by that
  argmax (or, all kept, argmax p_γ is added). The output is exactly plain greedy decoding's.
* sampling: d_i (drawn from the proposer's q_{i-1}) is kept with probability
  min(1, p_{i-1}(d_i) / q_{i-1}(d_i)); at the first rejection a token is drawn from the residual
  max(0, p - q) renormalised, and if all are kept, from p_γ. Every emitted token is then
  distributed exactly as the target's (Leviathan et al. 2023, arXiv:2211.17192, §2.3 and
  Appendix A; Chen et al. 2023, arXiv:2302.01318, Theorem 1). Both proposers here draft
  deterministically, q = one-hot(d): keep d with probability p(d), else draw from p with d
  removed.

With a per-token acceptance rate α (drafts independent), a step yields on average
E = (1 − α^{γ+1}) / (1 − α) tokens (Leviathan et al. 2023, Eq. 1). If a step with drafts costs
1 + c₀ + γ·c plain steps — c₀ once for scoring more than one position at all, c per draft
(proposing and verifying it) — the speedup is E / (1 + c₀ + γ·c). On a GPU c₀ ≈ 0 (a decode
step is bound by reading the weights, not by the rows it multiplies); on a CPU thread it is not:
PyTorch's product with 2 rows is a small matrix product bound by arithmetic, not a
matrix-vector product streaming the weights (``bench spec`` fits c₀ and c). :func:`choose_gamma` picks the γ that maximises the speedup
from a running estimate of α — the adaptive rule — and proposes nothing when no γ beats plain
decoding (trying again after a pause that doubles each time it still does not pay).

Proposers (:mod:`llminfra.engine.draft_proposers`): :class:`PromptLookup` (the n-gram match
of Saxena 2023, "prompt lookup decoding": find the sequence's last n tokens earlier in its own
tokens and propose what followed them; free, and good where the output copies the input) and
:class:`DraftModel` (a smaller or cheaper model with the same tokenizer, e.g. an int4 copy of
the target through :class:`~llminfra.runner.fast_decode.FastDecoder`). Taught in chapter 05.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llminfra.engine.draft_proposers import DraftModel, PromptLookup
from llminfra.engine.sampler import probabilities
from llminfra.engine.sampling_params import SamplingParams
from llminfra.engine.sequence import Sequence
from llminfra.validate import non_negative_int

METHODS = ("ngram", "draft")
#: step costs (in plain steps) the adaptive rule assumes by default, near what ``bench spec``
#: fitted on SmolLM2-135M, fp32, one thread of a 2-core AMD EPYC (llminfra/data/
#: bench_spec_cpu.json ``fitted_costs``; two recorded runs gave ngram 0.77 + 0.04·γ and
#: 0.71 + 0.15·γ, int4 draft 0.65 + 0.31·γ and 1.03 + 0.24·γ), erring toward not speculating;
#: the draft's per-token cost includes running the int4 draft model
DEFAULT_COSTS = {"ngram": {"cost_fixed": 0.9, "cost_per_draft": 0.05},
                 "draft": {"cost_fixed": 1.0, "cost_per_draft": 0.3}}


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """E = 1 + α + … + α^γ = (1 − α^{γ+1}) / (1 − α): tokens one verification yields on
    average when each draft is accepted with probability ``alpha`` (γ + 1 at α = 1)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    non_negative_int("gamma", gamma)
    return float(gamma + 1) if alpha == 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, cost_per_draft: float,
                      cost_fixed: float = 0.0) -> float:
    """E(α, γ) / (1 + c₀·[γ > 0] + γ·c): tokens per unit of plain-step time, relative to plain
    decoding (c = ``cost_per_draft``, c₀ = ``cost_fixed``)."""
    if cost_per_draft < 0 or cost_fixed < 0:
        raise ValueError(f"costs must be >= 0, got {cost_per_draft!r}, {cost_fixed!r}")
    cost = 1.0 + (cost_fixed + gamma * cost_per_draft if gamma else 0.0)
    return expected_tokens_per_step(alpha, gamma) / cost


def choose_gamma(alpha: float, gamma_max: int, cost_per_draft: float,
                 cost_fixed: float = 0.0) -> int:
    """The γ in 0 .. ``gamma_max`` of the largest :func:`predicted_speedup` (0: plain decoding,
    when nothing beats it)."""
    return max(range(gamma_max + 1),
               key=lambda g: (predicted_speedup(alpha, g, cost_per_draft, cost_fixed), -g))


def accept_greedy(target_argmax: list[int], drafts: list[int]) -> list[int]:
    """The greedy acceptance step on token ids: ``target_argmax[i]`` is the target's choice
    after the last token and the first i drafts (γ + 1 of them for γ drafts). Drafts are kept
    while they equal the target's choice; then the target's own token is added — the
    correction at the first mismatch, or the bonus token when every draft was kept.
    ``accept_greedy([7, 3, 9], [7, 4]) == [7, 3]``."""
    if len(target_argmax) != len(drafts) + 1:
        raise ValueError(f"need len(target_argmax) = len(drafts) + 1, got "
                         f"{len(target_argmax)} and {len(drafts)}")
    out = []
    for want, d in zip(target_argmax, drafts):
        if want != d:
            break
        out.append(d)
    return out + [int(target_argmax[len(out)])]


def verify_greedy(logits: torch.Tensor, drafts: list[int]) -> list[int]:
    """Greedy verification: ``logits`` ``(γ+1, V)`` at the last token and each draft. The kept
    drafts, then the target's own next token (:func:`accept_greedy`)."""
    return accept_greedy([int(t) for t in logits.argmax(dim=-1).tolist()], list(drafts))


def rejection_sample(p: torch.Tensor, drafts: list[int], generator: torch.Generator,
                     q: torch.Tensor | None = None) -> list[int]:
    """Exact speculative sampling: ``p`` ``(γ+1, V)`` the target's distributions, ``q``
    ``(γ, V)`` the proposer's (None: one-hot at each draft). Returns the kept drafts and one
    token of the target's: the residual draw at the first rejection, else a draw from p_γ."""
    k = len(drafts)
    if p.dim() != 2 or p.shape[0] != k + 1:
        raise ValueError(f"p must be (γ+1, V) = ({k + 1}, V), got {tuple(p.shape)}")
    if q is None:
        q = torch.zeros(k, p.shape[1], dtype=p.dtype, device=p.device)
        q[torch.arange(k), torch.tensor(drafts, dtype=torch.long)] = 1.0
    out = []
    for i, d in enumerate(drafts):
        u = float(torch.rand((), generator=generator, device=generator.device))
        if u * float(q[i, d]) < float(p[i, d]):             # u < p/q without dividing by 0
            out.append(d)
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:                    # p == q: nothing to correct
            residual = p[i]
        return out + [_draw(residual, generator)]
    return out + [_draw(p[k], generator)]


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(weights.float().to(generator.device), 1, generator=generator))


def verify(logits: torch.Tensor, drafts: list[int], params: SamplingParams,
           generator: torch.Generator | None) -> list[int]:
    """The tokens a step with ``drafts`` yields, greedy or sampled as ``params`` say, through
    the one sampler's filtered distribution (:func:`~llminfra.engine.sampler.probabilities`)."""
    if params.greedy:
        return verify_greedy(logits, drafts)
    if generator is None:
        raise ValueError("a sampled request needs its torch.Generator to verify drafts")
    return rejection_sample(probabilities(logits, params), drafts, generator)


@dataclass(frozen=True)
class SpeculativeConfig:
    """``method`` ``"ngram"`` (:class:`PromptLookup`) or ``"draft"`` (:class:`DraftModel` over
    ``draft``, a FastDecoder); ``num_speculative_tokens`` γ (a request's
    ``SamplingParams.num_speculative_tokens`` overrides it); ``adaptive``: choose γ ≤ that per
    step by :func:`choose_gamma` from the request's measured acceptance, with the step cost
    1 + ``cost_fixed`` + γ·``cost_per_draft`` in plain steps (None: the method's
    :data:`DEFAULT_COSTS`)."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    adaptive: bool = False
    cost_per_draft: float | None = None
    cost_fixed: float | None = None
    draft: object | None = None
    ngram_min: int = 2
    ngram_max: int = 4

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r}; allowed: {METHODS}")
        g = self.num_speculative_tokens
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"num_speculative_tokens must be an int >= 1, got {g!r}")
        for name in ("cost_per_draft", "cost_fixed"):
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, DEFAULT_COSTS[self.method][name])
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be None or a number >= 0, got {value!r}")
        if self.method == "draft" and self.draft is None:
            raise ValueError("method 'draft' needs draft=FastDecoder(draft_model, ...)")

    def proposer(self):
        """The proposer this config describes."""
        if self.method == "ngram":
            return PromptLookup(self.ngram_min, self.ngram_max)
        return DraftModel(self.draft)


class Speculator:
    """The engine's side of speculation: proposes drafts before a step, verifies them after,
    and keeps each request's acceptance (and, adaptive, its γ). A new request's estimate starts
    from the engine's recent acceptance, so a workload where drafts miss stops speculating
    from its first steps on."""

    #: a request that stopped speculating tries γ = 1 again after this many steps, a pause
    #: that doubles after every probe that still does not pay — unless its proposer would
    #: first have to catch up on more than PROBE_BACKLOG tokens (a draft model that has not
    #: seen the tokens since it stopped: reading them costs more than the probe can win)
    PROBE_AFTER = 8
    PROBE_BACKLOG = 4

    def __init__(self, config: SpeculativeConfig, max_seq_len: int):
        self.config, self.max_seq_len = config, max_seq_len
        self.proposer = config.proposer()
        self.num_proposed = self.num_accepted = self.num_verifications = 0
        self._alpha: dict[int, list[float]] = {}    # seq id -> [accepted, trials] (decayed)
        self._engine_alpha = [0.0, 0.0]             # the same over every request
        self._idle: dict[int, list[int]] = {}     # seq id -> [steps idle, pause]

    def gamma(self, seq: Sequence) -> int:
        """γ for ``seq``'s next step: its request's, or the engine's (adaptive: chosen from
        its acceptance so far), capped so the drafts fit ``max_tokens`` and the context."""
        p = seq.params
        if p.has_processors or p.logprobs is not None or p.json_schema is not None:
            # the drafts would need them at every position
            return 0
        g = p.num_speculative_tokens
        g = self.config.num_speculative_tokens if g is None else g
        if g and self.config.adaptive:
            if seq.seq_id not in self._idle:        # a new request: old evidence weighs less
                self._engine_alpha = [0.9 * x for x in self._engine_alpha]
            acc, trials = self._alpha.get(seq.seq_id) or self._prior()
            chosen = choose_gamma(acc / trials, g, self.config.cost_per_draft,
                                  self.config.cost_fixed)
            idle = self._idle.setdefault(seq.seq_id, [0, self.PROBE_AFTER])
            if chosen == 0:
                idle[0] += 1
                if idle[0] >= idle[1] and self.proposer.backlog(seq) <= self.PROBE_BACKLOG:
                    chosen, idle[0], idle[1] = 1, 0, 2 * idle[1]   # probe; wait twice as long
            else:
                idle[:] = [0, self.PROBE_AFTER]
            g = chosen
        room = min(seq.max_tokens - len(seq.output_token_ids) - 1,
                   self.max_seq_len - seq.num_tokens)
        return max(0, min(g, room))

    def propose(self, seqs: list[Sequence]) -> dict[Sequence, list[int]]:
        """The drafts of every sequence that is ready to decode (the scheduler gives them to
        it: :meth:`~llminfra.engine.scheduler.Scheduler.set_drafts`)."""
        drafts = {}
        for seq in seqs:
            if seq.num_uncomputed_tokens != 1 or not seq.output_token_ids:
                continue
            g = self.gamma(seq)
            drafts[seq] = self.proposer.propose(seq, g) if g else []
        return drafts

    def verify(self, seq: Sequence, logits: torch.Tensor, drafts: list[int]) -> list[int]:
        """The tokens ``seq`` gets from the logits at its last token and ``drafts``; counts
        the acceptance."""
        tokens = verify(logits, drafts, seq.params, seq.generator)
        kept = len(tokens) - 1
        self.num_proposed += len(drafts)
        self.num_accepted += kept
        self.num_verifications += 1
        m = seq.request.metrics
        m.num_draft_tokens += len(drafts)
        m.num_accepted_tokens += kept
        miss = int(kept < len(drafts))
        acc, trials = self._alpha.get(seq.seq_id) or self._prior()
        self._alpha[seq.seq_id] = [0.8 * acc + kept, 0.8 * trials + kept + miss]
        g_acc, g_trials = self._engine_alpha
        self._engine_alpha = [0.95 * g_acc + kept, 0.95 * g_trials + kept + miss]
        return tokens

    def _prior(self) -> list[float]:
        """Where a new request's acceptance estimate starts: the engine's recent acceptance
        over all requests, pulled toward an optimistic 0.8 by one pseudo-trial (so a server
        whose drafts missed tries again after enough requests without evidence), with the
        weight of one trial."""
        acc, trials = self._engine_alpha
        return [(acc + 0.8) / (trials + 1.0), 1.0]

    def free(self, seq: Sequence) -> None:
        """``seq`` is done: drop what is kept for it."""
        self.proposer.free(seq)
        self._alpha.pop(seq.seq_id, None)
        self._idle.pop(seq.seq_id, None)

    def stats(self) -> dict:
        """Drafts proposed and accepted so far, and the acceptance rate."""
        return {"spec_draft_tokens_total": self.num_proposed,
                "spec_accepted_tokens_total": self.num_accepted,
                "spec_verifications_total": self.num_verifications,
                "spec_acceptance_rate": (self.num_accepted / self.num_proposed
                                         if self.num_proposed else 0.0)}
