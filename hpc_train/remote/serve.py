"""The cluster side of a laptop's commands: ``python -m hpc_train.remote.serve ACTION ...``, run over SSH by the
cluster's own hpc_train (the versions were compared first). Answers are JSON on stdout or a tar stream; nothing it
prints is meant for a person but ``follow``'s, which is the forwarded command's own output.

A forwarded command runs detached from the SSH session (``start`` spawns ``run`` in a session of its own): a
dropped connection does not stop it, so a submission finishes whole (or, interrupted by ``interrupt``, cancels
what it queued, as Ctrl-C on a login node does). Its output, pid and exit status live in
``~/.cache/hpc_train/commands/<id>.*`` on the cluster, where a later command finds them.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterator, List, Optional

from hpc_train.records import profile_traces, rundir

MODULE = "hpc_train.remote.serve"  # this module's name (``__name__`` is ``__main__`` when run with -m)
COMMANDS = Path("~/.cache/hpc_train/commands")
EXIT_LOST = 255  # the command's runner died without recording an exit status (the node rebooted, a kill -9)
# What a report needs of a run dir, and what it does not: checkpoints, weights, traces and event files stay on the
# cluster (``hpc-train-report --fetch`` copies them too); so does any file bigger than RECORD_MAX_BYTES.
SKIPPED_DIRS = (rundir.CHECKPOINTS, profile_traces.PROFILE, "tensorboard", "wandb", "mlruns")
SKIPPED_SUFFIXES = (".pt", ".pkl", ".ckpt", ".safetensors", ".bin", ".distcp")
RECORD_MAX_BYTES = 32 * 2**20
FOLLOW_POLL_S = 0.2
EXIT_DISK_FULL = 28  # unpack: the cluster's disk is full (errno ENOSPC)


def _paths(ident: str) -> Dict[str, Path]:
    folder = COMMANDS.expanduser()
    return {name: folder / f"{ident}.{name}" for name in ("out", "json", "result")}


def _read(path: Path) -> Dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, data: Dict[str, Any]) -> None:
    rundir.write_text_atomic(path, json.dumps(data))


def start(ident: str, module: str, args: List[str]) -> Dict[str, Any]:
    """Spawn ``run`` detached (a session of its own, no terminal, output to a file); its pid."""
    files = _paths(ident)
    files["out"].parent.mkdir(parents=True, exist_ok=True)
    with files["out"].open("wb") as out:
        runner = subprocess.Popen(
            [sys.executable, "-m", MODULE, "run", ident, module, "--", *args],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _write(files["json"], {"runner": runner.pid})
    assert runner.stdin is not None
    runner.stdin.close()  # the runner writes its own record only now, so this one never replaces it (see run)
    return {"runner": runner.pid}


def run(ident: str, module: str, args: List[str]) -> int:
    """Run ``python -m MODULE ARGS`` here (its output is ours), record its pid, then its exit status. Started by
    ``start``, which records this runner first: the record is written once ``start`` closed our stdin (or ended)."""
    files = _paths(ident)
    sys.stdin.buffer.read()  # else start's record, written late on a loaded node, could replace ours and its pid
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{rundir.CLI_RESULT_VARIABLE: str(files["result"])})
    child = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.DEVNULL, env=env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the child's (``interrupt``); the runner records
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _write(files["json"], {"runner": os.getpid(), "pid": child.pid, "started": time.time()})
    code = child.wait()
    _write(files["json"], {"runner": os.getpid(), "pid": child.pid, "code": code, "ended": time.time()})
    return 0


def _ended(record: Dict[str, Any]) -> bool:
    """Whether the command has ended: its exit status recorded, or its runner gone without recording one."""
    if "code" in record:
        return True
    if not record.get("runner"):
        return False
    try:
        os.kill(int(record["runner"]), 0)
    except (ProcessLookupError, PermissionError):  # gone (or its pid reused by another user's process)
        return True
    return False


def follow(ident: str, offset: int) -> None:
    """The command's output from byte ``offset`` on, as it is written, until the command has ended."""
    files = _paths(ident)
    out = sys.stdout.buffer
    with files["out"].open("rb") as source:
        source.seek(offset)
        while True:
            ended = _ended(_read(files["json"]))
            chunk = source.read(65536)
            if chunk:
                out.write(chunk)
                out.flush()
                continue
            if ended:
                return
            time.sleep(FOLLOW_POLL_S)


def result(ident: str) -> Dict[str, Any]:
    """The command's record (pid, exit status once it ended) and its refusal as data when it wrote one."""
    files = _paths(ident)
    found = _read(files["json"])
    if "code" not in found and found and _ended(found):
        found["code"] = EXIT_LOST
    refusal = _read(files["result"])
    return {**found, "refusal": refusal or None, "output_bytes": _size(files["out"])}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def interrupt(ident: str) -> Dict[str, Any]:
    """SIGINT to the command, as Ctrl-C on a login node: what it queued is cancelled (the queueing's rule)."""
    found = _read(_paths(ident)["json"])
    if "pid" not in found or "code" in found:
        return {"sent": False, **found}
    try:
        os.kill(int(found["pid"]), signal.SIGINT)
    except ProcessLookupError:
        return {"sent": False, **found}
    return {"sent": True, **found}


