"""`pipeline` (single process): model-parallel stages fed with `strategy.chunks` micro-batches, fill-drain."""

from hpc_train.compute.parallel.model_parallel import ModelParallelStrategy


class PipelineStrategy(ModelParallelStrategy):
    name = "pipeline"
