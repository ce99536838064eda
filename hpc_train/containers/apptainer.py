"""Apptainer (and Singularity): each task runs ``apptainer exec [flags] IMAGE python3 ...``.

Apptainer's documented form is ``apptainer exec [exec options] <container> <command>``: every flag goes before the
image (``--nv`` included: after it, Apptainer takes it for the command). The step's environment passes into the
container as Apptainer passes a host's (the image keeps its own PATH); the launching environment's Python
variables are removed first, ``container.env`` goes in as ``--env NAME=VALUE``. No ``--cleanenv``: it would drop
the variables srun gives each task (its rank, its GPUs).
"""

from __future__ import annotations

from typing import List

from hpc_train.containers.base import LAUNCH_ENV_VARIABLES, ContainerRuntime, StepCommand, StepContext
from hpc_train.containers.settings import ContainerSettings


class Apptainer(ContainerRuntime):
    name = "apptainer"
    default_command = "apptainer"

    def flags(self, settings: ContainerSettings, ctx: StepContext) -> List[str]:
        flags: List[str] = ["--nv"] if ctx.gpus else []
        for mount in self.mounts(settings, ctx):
            flags += ["--bind", mount.spec]
        flags += ["--pwd", ctx.workdir]
        for key, value in sorted(self.common_env(settings).items()):
            flags += ["--env", f"{key}={value}"]
        return [*flags, *settings.options]

    def step(self, settings: ContainerSettings, ctx: StepContext, local: bool = False) -> StepCommand:
        command = settings.command or self.default_command
        return StepCommand(
            prefix=[str(command), "exec", *self.flags(settings, ctx), str(settings.image)],
            python=self.python(settings, ctx),
            unset=LAUNCH_ENV_VARIABLES,
            set_env=self.common_env(settings),  # for the batch host too, which names the image in a refusal
        )
