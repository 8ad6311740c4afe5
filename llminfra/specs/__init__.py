"""Facts as data: model architectures, GPU datasheets and number formats, each with its source."""

from llminfra.specs.formats import FORMATS, NumberFormat, dtype_bytes, get_format
from llminfra.specs.gpus import GPUSpec, get_gpu, gpu_names
from llminfra.specs.models import ModelSpec, get_model, model_names

__all__ = ["FORMATS", "NumberFormat", "dtype_bytes", "get_format", "GPUSpec", "get_gpu",
           "gpu_names", "ModelSpec", "get_model", "model_names"]
