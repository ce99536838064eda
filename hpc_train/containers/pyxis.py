"""pyxis/enroot: each job step runs ``srun --container-image=IMAGE --container-mounts=... python3 ...``.

pyxis passes the step's environment into the container but keeps the value of any variable the image sets too,
unless ``--container-env`` names it (names only): hpc_train exports its values in the step's environment and names
every variable it or the job sets there. GPUs come through enroot's hooks. pyxis runs inside srun only, so
``launcher=local`` refuses it.
"""

from __future__ import annotations

import os
from typing import List, Mapping, Optional

from hpc_train.containers.base import (
    JOB_PREFIXES,
    JOB_VARIABLES,
    LAUNCH_ENV_VARIABLES,
    LAUNCH_PREFIX_VARIABLE,
    ContainerRuntime,
    StepCommand,
    StepContext,
)
from hpc_train.containers.settings import ContainerSettings
from hpc_train.records.job_requests import REQUESTS_VARIABLE


class Pyxis(ContainerRuntime):
    name = "pyxis"
    in_slurm_only = True
    image_is_path = False

    def env_names(self, settings: ContainerSettings, env: Optional[Mapping[str, str]] = None) -> List[str]:
        """Every variable whose value must be the job's inside: hpc_train's, the job's and those the launching
        environment sets for NCCL, torch and hpc_train."""
        env = os.environ if env is None else env
        names = set(JOB_VARIABLES) | set(self.common_env(settings)) | {REQUESTS_VARIABLE, LAUNCH_PREFIX_VARIABLE}
        names |= {key for key in env if key.startswith(JOB_PREFIXES) and not key.startswith("SLURM_")}
        return sorted(names)

    def step(self, settings: ContainerSettings, ctx: StepContext, local: bool = False) -> StepCommand:
        mounts = ",".join(mount.spec for mount in self.mounts(settings, ctx))
        flags = [
            f"--container-image={settings.image}",
            f"--container-mounts={mounts}",
            f"--container-workdir={ctx.workdir}",
            f"--container-env={','.join(self.env_names(settings))}",
            *settings.options,
        ]
        return StepCommand(
            srun_flags=flags,
            python=self.python(settings, ctx),
            unset=LAUNCH_ENV_VARIABLES,
            set_env=self.common_env(settings),
        )