def manifest(root: Path, names: List[str]) -> Dict[str, List[int]]:
    """[size, mtime in s] of each of ``names`` (relative to ``root``) that exists."""
    found: Dict[str, List[int]] = {}
    for name in names:
        try:
            info = (root / name).stat()
        except OSError:
            continue
        found[name] = [info.st_size, int(info.st_mtime)]
    return found


def unpack(root: Path, source: BinaryIO) -> int:
    """A tar stream from ``source`` into ``root`` (``receive``); a full disk is EXIT_DISK_FULL."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        receive(source, root)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            print(f"no space left on the cluster's disk under {root}", file=sys.stderr)
            return EXIT_DISK_FULL
        print(f"could not write under {root} on the cluster: {err}", file=sys.stderr)
        return 1
    return 0


def receive(source: BinaryIO, root: Path) -> int:
    """The tar stream ``source`` under ``root`` (names checked to stay inside it; folders made, links skipped): each
    file written whole through the one writer (rundir.write_atomic), so a reader there (a report, a rank reading the
    project) sees the old file or the new one, never part of one. The number of files written. Both ends use it:
    ``unpack`` (the project synced to the cluster) and the laptop's mirror of a run dir's records."""
    count = 0
    with tarfile.open(fileobj=source, mode="r|") as stream:
        for member in stream:
            if not _inside(member.name):
                continue
            if member.isdir():
                (root / member.name).mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                _write_member(stream, member, root / member.name)
                count += 1
    return count


def _write_member(stream: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    """One file of the stream at ``path``, with the member's mode and mtime (what ``manifest`` and ``pack`` compare):
    set on the temporary file before its rename (after it where a file descriptor cannot take them: Windows). Not
    fsynced: a copy, which the next sync or refresh sends again."""
    data = stream.extractfile(member)
    assert data is not None  # a regular file's
    mode, times = member.mode & 0o777, (member.mtime, member.mtime)
    by_fd = os.chmod in os.supports_fd and os.utime in os.supports_fd

    def write(handle: BinaryIO) -> None:
        shutil.copyfileobj(data, handle)
        handle.flush()
        if by_fd:
            os.chmod(handle.fileno(), mode)
            os.utime(handle.fileno(), times)

    rundir.write_atomic(path, write, durable=False)
    if not by_fd:
        os.chmod(path, mode)
        os.utime(path, times)


def _inside(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def record_files(root: Path, everything: bool) -> Iterator[Path]:
    """The files of a run (or sweep) dir a report reads (``everything``: all of them), relative to ``root``."""
    for folder, dirs, files in os.walk(root):
        if not everything:
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        for name in files:
            path = Path(folder) / name
            if not everything and (name.endswith(SKIPPED_SUFFIXES) or _size(path) > RECORD_MAX_BYTES):
                continue
            if name.endswith(".tmp") or (name.startswith(".") and ".tmp" in name):  # being written
                continue
            yield path.relative_to(root)


def pack(root: Path, have: Dict[str, List[int]], everything: bool, out: BinaryIO) -> None:
    """A tar stream into ``out`` of the files of ``root`` the laptop does not have as they are here."""
    with tarfile.open(fileobj=out, mode="w|") as stream:
        if not root.is_dir():
            return
        for rel in record_files(root, everything):
            path = root / rel
            try:
                info = path.stat()
            except OSError:
                continue
            if have.get(str(rel)) == [info.st_size, int(info.st_mtime)]:
                continue
            try:
                stream.add(str(path), arcname=str(rel), recursive=False)
            except OSError:  # gone between the walk and the read (a log rotated): the next refresh has it
                continue


def exists(paths: List[str]) -> Dict[str, bool]:
    return {path: os.path.exists(os.path.expanduser(path)) for path in paths}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_train.remote.serve")
    parser.add_argument(
        "action", choices=("start", "run", "follow", "result", "interrupt", "manifest", "unpack", "pack", "exists")
    )
    parser.add_argument("words", nargs="*")
    parser.add_argument("--all", action="store_true")
    args, rest = parser.parse_known_args(argv)
    words = [*args.words, *[w for w in rest if w != "--"]]
    if args.action in ("start", "run"):
        ident, module, command = words[0], words[1], (argv or sys.argv[1:])
        command = command[command.index("--") + 1 :] if "--" in command else []
        if args.action == "run":
            return run(ident, module, command)
        print(json.dumps(start(ident, module, command)), flush=True)
        return 0
    if args.action == "follow":
        follow(words[0], int(words[1]))
        return 0
    if args.action in ("result", "interrupt"):
        print(json.dumps((result if args.action == "result" else interrupt)(words[0])))
        return 0
    if args.action == "unpack":
        return unpack(Path(words[0]).expanduser(), sys.stdin.buffer)
    if args.action == "pack":
        pack(Path(words[0]).expanduser(), json.load(sys.stdin), args.all, sys.stdout.buffer)
        return 0
    data = json.load(sys.stdin)
    print(json.dumps(manifest(Path(words[0]).expanduser(), data) if args.action == "manifest" else exists(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
