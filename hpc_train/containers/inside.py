"""The first thing each rank runs inside the image: check the image, record what runs, then run the rank.

``python3 -u <library>/hpc_train_container_entry.py -m MODULE ARGS`` (or ``-m hpc_train.containers.inside`` where
the image has hpc_train) puts the staged library first on the path (for this process and those it starts), and
stops with one message, before any training, when the image cannot run hpc_train's ranks: no torch, a torch older
than hpc_train supports, no torchft for replica groups, the launching environment's Python instead of the image's,
or (Slurm's OCI support) a node that ran the task outside the image because it has no ``oci.conf``. The refusal
goes to the batch host as a request, which ends the job with it. What ran (the interpreter, its version, torch's
and torchft's, the root file system) is passed on to the rank in ``HPC_TRAIN_CONTAINER_SEEN`` for its run log and
summary. Imports no torch.
"""

from __future__ import annotations

import json
import os
import runpy
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from hpc_train.config.fault_tolerance import TORCHFT_INSTALL
from hpc_train.containers.base import (
    DIGEST_VARIABLE,
    ENTRY_FILE,
    IMAGE_VARIABLE,
    LAUNCH_PREFIX_VARIABLE,
    ROOTFS_VARIABLE,
    RUNTIME_VARIABLE,
)
from hpc_train.processes.rank_env import REPLICA_GROUPS_VARIABLE
from hpc_train.records import job_requests
from hpc_train.records.rundir import EXIT_REFUSED
from hpc_train.slurm.hostlist import expand_hostlist

MIN_TORCH = (2, 4)  # pyproject's torch>=2.4 (a unit test holds them equal)
SEEN_VARIABLE = "HPC_TRAIN_CONTAINER_SEEN"


def root_of_mounts(mountinfo: str) -> Tuple[str, str]:
    """(root, file system type) of the mount at ``/`` in /proc/self/mountinfo's text: the root is the folder of
    its file system that ``/`` shows (``/`` on a host; the image's root file system in a container)."""
    found = ("/", "")
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == "/":
            tail = fields[fields.index("-") + 1 :] if "-" in fields else [""]
            found = (fields[3], tail[0])  # the last mount on / is the one processes see
    return found


def installed_version(distribution: str) -> Optional[str]:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _numbers(version: str) -> Tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def problems(env: Dict[str, str], seen: Dict[str, str]) -> List[str]:
    """What keeps this image from running hpc_train's ranks (empty: nothing)."""
    found = []
    launch_prefix = env.get(LAUNCH_PREFIX_VARIABLE)
    if launch_prefix and os.path.realpath(sys.prefix) == os.path.realpath(launch_prefix):
        found.append(
            f"the rank ran the launching environment's Python ({sys.executable}), not the image's: the job's PATH"
            " reached the container"
        )
    expected = env.get(ROOTFS_VARIABLE)
    if expected and (seen["root"] == "/" or not expected.rstrip("/").endswith(seen["root"].rstrip("/"))):
        found.append(
            f"node {seen['host']} ran the rank outside the image (its root is the host's, not {expected}): Slurm"
            " ignores --container on a node without oci.conf"
        )
    torch = seen.get("torch")
    if torch is None:
        found.append(f"its Python ({sys.executable}) has no torch")
    elif _numbers(torch) < MIN_TORCH:
        found.append(f"its torch is {torch}, older than the {'.'.join(map(str, MIN_TORCH))} hpc_train needs")
    if env.get(REPLICA_GROUPS_VARIABLE) and seen.get("torchft") is None:
        found.append(f"its Python has no torchft, which fault_tolerance.replica_groups runs on ({TORCHFT_INSTALL})")
    return found


def what_runs() -> Dict[str, str]:
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        mountinfo = ""
    root, fstype = root_of_mounts(mountinfo)
    return {
        "executable": sys.executable,
        "python": ".".join(map(str, sys.version_info[:3])),
        "torch": installed_version("torch"),
        "torchft": installed_version("torchft"),
        "root": root,
        "root_fs": fstype,
        "host": socket.gethostname(),
        "image": os.environ.get(IMAGE_VARIABLE, ""),
        "digest": os.environ.get(DIGEST_VARIABLE),
        "runtime": os.environ.get(RUNTIME_VARIABLE, ""),
    }


def image_record() -> Dict[str, Optional[str]]:
    """What this rank runs: the interpreter always; inside an image, what the first check found (the image, its
    runtime, Python and torch versions, its root file system)."""
    try:
        seen = json.loads(os.environ.get(SEEN_VARIABLE) or "{}")
    except ValueError:
        seen = {}
    return {**seen, "executable": sys.executable} if seen else {"executable": sys.executable}


def oci_task_identity(env: Dict[str, str], host: str) -> Optional[str]:
    """Slurm 22.05 sets no per-task variable inside an OCI container (one task per node): this task's rank is its
    node's place in the step's node list. Sets them in `env`; a problem in words, or None."""
    nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
    short = host.split(".")[0]
    if short not in nodes:
        return (
            f"this task cannot tell its rank: its hostname {host} is not among the step's nodes {nodes} (the bundle"
            " gives the container a hostname of its own: leave the uts namespace out of its config.json)"
        )
    index = str(nodes.index(short))
    env.update(SLURM_PROCID=index, SLURM_NODEID=index, SLURM_LOCALID="0", SLURMD_NODENAME=short)
    return None


def _put_library_first() -> None:
    library = Path(__file__).absolute().parents[2]
    if not (library / ENTRY_FILE).exists():
        return  # the image's own hpc_train
    paths = [str(library), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


def _run(argv: List[str]) -> None:
    args = list(argv)
    while args[:1] == ["-u"]:  # the interpreter's flag, given again for the module: this process is unbuffered
        args = args[1:]
    if args[:1] == ["-m"]:  # as `python -m` does: the working directory (the submitting one) comes first
        sys.path.insert(0, os.getcwd())
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        runpy.run_path(args[0], run_name="__main__")


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    job_requests.mark_started()
    _put_library_first()
    seen = what_runs()
    found = problems(dict(os.environ), seen)
    if os.environ.get(ROOTFS_VARIABLE) and "SLURM_PROCID" not in os.environ and os.environ.get("SLURM_JOB_ID"):
        unknown_rank = oci_task_identity(os.environ, seen["host"])  # type: ignore[arg-type]
        if unknown_rank:
            found.append(unknown_rank)
    if found:
        image = seen["image"] or "the image"
        message = (
            f"hpc-train: the image {image} cannot run hpc_train's ranks: {'; '.join(found)}. Fix: use an image with"
            f" Python and torch >= {'.'.join(map(str, MIN_TORCH))}"
            f"{' and torchft' if os.environ.get(REPLICA_GROUPS_VARIABLE) else ''} (container.image=...), and see the"
            " clusters guide's Containers section."
        )
        print(message, file=sys.stderr, flush=True)
        job_requests.write(job_requests.REFUSE, message=message)
        sys.exit(EXIT_REFUSED)
    os.environ[SEEN_VARIABLE] = json.dumps(seen)
    _run(argv)


if __name__ == "__main__":
    main()
