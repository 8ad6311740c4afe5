"""Prefix-cache block hashes are unambiguous (issue 43): token ids written as text and joined
without a separator would make ``[1, 23, ...]`` and ``[12, 3, ...]`` the same block, and a
prompt beginning ``[12, 3]`` would reuse the K/V of one beginning ``[1, 23]`` and answer wrongly.
These tests fail under that mutant (``"".join(str(t) for t in tokens)``) and under a hash that
forgets its parent."""

import pytest
import torch

from llminfra.engine import LLMEngine, SamplingParams
from llminfra.kvcache import (PrefixCachingAllocator, block_hash, match_prefix,
                              prefix_block_hashes, register_prefix)
from llminfra.model import ByteTokenizer, DenseKVCache, ModelConfig, Transformer, generate

CFG = ModelConfig(vocab_size=256, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=64)
ROOT = prefix_block_hashes([0, 0], 2)[0]      # any valid 64-digit parent hash


@pytest.fixture(scope="module")
def model64(one_thread):
    return Transformer(CFG, generator=torch.Generator().manual_seed(43)).double().eval()


# pairs whose decimal digits concatenate to the same text; each pair has equal lengths
AMBIGUOUS = [([1, 23, 5, 7], [12, 3, 5, 7]), ([1, 2, 34, 5], [12, 3, 4, 5]),
             ([11, 1, 0, 9], [1, 11, 0, 9]), ([100, 1, 2, 3], [10, 0, 12, 3]),
             ([255, 25, 5, 2], [25, 52, 55, 2])]


@pytest.mark.parametrize("a, b", AMBIGUOUS)
def test_blocks_with_the_same_digits_hash_apart(a, b):
    assert "".join(map(str, a)) == "".join(map(str, b))          # the trap is real
    assert block_hash(ROOT, a) != block_hash(ROOT, b)
    assert prefix_block_hashes(a + [9] * 4, 4)[0] != prefix_block_hashes(b + [9] * 4, 4)[0]
    # and the second block, equal in both, differs by its parent
    assert prefix_block_hashes(a + [9] * 4, 4)[1] != prefix_block_hashes(b + [9] * 4, 4)[1]


def test_block_lengths_cannot_shift_ids_between_blocks():
    """``[1, 2] | [3]`` against ``[1] | [2, 3]`` as blocks of a chain, and the empty block."""
    assert block_hash(block_hash(ROOT, [1, 2]), [3]) != block_hash(block_hash(ROOT, [1]), [2, 3])
    assert block_hash(ROOT, []) != block_hash(ROOT, [0])
    assert block_hash(ROOT, [-1]) != block_hash(ROOT, [1])


def test_block_hash_is_a_function_of_its_values_not_their_type():
    import numpy as np
    assert block_hash(ROOT, [1, 23]) == block_hash(ROOT, (1, 23)) \
        == block_hash(ROOT, np.array([1, 23])) == block_hash(ROOT, torch.tensor([1, 23]).tolist())


@pytest.mark.parametrize("bad", [[1.0, 2.0], ["1", "2"], [True, 2], [None]])
def test_block_hash_refuses_non_integer_ids(bad):
    with pytest.raises(ValueError, match="integers"):
        block_hash(ROOT, bad)


@pytest.mark.parametrize("bad", ["", "abc", 5, ROOT[:-1]])
def test_block_hash_refuses_a_malformed_parent(bad):
    with pytest.raises(ValueError, match="prefix_hash"):
        block_hash(bad, [1])


def test_allocator_does_not_hand_back_the_other_prompts_blocks():
    a = PrefixCachingAllocator(16, 4)
    first = [1, 23, 5, 7, 8, 9, 10, 11, 4]
    table, n = match_prefix(a, first)
    assert n == 0
    table.append(len(first))
    register_prefix(a, table, first)
    table.free()
    other, n = match_prefix(a, [12, 3, 5, 7, 8, 9, 10, 11, 4])
    assert n == 0 and other.blocks == []
    again, n = match_prefix(a, first)
    assert n == 8                                      # the same prompt still hits
    again.free()
    a.check_invariants()


def test_engine_answers_the_lookalike_prompt_as_if_alone(model64):
    """Serve ``[1, 23, rest]``, then ``[12, 3, rest]`` on the same prefix-caching engine: the second
    gets no cached tokens and the greedy tokens of a fresh dense-cache run."""
    rest = torch.randint(0, 256, (18,), generator=torch.Generator().manual_seed(3)).tolist()
    first, second = [1, 23] + rest, [12, 3] + rest
    engine = LLMEngine(model64, ByteTokenizer(), num_blocks=40, block_size=4,
                       enable_prefix_caching=True, max_num_seqs=1, max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=6)
    out1 = engine.generate([first], params)[0]
    out2 = engine.generate([second], params)[0]
    alone = generate(model64, second, 6, cache=DenseKVCache(CFG.n_layers))
    assert out2.metrics.num_cached_prompt_tokens == 0
    assert out2.outputs[0].token_ids == alone
    assert out1.outputs[0].token_ids == generate(model64, first, 6,
                                                 cache=DenseKVCache(CFG.n_layers))
    # the first prompt again does hit: the cache works, it just tells these two apart
    out3 = engine.generate([first], params)[0]
    assert out3.metrics.num_cached_prompt_tokens == 16
