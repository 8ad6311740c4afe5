"""Tensor, pipeline and data parallelism over an explicit ``World`` (chapter 07).

* :mod:`~llminfra.parallel.world` — ``World``; ``SimulatedWorld`` (threads of one process) and
  ``DistributedWorld`` (``torch.distributed``: gloo on CPU, NCCL on CUDA);
* :mod:`~llminfra.parallel.launch` — ``launch(fn, n, ...)``: spawn ``n`` ranks (from a notebook
  too), collect their results, surface their errors, never leave a process behind;
* :mod:`~llminfra.parallel.tensor_parallel` — column / row parallel linear, Megatron's f and g;
* :mod:`~llminfra.parallel.megatron` — the Megatron MLP and attention,
  ``apply_tensor_parallel(model, world)``;
* :mod:`~llminfra.parallel.dtensor_check` — the same MLP with ``torch.distributed.tensor.parallel``;
* :mod:`~llminfra.parallel.pipeline` — GPipe stages, micro-batches, timelines, the bubble;
* :mod:`~llminfra.parallel.data_parallel` — replicas for serving throughput;
* :mod:`~llminfra.parallel.workers` — functions the spawned ranks run.
"""

from llminfra.parallel.launch import RankError, launch
from llminfra.parallel.megatron import apply_tensor_parallel, parallel_attention, parallel_mlp
from llminfra.parallel.pipeline import bubble_fraction, gpipe_schedule, measured_bubble
from llminfra.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from llminfra.parallel.world import DistributedWorld, SimulatedWorld, World, run_simulated

__all__ = ["World", "SimulatedWorld", "DistributedWorld", "run_simulated", "launch", "RankError",
           "ColumnParallelLinear", "RowParallelLinear", "parallel_mlp", "parallel_attention",
           "apply_tensor_parallel", "bubble_fraction", "gpipe_schedule", "measured_bubble"]
