"""A laptop's copy of a run (or sweep) dir on the cluster: the records a report reads (summaries, metrics,
attempts, job tables, logs and error records), fetched on demand, only what changed; ``fetch`` adds everything
(checkpoints, event files, traces) for local plots and TensorBoard."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List

from hpc_train.records import rundir
from hpc_train.remote import serve
from hpc_train.remote.connection import Connection
from hpc_train.remote.settings import RemoteLink


def _have(local: Path) -> Dict[str, List[int]]:
    found: Dict[str, List[int]] = {}
    for folder, _, files in os.walk(local):
        for name in files:
            path = Path(folder) / name
            info = path.stat()
            found[path.relative_to(local).as_posix()] = [info.st_size, int(info.st_mtime)]
    found.pop(rundir.REMOTE_LINK, None)
    return found


def refresh(conn: Connection, local: Path, link: RemoteLink, everything: bool = False) -> int:
    """Bring ``local`` up to date with ``link.path`` on the cluster; the number of files that came."""
    local.mkdir(parents=True, exist_ok=True)
    words = conn.serve_words("pack", link.path, *(["--all"] if everything else []))
    process = conn.host.popen(words, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdin.write(json.dumps(_have(local)).encode())
    process.stdin.close()
    count = 0
    try:
        count = serve.receive(process.stdout, local)  # each file whole: a report reading here never sees half of one
    except tarfile.ReadError:  # nothing (or part) came: the connection failed (said below)
        pass
    said = process.stderr.read().decode(errors="replace")
    conn.ended(
        process.wait(),
        said,
        "cluster.remote_python",
        f"reading {link.path} on {conn.target.login}",
        f"run hpc-train-report {link.path} on the cluster itself to see why.",
    )
    return count
