"""`pipeline` (single process): model-parallel stages fed with `strategy.chunks` micro-batches, fill-drain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hpc_train.compute.parallel.model_parallel import ModelParallelStrategy, StagedSettings


@dataclass(frozen=True)
class PipelineSettings(StagedSettings):
    """The stage keys, the micro-batches per step and the engine (native here; pipelining: PipeliningStrategy)."""

    chunks: Optional[int]  # null: one
    engine: str


class PipelineStrategy(ModelParallelStrategy):
    name = "pipeline"
    settings_type = PipelineSettings
