"""A plan as the command lines a practitioner runs: ``vllm serve`` and ``llminfra serve``.

A plan fixes an engine's limits — how many sequences run together (``--max-num-seqs``), the
longest request it holds (``--max-model-len``: prompt + answer), the weights' dtype, and for a
replica of several GPUs its tensor- and pipeline-parallel sizes (chapter 07). The same
:class:`EngineLimits` become vLLM's flags (Kwon et al. 2023, arXiv:2309.06180; ``vllm serve
--help``) and ``llminfra serve``'s, which has no ``--max-model-len``: its KV pool
(``--num-blocks``) is sized to hold ``max_num_seqs`` requests of ``max_model_len`` tokens
instead, and it serves one device, so a multi-GPU plan has no ``llminfra serve`` line.
:func:`parse_vllm_command` checks a line with vLLM's own argument parser where vLLM is
installed. The same limits as a fleet's Helm values (vLLM's production stack, llm-d):
:mod:`llminfra.planning.fleet`. Taught in chapter 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llminfra.planning.plan import Plan
from llminfra.planning.requirements import ServiceRequirements
from llminfra.specs import get_model

#: the plan's dtype names (:mod:`llminfra.calc.memory`) -> vLLM's ``--dtype`` values
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: tokens a block of ``llminfra serve``'s KV pool holds (its engine's default ``block_size``)
LLMINFRA_BLOCK_SIZE = 16


@dataclass(frozen=True)
class EngineLimits:
    """What a plan asks of one engine replica: ``model`` (a Hugging Face id, as vLLM takes it),
    ``max_num_seqs`` sequences at once, requests of at most ``max_model_len`` tokens (prompt +
    answer), weights in ``dtype`` (``"fp32"``, ``"bf16"`` or ``"fp16"``) on
    ``tensor_parallel × pipeline_parallel`` GPUs."""

    model: str
    max_num_seqs: int
    max_model_len: int
    dtype: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a non-empty Hugging Face id, got {self.model!r}")
        for name in ("max_num_seqs", "max_model_len", "tensor_parallel", "pipeline_parallel"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.dtype not in VLLM_DTYPES:
            raise ValueError(f"dtype {self.dtype!r}; allowed: {sorted(VLLM_DTYPES)}")

    @property
    def gpus(self) -> int:
        """GPUs one replica takes: tensor × pipeline parallel size."""
        return self.tensor_parallel * self.pipeline_parallel


def limits_for_plan(plan: Plan, req: ServiceRequirements,
                    pipeline_parallel: int = 1) -> EngineLimits:
    """One replica of ``plan`` (made for ``req``): its batch at the peak
    (``plan.batch_per_replica``, the batch its time per output token was computed at) as
    ``max_num_seqs``, ``req``'s prompt + answer as ``max_model_len``, ``req``'s dtype, the
    plan's tensor-parallel size. ``ValueError`` for a model without a Hugging Face id or a
    dtype vLLM does not load as such (int8, fp8: a quantized checkpoint instead)."""
    hf_id = get_model(req.model).hf_id
    if not hf_id:
        raise ValueError(f"{req.model} has no Hugging Face id in the model catalog")
    return EngineLimits(hf_id, plan.batch_per_replica, req.context_tokens, req.dtype,
                        plan.tensor_parallel, pipeline_parallel)


def vllm_command(limits: EngineLimits) -> list[str]:
    """``vllm serve <model> --max-num-seqs N --max-model-len L --dtype D`` as an argv list, with
    ``--tensor-parallel-size`` / ``--pipeline-parallel-size`` where they are above 1."""
    argv = ["vllm", "serve", limits.model, "--max-num-seqs", str(limits.max_num_seqs),
            "--max-model-len", str(limits.max_model_len), "--dtype", VLLM_DTYPES[limits.dtype]]
    if limits.tensor_parallel > 1:
        argv += ["--tensor-parallel-size", str(limits.tensor_parallel)]
    if limits.pipeline_parallel > 1:
        argv += ["--pipeline-parallel-size", str(limits.pipeline_parallel)]
    return argv


def llminfra_command(limits: EngineLimits, model: str, threads: int | None = None,
                     quantization: str | None = None) -> list[str]:
    """``python -m llminfra serve`` with the same limits as an argv list: ``--model model`` (a
    name ``llminfra serve`` knows, e.g. ``"smollm2-135m"``, or a file), ``--max-num-seqs``, and
    a KV pool of ``max_num_seqs · ceil(max_model_len / 16)`` blocks (``--num-blocks``: every
    sequence at its longest); ``threads`` and ``quantization`` (``"w4a8"``) where given.
    ``ValueError`` for a multi-GPU replica or a dtype other than fp32 (``llminfra serve`` runs
    one device, and its weights in fp32 or, with ``quantization``, int4)."""
    if limits.gpus > 1:
        raise ValueError(f"llminfra serve runs one device; this replica takes {limits.gpus}")
    if limits.dtype != "fp32":
        raise ValueError(f"llminfra serve runs fp32 weights (or int4 with --quantization "
                         f"w4a8), not {limits.dtype}")
    blocks = limits.max_num_seqs * math.ceil(limits.max_model_len / LLMINFRA_BLOCK_SIZE)
    argv = ["python", "-m", "llminfra", "serve", "--model", model,
            "--max-num-seqs", str(limits.max_num_seqs), "--num-blocks", str(blocks)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if quantization is not None:
        argv += ["--quantization", quantization]
    return argv


def parse_vllm_command(argv: list[str]):
    """``argv`` (``["vllm", "serve", …]``) parsed and validated by vLLM's own ``vllm serve``
    parser (its ``ServeSubcommand``), as an ``argparse.Namespace``; ``ImportError`` where vLLM
    is not installed, ``SystemExit`` (argparse's) or vLLM's error for a line it refuses."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:                       # vLLM before 0.11
        from vllm.utils import FlexibleArgumentParser
    if argv[:2] != ["vllm", "serve"]:
        raise ValueError(f"expected a 'vllm serve …' line, got {argv[:2]}")
    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(argv[1:])
    command.validate(args)
    return args
