"""A DCP checkpoint dir's ``manifest.json`` (size and sha256 of every other file, written last), so that a
complete checkpoint can be told from one a kill, a full disk or bit rot left torn.

Hashing is spread over the ranks: at a save each rank hashes only the files it wrote (DCP's
``write_data`` names them) and rank 0 gathers those small entries for the manifest; a deep
verification at load hashes each file on one rank and the ranks agree on the first failure.
So no rank reads the whole checkpoint back (~84 GB for a 7B model with AdamW).

A manifest only proves that files are whole, not who wrote them (a forger rewrites it too):
that nothing read from a checkpoint runs code is hpc_train.compute.checkpointing.dcp_metadata's
and dcp_load's job.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch.distributed as dist

from hpc_train.compute.checkpointing.dcp_metadata import METADATA, bare_name, read_metadata, referenced_files
from hpc_train.compute.checkpointing.files import CheckpointError, IncompleteCheckpoint, unsafe_checkpoint
from hpc_train.records import rundir

LOOP = "loop.pt"  # rank 0's loop state, RNG states per rank and fingerprint (a complete checkpoint has one)
MANIFEST = rundir.SHARDED_MANIFEST
MANIFEST_FORMAT = 1

Entries = Dict[str, Dict[str, Any]]  # file name -> {"size": bytes, "sha256": hex digest}, as in the manifest


# -- writing ------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entries(folder: Path, names: Iterable[str]) -> Entries:
    """Size and sha256 of the files `names` of `folder` (the files this rank wrote)."""
    entries = {}
    for name in sorted(names):
        file = Path(folder) / name
        entries[name] = {"size": file.stat().st_size, "sha256": _sha256(file)}
    return entries


def merged_entries(parts: Optional[List[Optional[Entries]]]) -> Optional[Entries]:
    """Every rank's entries in one table; None when a rank has none (it failed, and says so)."""
    if parts is None or any(part is None for part in parts):
        return None
    return {name: entry for part in parts for name, entry in part.items()}  # type: ignore[union-attr]


def write_manifest(folder: Path, step: int, extra: Dict[str, Any], hashed: Optional[Entries] = None) -> None:
    """``manifest.json``: every file of the dir with its size and sha256; the last file written.

    `hashed`: the entries the ranks made of their own files; the files left (.metadata, loop.pt:
    rank 0's alone) are hashed here. Without it (one process wrote everything) all are.
    """
    done = dict(hashed or {})
    left = [f.name for f in Path(folder).iterdir() if f.name != MANIFEST and f.name not in done and f.is_file()]
    done.update(file_entries(folder, left))
    files = {name: done[name] for name in sorted(done)}
    manifest: Dict[str, Any] = {"format": MANIFEST_FORMAT, "step": step, "files": files}
    try:  # the config fingerprint, readable on the login node without torch (as in today's files)
        manifest["fingerprint"] = json.loads(json.dumps(extra.get("fingerprint")))
    except (TypeError, ValueError):
        pass
    rundir.write_durable(Path(folder) / MANIFEST, json.dumps(manifest, indent=1).encode())


# -- verification ---------------------------------------------------------------------------
def read_manifest(path: Path) -> Dict[str, Any]:
    """``manifest.json`` of a checkpoint dir, checked for shape (names, sizes, digests)."""
    file = Path(path) / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except OSError as err:
        raise IncompleteCheckpoint(f"{path} is not a complete checkpoint: no readable {MANIFEST} ({err})") from None
    except ValueError:
        raise IncompleteCheckpoint(f"{path} is not a complete checkpoint: {MANIFEST} is torn or corrupt") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise IncompleteCheckpoint(f"{path} is not a checkpoint of this hpc-train ({MANIFEST} of another format)")
    for name, entry in files.items():
        ok = isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
        if not (ok and bare_name(name) and name != MANIFEST):
            raise IncompleteCheckpoint(f"{path} is not a complete checkpoint: bad {MANIFEST} entry {name!r}")
    return manifest


def check_file(folder: Path, name: str, entry: Dict[str, Any], deep: bool) -> None:
    """The file `name` of `folder` is a plain file of the size of its manifest `entry` (`deep`: and its sha256)."""
    file = folder / name
    try:
        info = os.lstat(file)
    except OSError:
        raise IncompleteCheckpoint(f"checkpoint {folder} is incomplete: {name} is missing") from None
    if not stat.S_ISREG(info.st_mode):
        raise IncompleteCheckpoint(f"checkpoint {folder} is not usable: {name} is not a plain file")
    if info.st_size != entry["size"]:
        raise IncompleteCheckpoint(
            f"checkpoint {folder} is truncated or corrupt: {name} has {info.st_size} bytes, its manifest says"
            f" {entry['size']}"
        )
    if deep and _sha256(file) != entry["sha256"]:
        raise IncompleteCheckpoint(
            f"checkpoint {folder} is corrupt or was modified: the sha256 of {name} does not match its manifest"
        )


