"""The project copied to the cluster: the submitting directory's files as git would keep them (``.gitignore``
respected), only those that changed, under a size limit; rsync on the same master where both sides have it, else a
tar stream through ssh into the cluster's hpc_train.

Never synced, whatever ``.gitignore`` says: version control folders, bytecode, virtual environments and Hydra's
output folders (``outputs/``, ``multirun/``: a laptop's copies of run dirs). Files removed here stay on the cluster
(nothing there is deleted: its run dirs live beside the code).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.errors import DiskFull, HpcTrainError
from hpc_train.hosts.ssh import SSH_FAILED
from hpc_train.remote.connection import Cluster, Connection
from hpc_train.remote.serve import EXIT_DISK_FULL

NEVER_DIRS = {".git", ".hg", ".svn", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
NEVER_TOP = {"outputs", "multirun"}  # Hydra's output roots: run dirs, which the cluster writes itself
NEVER_SUFFIXES = (".pyc", ".pyo")
BIGGEST_SHOWN = 5
DISK_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "no space left on the cluster's disk")
# rsync's exit statuses for a connection that failed: socket I/O, the protocol stream cut, timeouts (and ssh's own)
RSYNC_CONNECTION_LOST = (10, 12, 30, 35, SSH_FAILED)


@dataclass(frozen=True)
class Synced:
    files: int  # files in the project
    sent: int  # of them, sent because they changed
    total_bytes: int
    how: str  # rsync | ssh


def _kept(rel: str) -> bool:
    parts = rel.split("/")
    if parts[0] in NEVER_TOP or any(part in NEVER_DIRS for part in parts[:-1]):
        return False
    return not rel.endswith(NEVER_SUFFIXES)


def project_files(root: Path) -> List[str]:
    """The files to sync, relative to ``root``: git's list where ``root`` is in a git work tree (tracked and
    untracked, not ignored), else a walk that reads ``.gitignore`` files (their globs; no ``!`` negation)."""
    listed = _git_files(root)
    if listed is None:
        listed = _walked_files(root)
    return sorted(rel for rel in listed if _kept(rel) and (root / rel).is_file())


def _git_files(root: Path) -> Optional[List[str]]:
    if shutil.which("git") is None:
        return None
    try:
        done = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [name for name in done.stdout.decode(errors="surrogateescape").split("\0") if name]


def _walked_files(root: Path) -> List[str]:
    found: List[str] = []
    rules: List[Tuple[str, List[Tuple[str, bool, bool]]]] = []  # (folder, its .gitignore's rules)
    for folder, dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root).replace(os.sep, "/")
        rel_folder = "" if rel_folder == "." else rel_folder
        if ".gitignore" in files:
            rules.append((rel_folder, _ignore_rules(Path(folder) / ".gitignore")))
        dirs[:] = [
            d
            for d in dirs
            if d not in NEVER_DIRS
            and not (Path(folder) / d / "pyvenv.cfg").exists()
            and not _ignored(_join(rel_folder, d), True, rules)
        ]
        found += [_join(rel_folder, name) for name in files if not _ignored(_join(rel_folder, name), False, rules)]
    return found


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _ignore_rules(path: Path) -> List[Tuple[str, bool, bool]]:
    """(glob, folders only, anchored) per line of a .gitignore."""
    rules = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        rules.append((line.strip("/"), line.endswith("/"), "/" in line.rstrip("/")))
    return rules


def _ignored(rel: str, is_dir: bool, rules: Sequence[Tuple[str, List[Tuple[str, bool, bool]]]]) -> bool:
    for folder, lines in rules:
        if folder and not rel.startswith(folder + "/"):
            continue
        inner = rel[len(folder) + 1 :] if folder else rel
        name = inner.rsplit("/", 1)[-1]
        for glob, folders_only, anchored in lines:
            if folders_only and not is_dir:
                continue
            if fnmatch.fnmatch(inner if anchored else name, glob):
                return True
    return False


def check_size(root: Path, files: Sequence[str], limit_mb: int) -> int:
    """The project's bytes; over ``cluster.sync_limit_mb``, a refusal naming the biggest folders."""
    sizes: Dict[str, int] = {}
    total = 0
    for rel in files:
        size = (root / rel).stat().st_size
        total += size
        top = rel.split("/", 1)[0] + ("/" if "/" in rel else "")
        sizes[top] = sizes.get(top, 0) + size
    if total <= limit_mb * 2**20:
        return total
    biggest = sorted(sizes.items(), key=lambda item: -item[1])[:BIGGEST_SHOWN]
    shown = ", ".join(f"{name} ({size / 2**20:,.0f} MB)" for name, size in biggest)
    raise ConfigError(
        "cluster.sync_limit_mb",
        f"the project to sync ({root}) holds {total / 2**20:,.0f} MB in {len(files):,} files, more than"
        f" cluster.sync_limit_mb={limit_mb}; the biggest: {shown}. Nothing was sent.",
        "add data, weights and outputs to .gitignore (the cluster reads its data from its own paths), run from the"
        " folder of your code, or raise cluster.sync_limit_mb.",
    )


