"""Measuring quantization damage: layer-output error on real activations, perplexity, and
agreement of greedy outputs — "evaluate on your own data" means passing your own token ids.

* layer error: for each linear layer, the inputs ``X`` it sees in the *unquantized* model on
  the evaluation tokens, and ``||X Ŵᵀ - X Wᵀ||_F / ||X Wᵀ||_F`` (both layers fed the same ``X``);
* perplexity: :func:`llminfra.model.perplexity` (``exp`` of the mean NLL per token);
* greedy agreement: the share of positions where greedy decoding of the two models picks the
  same token, over a few prompts.

:func:`evaluate_scheme` measures the quantized model on its reference path
(dequantize-then-matmul, :func:`~llminfra.quant.quant_linear.use_kernels`), so the numbers are
those of the quantization whichever CPU kernels this machine has (the kernels are tested equal to
the reference within float rounding).

Chapter 03.
"""

from __future__ import annotations

import torch
from torch import nn

from llminfra.quant.quantize_model import target_linears
from llminfra.model import DenseKVCache, generate, perplexity
from llminfra.quant.quant_linear import use_kernels
from llminfra.quant import quantize
from llminfra.quant.awq import awq_quantize
from llminfra.quant.gptq import HessianAccumulator, gptq_quantize
from llminfra.quant.schemes import parse_scheme


@torch.no_grad()
def linear_inputs(model: nn.Module, tokens: torch.Tensor,
                  skip: tuple[str, ...] = ("output",)) -> dict[str, torch.Tensor]:
    """Name -> inputs ``X (n_tokens, in_features)`` of each targeted linear on ``tokens (B, T)``."""
    store: dict[str, torch.Tensor] = {}
    mods = target_linears(model, skip)

    def hook(name):
        def fn(_m, args, _out):
            store[name] = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in mods.items()]
    try:
        model(torch.as_tensor(tokens).reshape(-1, torch.as_tensor(tokens).shape[-1]))
    finally:
        for h in handles:
            h.remove()
    return store


def relative_output_error(reference: nn.Module, quantized: nn.Module, X: torch.Tensor) -> float:
    """``||q(X) - ref(X)||_F / ||ref(X)||_F`` for two layers fed the same inputs ``X (n, in)``."""
    with torch.no_grad():
        y = reference(X).float()
        return float((quantized(X).float() - y).norm() / y.norm().clamp_min(1e-30))


def layer_errors(model: nn.Module, qmodel: nn.Module, tokens: torch.Tensor,
                 skip: tuple[str, ...] = ("output",)) -> dict[str, float]:
    """Name -> relative output error of each quantized layer of ``qmodel`` against the same
    layer of ``model`` (unquantized), on the activations ``model`` produces from ``tokens``."""
    X = linear_inputs(model, tokens, skip)
    return {n: relative_output_error(model.get_submodule(n), qmodel.get_submodule(n), x)
            for n, x in X.items()}


@torch.no_grad()
def greedy_agreement(model_a: nn.Module, model_b: nn.Module, prompts: list[list[int]],
                     max_new_tokens: int = 32) -> float:
    """Share of the ``len(prompts) · max_new_tokens`` greedy tokens where the two models agree
    (position by position; once they diverge they see different contexts, as a user would)."""
    same = total = 0
    for p in prompts:
        a = generate(model_a, p, max_new_tokens, cache=DenseKVCache(model_a.config.n_layers))
        b = generate(model_b, p, max_new_tokens, cache=DenseKVCache(model_b.config.n_layers))
        same += sum(x == y for x, y in zip(a, b))
        total += len(a)
    return same / total


def evaluate_scheme(model: nn.Module, qmodel: nn.Module, eval_tokens: torch.Tensor,
                    layer_tokens: torch.Tensor, prompts: list[list[int]],
                    max_new_tokens: int = 32, fp_perplexity: float | None = None) -> dict:
    """All the damage numbers for one quantized model ``qmodel`` of ``model``.

    ``eval_tokens``: 1-D held-out ids for perplexity; ``layer_tokens (B, T)`` for layer errors.
    Returns ``{"layer_rel_error" (mean over layers), "layer_rel_error_max", "perplexity",
    "perplexity_delta", "greedy_agreement"}``.
    """
    ppl_fp = fp_perplexity if fp_perplexity is not None else perplexity(model, eval_tokens)
    with use_kernels(qmodel, False):
        errs = layer_errors(model, qmodel, layer_tokens)
        ppl = perplexity(qmodel, eval_tokens)
        agreement = greedy_agreement(model, qmodel, prompts, max_new_tokens)
    return {"layer_rel_error": sum(errs.values()) / len(errs),
            "layer_rel_error_max": max(errs.values()), "perplexity": ppl,
            "perplexity_delta": ppl - ppl_fp, "greedy_agreement": agreement}


def inject_outlier_channels(X: torch.Tensor, channels: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """``X (n, in)`` with input ``channels`` multiplied by ``factors`` (e.g. 30–50×): the
    activation outliers of large LLMs (Dettmers et al., 2022, arXiv:2208.07339, §3.2)."""
    X = X.clone()
    X[:, channels] *= factors.to(X.dtype)
    return X


def outlier_layer_experiment(W: torch.Tensor, X_cal: torch.Tensor, X_eval: torch.Tensor,
                             n_outliers: int = 4, generator: torch.Generator | None = None,
                             scheme: str = "int4-g128") -> dict:
    """RTN vs AWQ vs GPTQ on one layer whose inputs carry ``n_outliers`` channels 30–50× larger.

    Channels and factors are drawn from ``generator``; the same are injected into the
    calibration inputs ``X_cal`` (which GPTQ and AWQ see) and the held-out inputs ``X_eval``
    (on which the relative output error is measured). Returns scheme -> relative error, plus the
    channels and factors used.
    """
    s = parse_scheme(scheme)
    ch = torch.randperm(W.shape[1], generator=generator)[:n_outliers]
    f = 30 + 20 * torch.rand(n_outliers, generator=generator)
    Xc, Xe = inject_outlier_channels(X_cal, ch, f), inject_outlier_channels(X_eval, ch, f)
    h = HessianAccumulator(W.shape[1])
    h.add(Xc)
    Y = Xe @ W.float().T
    err = lambda qt: float((Xe @ qt.dequantize().T - Y).norm() / Y.norm())  # noqa: E731
    return {"channels": ch.tolist(), "factors": [round(float(x), 2) for x in f],
            scheme: err(quantize(W, scheme)),
            f"awq-{scheme}": err(awq_quantize(W, Xc, s.bits, s.granularity, s.symmetric)),
            f"gptq-{scheme}": err(gptq_quantize(W, h.H, s.bits, s.granularity, s.symmetric))}
