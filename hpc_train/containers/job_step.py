"""A job's container step, from its settings and the paths it uses: the one function the Slurm job, the packed pool,
the local launcher and the dry run call."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from hpc_train.config.container import MOUNT_HPC_TRAIN
from hpc_train.containers import library
from hpc_train.containers.base import ContainerRuntime, StepCommand, StepContext
from hpc_train.containers.registry import runtime_for
from hpc_train.containers.settings import ContainerSettings


def step_context(
    binds: Iterable[str], gpus: bool, job_files: Path, settings: ContainerSettings, stage: bool
) -> StepContext:
    """The job's paths at the same path inside; the submitting directory is the working directory; `stage`: copy
    hpc_train's rank side into its library now (not in a dry run, which only names it)."""
    workdir = os.getcwd()
    paths = sorted({os.path.abspath(p) for p in (workdir, *binds)})
    own = [p for p in paths if not any(p.startswith(q.rstrip("/") + "/") for q in paths if q != p)]  # outermost only
    if settings.hpc_train == MOUNT_HPC_TRAIN:
        folder: Optional[str] = str(library.stage() if stage else library.library_dir())
    else:
        folder = None
    return StepContext(tuple(own), workdir, gpus, folder, str(Path(job_files).absolute()))


@dataclass
class LocalContainer:
    """launcher=local's tasks in the image: each task's command and environment."""

    runtime: ContainerRuntime
    settings: ContainerSettings
    ctx: StepContext
    step: StepCommand

    def task(self, argv: Sequence[str], env: Mapping[str, str], name: str) -> Tuple[List[str], Dict[str, str]]:
        changed = self.step.environment(env)
        return self.runtime.local_task(self.settings, self.ctx, self.step, argv, changed, name), changed


def local_container(
    settings: ContainerSettings, binds: Iterable[str], gpus: bool, job_files: Path, stage: bool = True
) -> Optional[LocalContainer]:
    """The local launcher's container (None: no container); hpc_train's library is staged now unless `stage` is
    false (a dry run)."""
    runtime = runtime_for(settings)
    if runtime is None:
        return None
    ctx = step_context(binds, gpus, job_files, settings, stage=stage)
    return LocalContainer(runtime, settings, ctx, runtime.step(settings, ctx, local=True))


def container_step(
    settings: ContainerSettings, binds: Iterable[str], gpus: bool, job_files: Path, stage: bool, local: bool = False
) -> Optional[StepCommand]:
    """The step's command in the image (None: no container)."""
    runtime = runtime_for(settings)
    if runtime is None:
        return None
    return runtime.step(settings, step_context(binds, gpus, job_files, settings, stage), local=local)
