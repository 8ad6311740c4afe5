"""Tensor, pipeline and data parallelism over an explicit ``World`` (chapter 07).

* :mod:`~llminfra.parallel.world` — ``World``; ``SimulatedWorld`` (threads of one process);
* :mod:`~llminfra.parallel.distributed_world` — ``DistributedWorld`` (``torch.distributed``:
  gloo on CPU, NCCL on CUDA);
* :mod:`~llminfra.parallel.launch` — ``launch(fn, n, ...)``: spawn ``n`` ranks (from a notebook
  too), collect their results, surface their errors, never leave a process behind;
* :mod:`~llminfra.parallel.tensor_parallel` — column / row parallel linear, Megatron's f and g;
* :mod:`~llminfra.parallel.megatron` — the Megatron MLP and attention,
  ``apply_tensor_parallel(model, world)``;
* :mod:`~llminfra.parallel.dtensor_check` — the same MLP with ``torch.distributed.tensor.parallel``;
* :mod:`~llminfra.parallel.pipeline` — GPipe stages, micro-batches, timelines, the bubble;
* :mod:`~llminfra.parallel.data_parallel` — replicas for serving throughput;
* :mod:`~llminfra.parallel.expert_parallel` — mixture-of-experts over ranks: expert parallel
  (two all-to-alls) and tensor-parallel experts (one all-reduce), with reports (chapter 11);
* :mod:`~llminfra.parallel.workers` — functions the spawned ranks run.
* :mod:`~llminfra.parallel.ring_attention` — ring attention over a sequence split by tokens
  (contiguous / zigzag / striped layouts); :mod:`~llminfra.parallel.decode_context_parallel` —
  a KV cache split over ranks, partial (o, lse) merged; :mod:`~llminfra.parallel.context_parallel`
  — their rank functions and per-rank tables (chapter 11).
"""

from llminfra.parallel.context_parallel import (causal_balance_report, decode_cp_report,
                                                ring_attention_report)
from llminfra.parallel.expert_parallel import (ExpertParallelMoE, MoECase, expert_load_report,
                                               expert_parallel_check, expert_parallel_report,
                                               tensor_parallel_experts, tp_moe_forward)
from llminfra.parallel.launch import RankError, launch
from llminfra.parallel.megatron import apply_tensor_parallel, parallel_attention, parallel_mlp
from llminfra.parallel.pipeline import bubble_fraction, gpipe_schedule, measured_bubble
from llminfra.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from llminfra.parallel.distributed_world import DistributedWorld
from llminfra.parallel.world import SimulatedWorld, World, run_simulated

__all__ = ["World", "SimulatedWorld", "DistributedWorld", "run_simulated", "launch", "RankError",
           "ColumnParallelLinear", "RowParallelLinear", "parallel_mlp", "parallel_attention",
           "apply_tensor_parallel", "bubble_fraction", "gpipe_schedule", "measured_bubble",
           "ExpertParallelMoE", "MoECase", "tensor_parallel_experts", "tp_moe_forward",
           "expert_parallel_report", "expert_load_report", "expert_parallel_check"]
__all__ += ["ring_attention_report", "causal_balance_report", "decode_cp_report"]
