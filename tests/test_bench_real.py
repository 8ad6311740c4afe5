"""bench real: the suite is registered, runs end to end on a tiny workload against transformers,
returns every key with positive finite numbers, and the engine's greedy tokens equal
transformers' on that workload (correctness only: timings are judged in the bench run)."""

import math

import pytest

from llminfra.bench import SUITES, load_suite
from llminfra.bench import real, real_decode

pytestmark = pytest.mark.slow   # one worker with test_pretrained.py (conftest.py): one transformers load

HF_MODES = tuple(real.HF_STATIC)
AGREEMENT = 2      # of real_decode.AGREEMENT_PROMPTS: the int4 paths' agreement on two chat turns


def test_registered():
    assert SUITES["real"] == "llminfra.bench.real"
    assert load_suite("real") is real


def test_missing_transformers_says_how_to_install(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "transformers", None)   # import now raises ImportError
    with pytest.raises(ImportError, match="pip install transformers accelerate"):
        real.run(quick=True)


@pytest.fixture(scope="module")
def result(smollm2, smollm2_hf):
    return real.run(quick=True, n_requests=4, max_output=8, repeats=1,
                    models=(*smollm2, smollm2_hf[0]), agreement_prompts=AGREEMENT)


def _numbers(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _numbers(v)
    elif isinstance(x, list):
        for v in x:
            yield from _numbers(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield x


def test_keys_and_positive_finite_numbers(result):
    sides = set(result["throughput_tokens_per_s"])
    assert {"engine", *HF_MODES} <= sides <= set(real.SIDES)
    if "hf_continuous" not in sides:
        assert any("hf_continuous" in n for n in result["notes"])
    for key in ("ttft_p50_s", "ttft_p99_s", "throughput_tokens_per_s_runs"):
        assert set(result[key]) == sides, key
    assert result["matmul"] == real_decode.matmul_kernel()
    decode = set(result["decode_ms_per_token"])
    # the package's fp32 kernel for few rows is built with the w4a8 kernel, or neither is
    assert ("fast_skinny" in decode) == (real_decode.int4_kernel() == "w4a8")
    if "fast_skinny" in decode:
        assert result["fast_skinny_vs_floor"] > 0
    decode -= {"fast_skinny"}
    if result["matmul"] == "onednn":   # the plain kernel's rows beside the default's
        assert decode == set(real_decode.DECODE_PATHS) - {"fast_skinny"}
        assert result["fast_plain_vs_floor"] > 0
    else:
        assert decode - {"fast_int4_2pass", "fast_int4_torch"} == {"eager", "fast", "fast_int4"}
    # the engine row is serve's default path, the readable runner on F.linear beside it
    assert "engine_plain" in sides and result["engine_plain_vs_best_hf"] > 0
    assert result["greedy_tokens_equal_engine"]["engine_plain"] == 1.0
    paths = result["engine_paths"]
    assert paths["engine_plain"] == {"runner": "readable", "matmul": "plain"}
    assert paths["engine"]["runner"] == "fast"
    assert paths["engine"]["matmul"] == ("SkinnyMatmul" if real_decode.int4_kernel() == "w4a8"
                                         else "PrepackedMatmul" if result["matmul"] == "onednn"
                                         else "Matmul")
    assert result["int4_kernel"] == real_decode.int4_kernel()
    int4_paths = decode & {"fast_int4", "fast_int4_2pass", "fast_int4_torch"}
    if result["int4_kernel"] == "w4a8":   # its 2-pass form and PyTorch's int4 kernel beside it
        assert int4_paths == {"fast_int4", "fast_int4_2pass", "fast_int4_torch"}
        assert result["fast_int4_torch_vs_floor"] > 0 and result["fast_int4_2pass_vs_floor"] > 0
        assert result["int4_kernel_build"] in ("avx512-vnni", "avx2", "portable")
    else:
        assert int4_paths == {"fast_int4"} and result["int4_kernel_build"] is None
    agree = result["int4_greedy_identical"]   # 0 is a fair count
    assert agree["prompts"] == AGREEMENT and agree["tokens"] == 8
    for ref in ("int4_weights_fp32_activations", "fp32_weights"):
        assert set(agree[ref]) == int4_paths
        assert all(0 <= v <= agree["prompts"] for v in agree[ref].values())
    assert set(result["decode_floor_ms"]) == {"fp32", "int4"}
    assert result["decode_floor_ms"]["int4"] < result["decode_floor_ms"]["fp32"]
    assert result["threads"] == 1 and result["environment"]["transformers"]
    assert result["best_hf_mode"] in sides - set(real.ENGINE_SIDES)
    for key in ("engine_vs_best_hf", "eager_vs_floor", "fast_vs_floor", "fast_int4_vs_floor",
                "copy_bandwidth_bytes_per_s"):
        assert result[key] > 0
    assert all(isinstance(v, bool) for v in result["targets_met"].values())
    assert len(result["targets_met"]) == 4   # engine, eager, fast, fast_int4
    numbers = [v for k, v in result.items() if k not in ("seed", "quick", "int4_kernel_build",
                                                      "int4_greedy_identical")]
    assert all(math.isfinite(v) and v > 0 for v in _numbers(numbers))
    assert result["workload"]["num_requests"] == 4
    table = real.format_table(result)
    assert "engine" in table and "targets" in table


def test_engine_and_transformers_give_the_same_greedy_tokens(result):
    """Every HF mode (batch 1, left-padded batches, its continuous batching) generated exactly
    the engine's tokens for every request of the workload."""
    assert result["greedy_tokens_equal_engine"]
    for side, share in result["greedy_tokens_equal_engine"].items():
        assert share == 1.0, side
