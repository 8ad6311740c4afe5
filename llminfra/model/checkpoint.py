"""Save and load model checkpoints; :func:`load_tiny` returns the shipped trained tiny model.

A checkpoint is one ``torch.save`` file holding ``{"config": dict, "state_dict": {...},
"meta": {...}}``; weights are stored in bfloat16 (2 bytes per parameter: the 3.03 M-parameter
tiny model is ~6 MB) and loaded back as float32 with ``torch.load(weights_only=True)``, which
runs no pickled code. bfloat16 keeps float32's exponent range and 8 bits of mantissa
(relative rounding error <= 2^-9); chapter 03 shows the bit layouts.

Taught in chapter 01; every chapter starts from :func:`load_tiny`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from llminfra.model.config import ModelConfig
from llminfra.model.corpus import DATA_DIR
from llminfra.model.tokenizer import ByteTokenizer
from llminfra.model.transformer import Transformer

TINY_CHECKPOINT = DATA_DIR / "tiny.pt"
_STORE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                 "float32": torch.float32}


def save_checkpoint(model: Transformer, path: str | Path, dtype: str = "bfloat16",
                    meta: dict | None = None) -> Path:
    """Write ``model``'s config and weights (cast to ``dtype``) and ``meta`` (JSON-like
    metadata: training time, losses) to ``path``; returns the path."""
    if dtype not in _STORE_DTYPES:
        raise ValueError(f"unknown storage dtype {dtype!r}; choose from {list(_STORE_DTYPES)}")
    state = {k: v.detach().to("cpu", _STORE_DTYPES[dtype]).contiguous()
             for k, v in model.state_dict().items()}
    path = Path(path)
    torch.save({"config": model.config.to_dict(), "state_dict": state, "meta": dict(meta or {})},
               path)
    return path


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu"
                    ) -> tuple[Transformer, dict]:
    """``(model, meta)`` from a file written by :func:`save_checkpoint`: float32 weights on
    ``device``, in eval mode."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} not found; train one with "
                                f"`python -m llminfra.model.train`")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    config = ModelConfig(**blob["config"])
    model = Transformer(config)
    model.load_state_dict({k: v.float() for k, v in blob["state_dict"].items()})
    return model.to(device).eval(), blob.get("meta", {})


def load_tiny(device: str | torch.device = "cpu") -> tuple[Transformer, ByteTokenizer]:
    """The trained ``tiny`` model shipped in ``llminfra/data/tiny.pt`` (float32, eval mode) and
    its :class:`ByteTokenizer`. Offline; well under 2 s on a laptop CPU."""
    model, _ = load_checkpoint(TINY_CHECKPOINT, device)
    return model, ByteTokenizer()
