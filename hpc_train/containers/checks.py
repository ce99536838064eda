"""The container keys checked against the job before anything is queued: each refusal names the key and the fix."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable, List, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.containers.registry import runtime_for
from hpc_train.containers.settings import ContainerSettings, Mount, parse_mount

# Flags that would drop what srun gives each task, or the job's own mounts.
_REFUSED_OPTIONS = {
    "--cleanenv": "drops the variables srun gives each task (its rank, its GPUs); use container.env to set variables",
    "-e": "(--cleanenv) drops the variables srun gives each task; use container.env to set variables",
    "--no-mount": "may leave out the run dir and the submitting dir the ranks write to",
}
_BIND_FLAGS = ("--bind", "-B", "--mount", "--container-mounts")
_URI = ("docker://", "oras://", "library://", "shub://", "docker-daemon://", "http://", "https://")


def _looks_like_path(image: str) -> bool:
    return "://" not in image and "#" not in image and (image.startswith(("/", "./", "../", "~")) or "." in image)


def check_image(settings: ContainerSettings, runtime_name: str) -> None:
    image = str(settings.image)
    if image.startswith(_URI) or not _looks_like_path(image) and runtime_name != "oci":
        return  # a registry URI: the runtime pulls it on the compute node
    path = Path(image).expanduser()
    if runtime_name == "oci":
        if not (path / "config.json").is_file():
            raise ConfigError(
                "container.image",
                f"container=oci takes an OCI bundle folder (its config.json and root file system), but {image} has no"
                " config.json" + ("" if path.exists() else " (it does not exist on this machine)") + ".",
                "pass container.image=/path/to/bundle (umoci unpack or `podman export` make one), or use"
                " container=apptainer for a .sif file.",
            )
        return
    if not path.exists():
        raise ConfigError(
            "container.image",
            f"the image {image} does not exist on this machine.",
            "pass the image's full path on a file system the compute nodes share (e.g."
            " container.image=$WORK/pytorch.sif), or a docker:// URI.",
        )


def _option_mounts(options: Iterable[str]) -> List[Tuple[int, Mount]]:
    """(index in container.options, mount) for every bind an option adds."""
    found = []
    items = list(options)
    for index, option in enumerate(items):
        name, _, value = option.partition("=")
        if name in _BIND_FLAGS and not value and index + 1 < len(items):
            value = items[index + 1]
        if name in _BIND_FLAGS and value:
            for spec in value.split(","):
                mount = parse_mount(spec if spec.count(":") else f"{spec}:{spec}")
                if mount is not None:
                    found.append((index, mount))
    return found


def _hides(mount: Mount, path: str) -> bool:
    """True when `mount` covers `path` with something else than `path` itself."""
    target, path = os.path.normpath(mount.target), os.path.normpath(path)
    covers = path == target or path.startswith(target.rstrip("/") + "/")
    if not covers:
        return False
    return os.path.normpath(mount.source) + path[len(target) :] != path


def check_container(
    settings: ContainerSettings, binds: Iterable[str], on_this_machine: bool, tasks_per_node: int = 1
) -> None:
    """Refuse what cannot work, naming the key: an image that is not there, a runtime that cannot run here, a mount
    or option that would hide the job's own paths."""
    runtime = runtime_for(settings)
    if runtime is None:
        return
    if settings.image is None:
        raise ConfigError(
            "container.image", f"container={runtime.name} needs an image.", "pass container.image=<your site's image>."
        )
    check_image(settings, runtime.name)
    if on_this_machine and runtime.in_slurm_only:
        raise ConfigError(
            "container",
            f"container={runtime.name} runs through srun's flags, which a run on this machine does not use.",
            "use launcher=slurm with it, or container=apptainer (or container=oci with crun) to try the image here.",
        )
    if runtime.one_task_per_node and tasks_per_node > 1 and not on_this_machine:
        raise ConfigError(
            "container",
            f"container={runtime.name}: Slurm's OCI support runs one task per node in a container, but this layout has"
            f" {tasks_per_node} tasks per node.",
            "run one rank per node (resources.gpus_per_node=1, or strategy=dp / script.launcher=torchrun, whose one"
            " task per node starts the node's ranks), or use container=apptainer or container=pyxis.",
        )
    if on_this_machine:
        command = settings.command or runtime.default_command
        if command and shutil.which(command) is None:
            raise ConfigError(
                "container.command",
                f"container={runtime.name} runs `{command}` on this machine, but it is not on PATH.",
                "install it (or `module load` it), or pick the one you have with container.command=...",
            )
    for index, option in enumerate(settings.options):
        why = _REFUSED_OPTIONS.get(option.partition("=")[0])
        if why:
            raise ConfigError(f"container.options[{index}]", f"{option} {why}.", "remove it from container.options.")
    own = sorted(set(binds))
    for key, mount in [(f"container.mounts[{i}]", m) for i, m in enumerate(settings.mounts)] + [
        (f"container.options[{i}]", m) for i, m in _option_mounts(settings.options)
    ]:
        hidden = [path for path in own if _hides(mount, path)]
        if hidden:
            raise ConfigError(
                key,
                f"the mount {mount.spec} would hide {hidden[0]} inside the container (the ranks write their run dir"
                " there and read the submitting dir's code: it is mounted at the same path already).",
                "mount somewhere else (e.g. /data) or leave that path out: hpc_train mounts the run dir itself.",
            )
