"""The container group: the site's image the ranks run in (container=none|apptainer|pyxis|oci).

The keys' forms are checked here; what needs the layout, the run dir or the file system (an image that is not there,
a mount that would hide the run dir, pyxis under launcher=local) is checked by hpc_train.containers.checks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Optional, Tuple

from hpc_train.config.checks import Problem, list_of, one_of, show, text, typed
from hpc_train.config.rule import R, Rule

NO_CONTAINER = "none"
NAMES = (
    NO_CONTAINER,
    "apptainer",
    "pyxis",
    "oci",
)  # the options of conf/container/ (each runtime: containers.registry)
COMMANDS = ("apptainer", "singularity", "crun", "runc")
MOUNT_FORM = "SRC:DST[:ro]"
MOUNT_HPC_TRAIN, IMAGE_HPC_TRAIN = "mount", "image"  # container.hpc_train: where the ranks import hpc_train from
_MOUNT = re.compile(r"(/[^:,]*):(/[^:,]*)(:(ro|rw))?")


def mount_parts(value: Any) -> Optional[Tuple[str, str, bool]]:
    """`SRC:DST[:ro]` with absolute paths -> (source, target, read only); None when it is not that form."""
    match = _MOUNT.fullmatch(value) if isinstance(value, str) else None
    return None if match is None else (match.group(1), match.group(2), match.group(4) == "ro")


def _mount(value: Any) -> Problem:
    if mount_parts(value) is None:
        return f"must be {MOUNT_FORM} with absolute paths (e.g. /scratch/data:/data:ro), got {show(value)}"
    return None


def _env(value: Any) -> Problem:
    if not isinstance(value, Mapping):
        return f"must be a mapping of variables such as {{NCCL_DEBUG: INFO}}, got {show(value)}"
    for key, item in value.items():
        if not (isinstance(key, str) and key.isidentifier()):
            return f"has {show(key)}, which is not a variable name (letters, digits, '_')"
        if not isinstance(item, (str, int, float)) or "\n" in str(item):
            return f"variable {key} must be one line of text or a number, got {show(item)}"
    return None


def _command(value: Any) -> Problem:
    """One of the runtimes' executables by name, or a site's own by absolute path (a wrapper around one of them)."""
    if isinstance(value, str) and (value in COMMANDS or (value.startswith("/") and "\n" not in value)):
        return None
    return f"must be one of {', '.join(COMMANDS)} or an absolute path to a wrapper of one, got {show(value)}"


RULES: Tuple[Rule, ...] = (
    R(
        "container.name",
        one_of(*NAMES),
        "apptainer",
        fix=f"pick the runtime with container=NAME ({', '.join(NAMES)}).",
        doc="The container runtime the ranks run in (set by container=NAME): " + " | ".join(NAMES) + ".",
        default="none",
    ),
    R(
        "container.image",
        text(what="an image (a path or a URI)"),
        "/path/to/pytorch.sif",
        null="no container (container=none)",
        fix="pass container.image=<your site's image: a .sif file, a docker:// or enroot URI, an OCI bundle folder>.",
        doc="The image: a .sif path, a docker:// or enroot URI, a squashfs file or an OCI bundle folder.",
        default=None,
    ),
    R(
        "container.mounts",
        list_of(typed(MOUNT_FORM, _mount), f"mounts {MOUNT_FORM}"),
        "[/scratch/data:/data:ro]",
        fix=f"give each mount as {MOUNT_FORM} with absolute paths, e.g. container.mounts=[/scratch/data:/data:ro].",
        doc="Extra mounts (the run dir, the submitting dir and hpc_train are mounted already).",
        default=[],
    ),
    R(
        "container.env",
        typed("{NAME: value}", _env),
        "{NCCL_DEBUG:INFO}",
        doc="Variables set inside the container, over the image's own.",
        default={},
        mapping=True,
    ),
    R(
        "container.options",
        list_of(text(what="a flag"), "flags"),
        "[--writable-tmpfs]",
        doc="Extra flags for the runtime (apptainer exec's; srun's for pyxis and oci).",
        default=[],
    ),
    R(
        "container.command",
        typed(" | ".join(COMMANDS) + " | an absolute path", _command),
        "singularity",
        null="the runtime's own (apptainer; crun for oci under launcher=local)",
        fix="set container.command=apptainer or singularity (container=apptainer), crun or runc (container=oci), or the"
        " absolute path of your site's wrapper of one.",
        doc="The runtime's executable: apptainer | singularity; for oci under launcher=local, crun | runc.",
        default=None,
    ),
    R(
        "container.hpc_train",
        one_of(MOUNT_HPC_TRAIN, IMAGE_HPC_TRAIN),
        IMAGE_HPC_TRAIN,
        doc="mount: hpc_train and its pure-Python dependencies mounted read-only | image: the image has them.",
        default=MOUNT_HPC_TRAIN,
    ),
)
