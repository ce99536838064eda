"""The interface every container runtime implements, and the records it works with.

A runtime turns one job step (what to mount, where to run, GPUs or not) into a ``StepCommand``: flags for ``srun``
(pyxis, Slurm's OCI support), a prefix before the image's Python (Apptainer), the changes to the step's
environment, and the files to write before the job starts (an OCI bundle's config.json). The Slurm job, the packed
pool and the local launcher all apply a StepCommand the same way; only the registry knows runtimes by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from hpc_train.containers.settings import IMAGE_PYTHON, ContainerSettings, Mount
from hpc_train.records import rundir

# The launching environment's Python stays outside: inside, the image's own Python and packages run.
LAUNCH_ENV_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV")
# Variables an image may set too whose value must be the job's (pyxis keeps an image's value unless named).
JOB_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SUBMITIT_EXECUTOR",
    "SUBMITIT_PREEMPT_SIGNAL",
)
JOB_PREFIXES = ("HPC_TRAIN_", "NCCL_", "TORCH_", "SLURM_")
# Set by the batch host in the step's environment: the first rank checks it against its own root (see inside.py).
ROOTFS_VARIABLE = "HPC_TRAIN_CONTAINER_ROOTFS"
IMAGE_VARIABLE = "HPC_TRAIN_CONTAINER_IMAGE"
RUNTIME_VARIABLE = "HPC_TRAIN_CONTAINER_RUNTIME"
DIGEST_VARIABLE = "HPC_TRAIN_CONTAINER_DIGEST"
LAUNCH_PREFIX_VARIABLE = "HPC_TRAIN_LAUNCH_PREFIX"  # the launching environment's sys.prefix, set by the batch host
ENTRY_FILE = "hpc_train_container_entry.py"  # staged beside hpc_train: the first thing each rank runs inside
ENTRY_MODULE = "hpc_train.containers.inside"  # the same, for an image that has hpc_train installed


@dataclass(frozen=True)
class StepContext:
    """Where one job step runs: the host paths it must see (at the same path inside), its working directory,
    whether it has GPUs, where hpc_train's rank side is staged (None: the image has it) and where a runtime
    that needs a per-job file writes it."""

    binds: Tuple[str, ...]
    workdir: str
    gpus: bool
    library: Optional[str]
    job_files: str  # a folder of the job's own (its run dir's or sweep dir's slurm folder)


@dataclass
class StepCommand:
    """How a job step runs in the image: ``srun [srun_flags] [prefix] python...`` with ``unset`` removed from the
    step's environment and ``set_env`` added; ``files`` are written (path -> text) before the job starts."""

    srun_flags: List[str] = field(default_factory=list)
    prefix: List[str] = field(default_factory=list)
    python: List[str] = field(default_factory=list)  # the image's Python and the entry that checks the image
    unset: Tuple[str, ...] = ()
    set_env: Dict[str, str] = field(default_factory=dict)
    files: Dict[str, str] = field(default_factory=dict)
    links: Dict[str, str] = field(default_factory=dict)  # path -> what it points at

    def argv(self, module_args: Sequence[str]) -> List[str]:
        """The command each task runs (after srun and its flags): the prefix, the image's Python, then
        ``module_args`` (``-m hpc_train.compute.worker SPEC`` or submitit's ``-m submitit.core._submit FOLDER``)."""
        return [*self.prefix, *self.python, *module_args]

    def environment(self, env: Mapping[str, str]) -> Dict[str, str]:
        changed = {key: value for key, value in env.items() if key not in self.unset}
        changed.update(self.set_env)
        return changed

    def write_files(self) -> None:
        for path, text in self.files.items():
            target = Path(path)
            if target.is_file() and target.read_text() == text:
                continue  # written already (a sweep's runs share one)
            rundir.write_text_atomic(target, text)
        for path, points_at in self.links.items():
            link = Path(path)
            if link.is_symlink() and os.readlink(link) == points_at:
                continue
            rundir.link_atomic(link, points_at)


class ContainerRuntime:
    """One way to run a step in an image. Subclasses set ``name`` and implement ``step``."""

    name = ""
    in_slurm_only = False  # True: runs through srun's flags only (pyxis), so never under launcher=local
    one_task_per_node = False  # True: a job step may have only one task on a node (Slurm 22.05's OCI support)
    image_is_path = True  # container.image names a file or folder (not only a registry URI)
    default_command: Optional[str] = None  # the executable it runs, where it runs one itself

    def step(self, settings: ContainerSettings, ctx: StepContext, local: bool = False) -> StepCommand:
        """The step's command; `local`: started by launcher=local (no srun around it)."""
        raise NotImplementedError

    def local_task(
        self,
        settings: ContainerSettings,
        ctx: StepContext,
        step: StepCommand,
        argv: Sequence[str],
        env: Mapping[str, str],
        name: str,
    ) -> List[str]:
        """launcher=local: the command of one task (`argv` after the image's Python), its environment being `env`
        (already changed by the step). Default: the step's prefix runs it."""
        return step.argv(argv)

    def local_runner(self, settings: ContainerSettings, ctx: StepContext, name: str) -> List[str]:
        """The words before the image's Python under launcher=local, where the runtime runs a bundle of its own
        (OCI); empty where the step's prefix says it all."""
        return []

    def python(self, settings: ContainerSettings, ctx: StepContext) -> List[str]:
        if ctx.library is None:
            return [IMAGE_PYTHON, "-u", "-m", ENTRY_MODULE]
        return [IMAGE_PYTHON, "-u", str(Path(ctx.library) / ENTRY_FILE)]

    def mounts(self, settings: ContainerSettings, ctx: StepContext) -> List[Mount]:
        """Every mount of the step: the job's paths at the same path inside (hpc_train's library read-only), then
        the user's."""
        own = [Mount(path, path) for path in ctx.binds]
        if ctx.library is not None:
            own.append(Mount(ctx.library, ctx.library, read_only=True))
        return [*own, *settings.mounts]

    def digest(self, settings: ContainerSettings) -> Optional[str]:
        """The image's digest where it is at hand without reading the image (a URI pinned by ``@sha256:``); a .sif
        of several GB is not hashed for every job."""
        image = str(settings.image)
        return image.split("@", 1)[1] if "@sha256:" in image else None

    def common_env(self, settings: ContainerSettings) -> Dict[str, str]:
        values = {RUNTIME_VARIABLE: self.name, IMAGE_VARIABLE: str(settings.image)}
        digest = self.digest(settings)
        if digest:
            values[DIGEST_VARIABLE] = digest
        values.update(dict(settings.env))
        return values