def push(conn: Connection, cluster: Cluster, root: Path, files: Sequence[str], remote: str) -> Synced:
    """Send what changed of ``files`` (relative to ``root``) to ``remote`` on the cluster."""
    total = sum((root / rel).stat().st_size for rel in files)
    how = conn.settings.sync
    if how == "auto":
        how = "rsync" if cluster.rsync and shutil.which("rsync") else "ssh"
    if how == "rsync":
        sent = _rsync(conn, root, files, remote)
    else:
        sent = _stream(conn, root, files, remote)
    return Synced(len(files), sent, total, how)


def _disk_full(conn: Connection, remote: str, said: str) -> DiskFull:
    return DiskFull(
        f"the cluster's disk is full under {remote} on {conn.target.login} ({said.strip().splitlines()[-1]});"
        " the sync stopped part-way, and nothing was submitted. Fix: free space there (old run dirs' checkpoints,"
        " quota: see your site's quota command), or set `cluster.remote_dir` to a file system with room (a work or"
        " scratch folder)."
    )


def _rsync(conn: Connection, root: Path, files: Sequence[str], remote: str) -> int:
    host, _ = conn.target.host_and_port()
    command = [
        "rsync", "-a", "--from0", "--files-from=-", "--out-format=%n",
        "-e", conn.target.rsync_shell(), f"{root}/", f"{host}:{remote}/",
    ]  # fmt: skip
    done = subprocess.run(
        command, input="\0".join(files).encode(), capture_output=True, check=False, start_new_session=True
    )
    if done.returncode != 0:
        raise rsync_failure(conn, remote, done.returncode, done.stderr.decode(errors="replace"))
    return sum(1 for line in done.stdout.decode(errors="replace").splitlines() if line and not line.endswith("/"))


def rsync_failure(conn: Connection, remote: str, code: int, said: str) -> HpcTrainError:
    """rsync's failure (``code``, its stderr ``said``): a full disk there is DiskFull; a connection that failed or
    was cut, Unreachable; anything else, a ConfigError naming ``cluster.sync`` (the stream through ssh is the other
    way)."""
    if any(words in said for words in DISK_FULL_WORDS):
        return _disk_full(conn, remote, said)
    lost = code in RSYNC_CONNECTION_LOST and "command not found" not in said
    return conn.failure(
        SSH_FAILED if lost else code,
        said,
        "cluster.sync",
        f"rsync to {conn.target.login}:{remote}",
        f"set cluster.sync=ssh to copy with a stream through ssh (or check that you can write under {remote} there).",
    )


def _stream(conn: Connection, root: Path, files: Sequence[str], remote: str) -> int:
    there = conn.serve_json("manifest", remote, stdin=list(files))
    changed = []
    for rel in files:
        info = (root / rel).stat()
        if there.get(rel) != [info.st_size, int(info.st_mtime)]:
            changed.append(rel)
    if not changed:
        return 0
    process = conn.host.popen(
        conn.serve_words("unpack", remote), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    errors: List[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(process.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        with tarfile.open(fileobj=process.stdin, mode="w|") as stream:  # type: ignore[arg-type]
            for rel in changed:
                stream.add(str(root / rel), arcname=rel, recursive=False)
        process.stdin.close()  # type: ignore[union-attr]
    except (BrokenPipeError, OSError):  # the other end stopped reading (a full disk, a dropped connection)
        pass
    code = process.wait()
    reader.join(timeout=30)
    said = b"".join(errors).decode(errors="replace")
    if code == EXIT_DISK_FULL or any(words in said for words in DISK_FULL_WORDS):
        raise _disk_full(conn, remote, said)
    conn.ended(
        code,
        said,
        "cluster.remote_dir",
        f"copying the project to {conn.target.login}:{remote}",
        "set cluster.remote_dir to a folder of yours on the cluster that you can write.",
    )
    return len(changed)


def size_words(byte_count: int) -> str:
    return f"{byte_count / 2**20:,.1f} MB" if byte_count >= 2**20 else f"{byte_count / 1024:,.0f} kB"
