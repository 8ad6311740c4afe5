"""``quantize_model(model, scheme, calibration=None)``: swap a model's linear layers for
:class:`QuantLinear`, from outside the model (the gpt-fast way: the model stays plain).

Which layers: every ``nn.Linear`` except those whose qualified name starts with an entry of
``skip`` (default: the ``output`` head, which, like the embeddings, usually stays in 16 bits:
it is the layer most sensitive to rounding and the memory rule of chapter 02 counts it so).

* round-to-nearest schemes (``"int8-absmax"``, ``"int4-g128"``, ``"fp8-e4m3"``, ``"nf4"``…):
  each weight quantized on its own;
* ``"int8-dynamic"``: int8 weights per channel and int8 activations per token (W8A8);
* ``"gptq-<int scheme>"`` / ``"awq-<int scheme>"``: need ``calibration`` token ids ``(B, T)``.
  Blocks are done in order (Frantar et al., 2022, arXiv:2210.17323, §4 "sequential"): the
  inputs of block ``i`` are recorded with blocks ``< i`` already quantized.

The model is modified in place and returned. Chapter 03.
"""

from __future__ import annotations

import torch
from torch import nn

from llminfra.quant.awq import awq_quantize, search_rows
from llminfra.quant.gptq import HessianAccumulator, gptq_quantize
from llminfra.quant.quant_linear import QuantLinear
from llminfra.quant.schemes import parse_scheme
from llminfra.quant.quantize_tensor import quantize


def target_linears(model: nn.Module, skip: tuple[str, ...] = ("output",)) -> dict[str, nn.Linear]:
    """Qualified name -> ``nn.Linear`` for every linear layer to quantize."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and not any(name == s or name.startswith(s + ".") for s in skip)}


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _stages(model: nn.Module, names: list[str]) -> list[list[str]]:
    """Linear names grouped by transformer block (``layers.<i>.``), in order; one stage if none."""
    stages: dict[str, list[str]] = {}
    for n in names:
        parts = n.split(".")
        key = ".".join(parts[:2]) if parts[0] == "layers" and len(parts) > 2 else ""
        stages.setdefault(key, []).append(n)
    return list(stages.values())


@torch.no_grad()
def _record_inputs(model, modules: dict[str, nn.Module], calibration: torch.Tensor, method: str):
    """Run ``model(calibration)`` once with hooks; Hessians (gptq) or inputs (awq) per module."""
    store = {n: (HessianAccumulator(m.in_features) if method == "gptq" else []) for n, m in modules.items()}

    def hook(name):
        def fn(_module, args, _out):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float().cpu()
            store[name].add(x) if method == "gptq" else store[name].append(x)
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in modules.items()]
    try:
        model(calibration)
    finally:
        for h in handles:
            h.remove()
    return store


def _quantize_calibrated(model, method: str, base: str, names: list[str], calibration) -> None:
    s = parse_scheme(base)
    if s.kind != "int" or s.granularity == "tensor":
        raise KeyError(f"{method} needs an integer scheme per channel or group, e.g. "
                       f"'{method}-int4-g128'; got '{method}-{base}'")
    if calibration is None:
        raise ValueError(f"scheme '{method}-{base}' needs calibration token ids (B, T)")
    calibration = torch.as_tensor(calibration, dtype=torch.long)
    calibration = calibration.unsqueeze(0) if calibration.dim() == 1 else calibration
    for stage in _stages(model, names):
        modules = {n: model.get_submodule(n) for n in stage}
        store = _record_inputs(model, modules, calibration, method)
        for n, m in modules.items():
            if method == "gptq":
                qt = gptq_quantize(m.weight, store[n].H, s.bits, s.granularity, s.symmetric,
                                   scheme=f"gptq-{base}")
            else:
                X = search_rows(torch.cat(store[n]), m.in_features)
                qt = awq_quantize(m.weight, X, s.bits, s.granularity, s.symmetric,
                                  scheme=f"awq-{base}")
            _set_module(model, n, QuantLinear(qt, m.bias).to(m.weight.device))


def quantize_model(model: nn.Module, scheme: str, calibration: torch.Tensor | None = None,
                   skip: tuple[str, ...] = ("output",)) -> nn.Module:
    """Replace the model's linear layers (see :func:`target_linears`) by :class:`QuantLinear`
    quantized with ``scheme``; returns ``model`` (changed in place)."""
    names = list(target_linears(model, skip))
    if not names:
        raise ValueError("the model has no nn.Linear layers left to quantize")
    key = scheme.strip().lower() if isinstance(scheme, str) else scheme
    if isinstance(key, str) and key.split("-", 1)[0] in ("gptq", "awq") and "-" in key:
        method, base = key.split("-", 1)
        _quantize_calibrated(model, method, base, names, calibration)
        return model
    if key == "int8-dynamic":
        make = lambda m: QuantLinear.from_linear(m, "int8-channel", act_quant="int8")  # noqa: E731
    else:
        parse_scheme(scheme)  # KeyError with the allowed names before touching the model
        make = lambda m: QuantLinear.from_linear(m, scheme)  # noqa: E731
    for n in names:
        _set_module(model, n, make(model.get_submodule(n)))
    return model


def fake_quantize_model(model: nn.Module, scheme: str,
                        skip: tuple[str, ...] = ("output",)) -> nn.Module:
    """Round every target linear weight (see :func:`target_linears`) through ``scheme`` and
    store it back dequantized, in the model's own dtype: the model then computes with exactly
    the values a :class:`QuantLinear` would hold, at the unquantized model's speed — the
    rounding's effect alone, as papers' perplexity tables measure it (no memory is saved).
    Round-to-nearest schemes only; returns ``model`` (changed in place)."""

    parse_scheme(scheme)  # KeyError with the allowed names before touching the model
    with torch.no_grad():
        for lin in target_linears(model, skip).values():
            lin.weight.copy_(quantize(lin.weight.detach(), scheme).dequantize())
    return model


def model_weight_bytes(model: nn.Module) -> dict:
    """Bytes of every parameter and buffer, split into quantized linear weights and the rest."""
    q = sum(m.weight_nbytes for m in model.modules() if isinstance(m, QuantLinear))
    q_params = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantLinear))
    rest = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"quantized_bytes": q, "quantized_params": q_params, "other_bytes": rest,
            "total_bytes": q + rest}