@dataclass(frozen=True)
class Peers:
    """The ranks that verify a checkpoint together: each hashes a share of its files, all learn of any failure.

    `all_gather(obj)` returns every rank's picklable `obj` in rank order, on every rank.
    """

    rank: int
    world: int
    all_gather: Callable[[Any], List[Any]]


def process_group_peers() -> Optional[Peers]:
    """The default process group's ranks (the group ``dcp.load`` uses); None for a single process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    world = dist.get_world_size()

    def all_gather(obj: Any) -> List[Any]:
        found: List[Any] = [None] * world
        dist.all_gather_object(found, obj)
        return found

    return Peers(dist.get_rank(), world, all_gather)


def _hashing_ranks(files: Dict[str, Any], world: int) -> Dict[str, int]:
    """Which rank hashes which file: biggest first, each to the rank with the fewest bytes so far.

    Computed from the manifest alone, so every rank gets the same answer without talking.
    """
    load = [0] * world
    owner: Dict[str, int] = {}
    for name in sorted(files, key=lambda n: (-files[n]["size"], n)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[name] = rank
        load[rank] += files[name]["size"]
    return owner


def _read_complete_manifest(folder: Path) -> Dict[str, Any]:
    if not folder.is_dir():
        raise IncompleteCheckpoint(f"{folder} is not a checkpoint dir")
    manifest = read_manifest(folder)
    for required in (METADATA, LOOP):
        if required not in manifest["files"]:
            raise IncompleteCheckpoint(f"{folder} is not a complete checkpoint: its manifest lacks {required}")
    return manifest


def _check_covered(folder: Path, files: Dict[str, Any]) -> None:
    """The .metadata (read with the allow-list) may only read files the manifest covers."""
    missing = [name for name in referenced_files(read_metadata(folder)) if name not in files]
    if missing:
        raise unsafe_checkpoint(folder, f"its .metadata reads files its manifest does not cover ({', '.join(missing)})")


# (position in the order of the checks, the error): the earliest position is the error a single process raises
_Failure = Tuple[int, Exception]


def _first_failure(
    folder: Path, deep: bool, peers: Optional[Peers]
) -> Tuple[Optional[Dict[str, Any]], Optional[_Failure]]:
    """Every check in a fixed order, hashing only this rank's share; the manifest, or the first failure."""
    try:
        manifest = _read_complete_manifest(folder)
    except Exception as err:
        return None, (0, err)
    files = manifest["files"]
    owner = _hashing_ranks(files, peers.world) if peers is not None else None
    for position, (name, entry) in enumerate(files.items(), start=1):
        mine = owner is None or owner[name] == peers.rank  # type: ignore[union-attr]
        try:
            check_file(folder, name, entry, deep and mine)
        except Exception as err:
            return None, (position, err)
    if deep:
        try:
            _check_covered(folder, files)
        except Exception as err:
            return None, (len(files) + 1, err)
    return manifest, None


def _earliest(failures: Iterable[Optional[_Failure]]) -> Optional[_Failure]:
    found = [failure for failure in failures if failure is not None]
    return min(found, key=lambda failure: failure[0]) if found else None


def verify(path: Path, deep: bool = False, peers: Optional[Peers] = None) -> Dict[str, Any]:
    """Check a checkpoint dir against its manifest; returns the manifest or raises a CheckpointError.

    Shallow: the files exist with their sizes. `deep`: also their sha256, and the .metadata
    (read with the allow-list, so a forged one raises :class:`UnsafeCheckpoint`) names only
    files the manifest covers. Nothing is ever unpickled beyond that. With `peers` (a
    collective) each rank hashes only its share and every rank raises the same error: the
    one a single process checking everything would raise.
    """
    spread = deep and peers is not None and peers.world > 1
    manifest, failure = _first_failure(Path(path), deep, peers if spread else None)
    if spread:
        failure = _earliest(peers.all_gather(failure))  # type: ignore[union-attr]
    if failure is not None:
        raise failure[1]
    return manifest  # type: ignore[return-value]


def is_complete(path: Path) -> bool:
    """True when `path` is a checkpoint dir whose files match its manifest's sizes (cheap: no hashing)."""
    try:
        verify(path)
    except CheckpointError:
        return False
    return True
