"""Slurm's own OCI support: each job step runs ``srun --container=BUNDLE python3 ...`` (``oci.conf`` on every node).

``container.image`` is an OCI bundle (its ``config.json`` and root file system). Slurm adds no mounts of its own
and writes the step's environment as the container's, so hpc_train writes the job's own copy of the bundle's
``config.json`` (its root file system by absolute path, the job's paths mounted at the same path, ``/etc/hosts``
for the nodes' names) and gives the step the image's own PATH, the launching environment's Python variables
removed. Under ``launcher=local`` the same bundle runs with ``container.command`` (crun or runc), one per rank.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from hpc_train.containers.base import (
    LAUNCH_ENV_VARIABLES,
    ROOTFS_VARIABLE,
    ContainerRuntime,
    StepCommand,
    StepContext,
)
from hpc_train.containers.settings import ContainerSettings

BUNDLE = "oci-bundle"  # the job's own bundle, in its job-files folder
HOST_FILES = ("/etc/hosts", "/etc/resolv.conf")  # the nodes' names and the site's resolver, read-only
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def image_config(image: str) -> Dict[str, Any]:
    return json.loads((Path(image) / "config.json").read_text())


def rootfs(image: str, config: Mapping[str, Any]) -> str:
    """The bundle's root file system as an absolute path (config.json's root.path is relative to the bundle)."""
    path = Path(str((config.get("root") or {}).get("path") or "rootfs"))
    return os.path.realpath(path if path.is_absolute() else (Path(image).absolute() / path))


def image_env(config: Mapping[str, Any]) -> Dict[str, str]:
    values = {}
    for item in (config.get("process") or {}).get("env") or []:
        key, _, value = str(item).partition("=")
        values[key] = value
    return values


# Per-task variables Slurm 22.05 does not set inside an OCI container: the batch shell's would reach every task, so
# the step does not get them; the first rank derives them (hpc_train.containers.inside.oci_task_identity).
PER_TASK_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURMD_NODENAME",
    "SLURM_TASK_PID",
    "SLURM_GTIDS",
    "CUDA_VISIBLE_DEVICES",
)


class Oci(ContainerRuntime):
    name = "oci"
    default_command = "crun"
    one_task_per_node = True

    def bundle_config(
        self,
        settings: ContainerSettings,
        ctx: StepContext,
        image: Mapping[str, Any],
        env: Mapping[str, str],
        args: Sequence[str] = (),
    ) -> Dict[str, Any]:
        """The job's config.json: the image's (`image`), with the job's mounts, working directory, environment and,
        where given, command."""
        config = copy.deepcopy(dict(image))
        config["root"] = {**(config.get("root") or {}), "path": rootfs(str(settings.image), image)}
        mounts: List[Dict[str, Any]] = list(config.get("mounts") or [])
        binds = [(path, path, True) for path in HOST_FILES if os.path.exists(path)]
        binds += [(m.source, m.target, m.read_only) for m in self.mounts(settings, ctx)]
        for source, target, read_only in binds:
            options = ["rbind", "ro" if read_only else "rw"]
            mounts.append({"destination": target, "type": "bind", "source": source, "options": options})
        config["mounts"] = mounts
        process = dict(config.get("process") or {})
        process["cwd"] = ctx.workdir
        process["env"] = [f"{k}={v}" for k, v in env.items()]
        if args:
            process["args"] = list(args)
            process["terminal"] = False
        config["process"] = process
        return config

    def digest(self, settings: ContainerSettings) -> Optional[str]:
        """An OCI bundle's: the sha256 of its config.json (what it runs and mounts; its root file system is a
        folder, which has no digest of its own)."""
        return "sha256:" + hashlib.sha256((Path(str(settings.image)) / "config.json").read_bytes()).hexdigest()

    def step_env(self, settings: ContainerSettings, image: Mapping[str, Any]) -> Dict[str, str]:
        values = {"PATH": image_env(image).get("PATH", DEFAULT_PATH)}
        values[ROOTFS_VARIABLE] = rootfs(str(settings.image), image)
        values.update(self.common_env(settings))
        return values

    def step(self, settings: ContainerSettings, ctx: StepContext, local: bool = False) -> StepCommand:
        image = image_config(str(settings.image))
        set_env = self.step_env(settings, image)
        bundle = str(Path(ctx.job_files) / BUNDLE)
        if local:
            return StepCommand(python=self.python(settings, ctx), unset=LAUNCH_ENV_VARIABLES, set_env=set_env)
        config = self.bundle_config(settings, ctx, image, {**image_env(image), **set_env})
        # Slurm runs <bundle>/rootfs whatever config.json's root.path says: the job's bundle links the image's.
        return StepCommand(
            srun_flags=[f"--container={bundle}", *settings.options],
            python=self.python(settings, ctx),
            unset=(*LAUNCH_ENV_VARIABLES, *PER_TASK_VARIABLES),
            set_env=set_env,
            files={str(Path(bundle) / "config.json"): json.dumps(config, indent=1) + "\n"},
            links={str(Path(bundle) / "rootfs"): set_env[ROOTFS_VARIABLE]},
        )

    def local_task(
        self,
        settings: ContainerSettings,
        ctx: StepContext,
        step: StepCommand,
        argv: Sequence[str],
        env: Mapping[str, str],
        name: str,
    ) -> List[str]:
        """launcher=local: write this task's bundle (its command and environment in config.json, as the OCI
        runtime takes them) and return the runtime's command that runs it in the foreground."""
        bundle = Path(ctx.job_files) / f"{BUNDLE}-{name}"
        config = self.bundle_config(settings, ctx, image_config(str(settings.image)), env, args=step.argv(argv))
        config.pop("hostname", None)
        namespaces = (config.get("linux") or {}).get("namespaces") or []
        kept = [n for n in namespaces if n.get("type") not in ("network", "uts")]  # the host's, as on Slurm
        config.setdefault("linux", {})["namespaces"] = kept
        StepCommand(files={str(bundle / "config.json"): json.dumps(config, indent=1) + "\n"}).write_files()
        return self.local_runner(settings, ctx, name)

    def local_runner(self, settings: ContainerSettings, ctx: StepContext, name: str) -> List[str]:
        bundle = Path(ctx.job_files) / f"{BUNDLE}-{name}"
        return [str(settings.command or self.default_command), "run", "--bundle", str(bundle), name]
