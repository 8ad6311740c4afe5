"""The readable runner: one scheduled step run by the model as chapter 05 draws it.

:meth:`ReadableRunner.forward` flattens the step's tokens
(:meth:`~llminfra.engine.sequence.Sequence.step_tokens`: each sequence's next known tokens, then
its drafts; one :data:`PAD_TOKEN_ID` per padding row), ``cache.prepare_step`` builds the step's
:class:`~llminfra.attention.StepMetadata`, and the readable :class:`~llminfra.model.Transformer`
runs it layer by layer (about 110 torch calls a layer). The engine turns the logits into tokens
(:func:`~llminfra.engine.sampler.sample_step`). The fused runner,
:class:`~llminfra.runner.fast_runner.FastRunner`, inherits it and replaces :meth:`forward`;
:func:`~llminfra.engine.model_runner.make_runner` picks one. Taught in chapter 05.
"""

from __future__ import annotations

import torch

#: the token a padding row reads (any id will do: its K/V and logits are thrown away)
PAD_TOKEN_ID = 0


class ReadableRunner:
    """The readable model on the step's :class:`~llminfra.attention.StepMetadata`."""

    name = "readable"

    def __init__(self, model, cache, device: torch.device):
        self.model, self.cache, self.device = model, cache, device

    def forward(self, scheduled, padding, caught: dict) -> torch.Tensor:
        """Reserve the step's slots and run the model on its flat batch: the scheduled tokens
        (drafts included), then one :data:`PAD_TOKEN_ID` per padding row at its next position.
        Logits come out for each ``caught`` sequence's last token and drafts
        (:attr:`SchedulerOutput.caught`), then for every padding row (a fixed-shape baseline
        computes them too; nothing is sampled from them)."""
        seqs = [s for s, _ in scheduled] + padding
        flat, last = [], []
        for s, n in scheduled:
            flat += s.step_tokens(n)
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
