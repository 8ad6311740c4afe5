"""The tiny Llama-style decoder every chapter runs on: config, model, tokenizer, KV cache,
generation, perplexity, corpus, checkpoint.

Contract (the names notebooks, checkers and tests call; details in the module docstrings):
``ModelConfig.from_name("tiny" | "bench-100m")``, ``Transformer(config)``,
``model(tokens, cache=None, start_pos=0) -> logits``, one ragged serving step
``model(tokens (N,), cache, meta=StepMetadata) -> logits (N, V)``, ``model.set_attention(fn)``,
``DenseKVCache``, ``ByteTokenizer``, ``load_tiny()``, ``generate(...)``, ``perplexity(...)``,
``heldout_tokens()``; a real checkpoint: ``load_pretrained("smollm2-135m" | file.gguf | folder)
-> (model, BPETokenizer)`` (the fast paths applied from outside: :mod:`llminfra.runner`);
mixture of experts (chapter 11): ``MoEFeedForward``, ``route``, ``tiny_moe_model(seed)``.
"""

from llminfra.attention.reference import causal_mask, reference_attention, sdpa_attention
from llminfra.model.cache import DenseKVCache
from llminfra.model.bpe_tokenizer import BPETokenizer
from llminfra.model.checkpoint import (TINY_CHECKPOINT, load_checkpoint, load_tiny,
                                       save_checkpoint)
from llminfra.model.config import ModelConfig, config_names
from llminfra.model.corpus import corpus_tokens, heldout_tokens
from llminfra.model.generate import generate, mean_nll, perplexity, sample_next_token
from llminfra.model.gguf_file import GGUFFile
from llminfra.model.moe import (MoEFeedForward, RouterOutput, expert_capacity, route,
                                tiny_moe_config)
from llminfra.model.pretrained import (load_model, load_pretrained, load_tokenizer,
                                       pretrained_names, pretrained_path)
from llminfra.model.tokenizer import ByteTokenizer
from llminfra.model.rope import apply_rotary, rotary_angles, rotary_angles_at
from llminfra.model.transformer import (Attention, FeedForward, RMSNorm, Transformer,
                                        TransformerBlock, tiny_moe_model)

__all__ = [
    "ModelConfig", "config_names", "Transformer", "TransformerBlock", "Attention",
    "FeedForward", "RMSNorm", "apply_rotary", "rotary_angles", "rotary_angles_at",
    "reference_attention", "sdpa_attention", "causal_mask", "DenseKVCache", "ByteTokenizer", "generate",
    "sample_next_token", "perplexity", "mean_nll", "heldout_tokens", "corpus_tokens",
    "load_tiny", "load_checkpoint", "save_checkpoint", "TINY_CHECKPOINT",
    "load_pretrained", "load_model", "load_tokenizer", "pretrained_names", "pretrained_path", "BPETokenizer", "GGUFFile",
    "MoEFeedForward", "RouterOutput", "route", "expert_capacity",
    "tiny_moe_config", "tiny_moe_model",
]
