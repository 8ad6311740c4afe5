"""The readable runner: one scheduled step run by the model as chapter 05 draws it, and the
sampling every runner shares.

:meth:`ReadableRunner.forward` flattens the step's tokens (:func:`step_tokens`: each sequence's
next known tokens, then its drafts; one :data:`PAD_TOKEN_ID` per padding row),
``cache.prepare_step`` builds the step's :class:`~llminfra.attention.StepMetadata`, and the
readable :class:`~llminfra.model.Transformer` runs it layer by layer (about 110 torch calls a
layer). :func:`sample` turns the logits of each caught-up sequence into its tokens: sampled, or
verified drafts (:mod:`llminfra.engine.spec_decode`). The fused runner,
:class:`~llminfra.engine.fast_runner.FastRunner`, inherits both;
:func:`~llminfra.engine.model_runner.make_runner` picks one. Taught in chapter 05.
"""

from __future__ import annotations

import torch

from llminfra.engine.sampler import sample_tokens, token_logprobs
from llminfra.engine.scheduler_io import SchedulerOutput
from llminfra.engine.sequence import Sequence

#: the token a padding row reads (any id will do: its K/V and logits are thrown away)
PAD_TOKEN_ID = 0
def step_tokens(seq: Sequence, n: int) -> list[int]:
    """The ``n`` tokens ``seq`` brings this step (its next known tokens, then drafts): tokens
    ``num_computed_tokens`` .. + n of prompt + output + drafts, sliced without joining them
    (a decode step takes one token; the lists hold the whole context)."""
    out, i = [], seq.num_computed_tokens
    for part in (seq.prompt_token_ids, seq.output_token_ids, seq.spec_token_ids):
        if i < len(part):
            out += part[i:i + n - len(out)]
        i = max(0, i - len(part))
        if len(out) == n:
            break
    return out


def sample(caught: list[tuple[Sequence, int]], logits: torch.Tensor,
           speculator) -> tuple[dict, dict]:
    """The tokens of each caught-up sequence from its rows of ``logits`` (one row, or its
    drafts + 1): one sampled token (shared logits for the siblings that fork from it now), or
    its verified drafts and one more; an exception in its place if that fails (that request
    fails, the others go on). Returns ``(tokens, logprobs)``: ``logprobs[seq]`` the
    log-probabilities of a sampled token whose request asked for them — the scheduler writes
    both (:meth:`~llminfra.engine.scheduler.Scheduler.update_from_output`)."""
    plain, rows, out, row = [], [], {}, 0
    logprobs = {}
    for seq, drafts in caught:
        if drafts:
            try:
                out[seq] = speculator.verify(seq, logits[row:row + drafts + 1],
                                             seq.spec_token_ids[:drafts])
            except Exception as err:  # noqa: BLE001 - fails this request only
                out[seq] = err
        else:
            req = seq.request
            forks = req.forks_pending if seq.index == 0 and not seq.output_token_ids else []
            plain += [seq] + forks
            rows += [row] * (1 + len(forks))
        row += drafts + 1
    chosen = logits[rows]
    for i, seq in enumerate(plain):                 # structured output: only what the JSON allows
        if seq.grammar is not None:
            chosen[i] = chosen[i].masked_fill(~seq.grammar.allowed(chosen.shape[-1]),
                                              float("-inf"))
    tokens = sample_tokens(chosen, [s.params for s in plain], [s.generator for s in plain],
                           errors="return",
                           histories=[(s.prompt_token_ids, s.output_token_ids) for s in plain])
    for seq, token, row in zip(plain, tokens, rows):
        out[seq] = token if isinstance(token, Exception) else [token]
        if seq.params.logprobs is not None and not isinstance(token, Exception):
            logprobs[seq] = token_logprobs(logits[row], token, seq.params.logprobs)
    return out, logprobs


class ReadableRunner:
    """The readable model on the step's :class:`~llminfra.attention.StepMetadata`."""

    name = "readable"

    def __init__(self, model, cache, device: torch.device, speculator=None):
        self.model, self.cache, self.device, self.speculator = model, cache, device, speculator

    def execute(self, sched: SchedulerOutput) -> tuple[dict, dict]:
        """Sampled tokens (or an exception) per caught-up sequence of ``sched``, and the
        log-probabilities asked for (:func:`sample`)."""
        logits = self.forward(sched.scheduled, sched.padding, sched.caught)
        return sample(list(sched.caught.items()), logits, self.speculator)

    def forward(self, scheduled, padding, caught: dict) -> torch.Tensor:
        """Reserve the step's slots and run the model on its flat batch: the scheduled tokens
        (drafts included), then one :data:`PAD_TOKEN_ID` per padding row at its next position.
        Logits come out for each ``caught`` sequence's last token and drafts
        (:attr:`SchedulerOutput.caught`), then for every padding row (a fixed-shape baseline
        computes them too; nothing is sampled from them)."""
        seqs = [s for s, _ in scheduled] + padding
        flat, last = [], []
        for s, n in scheduled:
            flat += step_tokens(s, n)
            if s in caught:                                      # the last token and any drafts
                last += range(len(flat) - caught[s] - 1, len(flat))
        flat += [PAD_TOKEN_ID] * len(padding)
        last += range(len(flat) - len(padding), len(flat))
        meta = self.cache.prepare_step([s.cache_seq for s in seqs],
                                       [n for _, n in scheduled] + [1] * len(padding),
                                       [s.is_prefill for s, _ in scheduled]
                                       + [False] * len(padding))
        meta = meta.with_logits_indices(last)
        with torch.no_grad():
            return self.model(torch.tensor(flat, device=self.device), self.cache, meta=meta)
