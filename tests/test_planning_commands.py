"""A plan's command lines (llminfra/planning/commands.py): ``llminfra serve``'s parsed by
llminfra's own CLI parser, ``vllm serve``'s by vLLM's where vLLM is installed (skipped, saying
so, where it is not: never counted as a pass); the multi-GPU line carries the plan's sizes."""

import importlib.util

import pytest

from llminfra.cli import build_parser
from llminfra.planning import (EngineLimits, PlanPrices, ServiceRequirements, limits_for_plan,
                               llminfra_command, plan_deployment, vllm_command)
from llminfra.planning.commands import parse_vllm_command

SMALL = EngineLimits("HuggingFaceTB/SmolLM2-135M-Instruct", max_num_seqs=4, max_model_len=1000,
                     dtype="fp32")
REQ = ServiceRequirements(requests_per_day=50_000, input_tokens=1_500, output_tokens=300,
                          ttft_target_s=1.0, tpot_target_s=0.1, model="llama-3-70b",
                          dtype="bf16", peak_to_mean=3.0)
PRICES = PlanPrices(3.0, 15.0, gpu_hour_usd=2.69)
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_the_vllm_line_for_the_small_model():
    assert vllm_command(SMALL) == ["vllm", "serve", "HuggingFaceTB/SmolLM2-135M-Instruct",
                                   "--max-num-seqs", "4", "--max-model-len", "1000",
                                   "--dtype", "float32"]


def test_the_llminfra_line_parses_with_llminfras_parser():
    """1000 tokens = 63 blocks of 16 (62.5 rounded up); 4 sequences: 252 blocks."""
    argv = llminfra_command(SMALL, "smollm2-135m", threads=2, quantization="w4a8")
    assert argv[:4] == ["python", "-m", "llminfra", "serve"]
    args = build_parser().parse_args(argv[3:])
    assert (args.model, args.max_num_seqs, args.num_blocks, args.threads, args.quantization) \
        == ("smollm2-135m", 4, 252, 2, "w4a8")


def test_a_multi_gpu_plan_gives_its_parallel_sizes():
    plan = plan_deployment(REQ, "h100", PRICES)
    limits = limits_for_plan(plan, REQ, pipeline_parallel=2)
    assert plan.tensor_parallel > 1                        # 140 GB of weights: not one H100
    argv = vllm_command(limits)
    assert argv[2] == "meta-llama/Meta-Llama-3-70B"
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags == {"--max-num-seqs": str(plan.batch_per_replica), "--max-model-len": "1800",
                     "--dtype": "bfloat16", "--tensor-parallel-size": str(plan.tensor_parallel),
                     "--pipeline-parallel-size": "2"}
    with pytest.raises(ValueError, match="runs one device"):
        llminfra_command(limits, "smollm2-135m")


def test_bad_limits_are_named():
    with pytest.raises(ValueError, match="max_num_seqs must be an int >= 1"):
        EngineLimits("m", 0, 10, "fp32")
    with pytest.raises(ValueError, match="dtype 'int8'"):
        EngineLimits("m", 1, 10, "int8")
    with pytest.raises(ValueError, match="runs fp32 weights"):
        llminfra_command(EngineLimits("m", 1, 10, "bf16"), "smollm2-135m")


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here: the exported vllm serve "
                    "lines are not checked by its parser (make compare-engines' venv has it)")
@pytest.mark.parametrize("which", ["small", "multi-gpu"])
def test_vllm_accepts_the_lines(which):
    if which == "small":
        limits = SMALL
    else:
        limits = limits_for_plan(plan_deployment(REQ, "h100", PRICES), REQ, pipeline_parallel=2)
    args = parse_vllm_command(vllm_command(limits))
    assert args.max_num_seqs == limits.max_num_seqs
    assert args.max_model_len == limits.max_model_len
    assert args.tensor_parallel_size == limits.tensor_parallel
    assert args.pipeline_parallel_size == limits.pipeline_parallel


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here (make check-vllm-commands)")
def test_vllms_parser_refuses_a_line_it_does_not_know():
    """The check above can fail: a misspelt flag is refused by vLLM's parser."""
    argv = vllm_command(SMALL)
    argv[argv.index("--max-num-seqs")] = "--max-num-seq"
    with pytest.raises(SystemExit):
        parse_vllm_command(argv + ["--no-such-flag", "1"])
