"""Files and folders as a command found them, put back after a dry run or a refusal (both sides, no torch).

A command that is refused (or only a dry run) leaves what it touched as it was: a run dir's ``.hydra/`` files and
job log, a sweep dir's records, the dirs it made for itself. Its callers take what they will touch first
(:class:`FilesAsFound`, :class:`LogAsFound`, :func:`highest_missing`), make their own dirs with :func:`fresh_dir`,
and put it all back with these: the files' bytes (and times) rewritten atomically, an absent one removed, the log cut
back to its size, and the folders the command made removed up to the highest one it made, while they are empty.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

from hpc_train.records.rundir import write_bytes_atomic


@dataclass(frozen=True)
class FileAsFound:
    """One file's bytes, and its (atime, mtime) in ns when the caller keeps them (None: not kept)."""

    data: bytes
    times: Optional[Tuple[int, int]]


@dataclass
class FilesAsFound:
    """Named files as found (None: absent), to be put back exactly: bytes (and times) rewritten, or the file removed."""

    files: Dict[Path, Optional[FileAsFound]]
    times: bool = True

    @classmethod
    def take(cls, paths: Iterable[Path], times: bool = True) -> "FilesAsFound":
        return cls({path: _read(path, times) for path in paths}, times)

    def absent(self) -> bool:
        """None of the files was there."""
        return all(found is None for found in self.files.values())

    def put_back(self) -> None:
        for path, found in self.files.items():
            if found is None:
                path.unlink(missing_ok=True)
            elif _read(path, self.times) != found:
                write_bytes_atomic(found.data, path)
                if found.times is not None:
                    os.utime(path, ns=found.times)


@dataclass
class LogAsFound:
    """A log a command appends to, as found: its size and (atime, mtime) in ns (None: absent). Cut back to that size
    after a refusal: only the command's own lines go; a log it made and left empty is removed."""

    path: Path
    found: Optional[Tuple[int, int, int]]

    @classmethod
    def take(cls, path: Path) -> "LogAsFound":
        found = _stat(path)
        return cls(path, None if found is None else (found.st_size, found.st_atime_ns, found.st_mtime_ns))

    def cut_back(self) -> None:
        now = _stat(self.path)
        if self.found is None:
            if now is not None and now.st_size == 0:  # made by this command's logging, nothing in it
                self.path.unlink(missing_ok=True)
        elif now is not None and (now.st_size, now.st_mtime_ns) != (self.found[0], self.found[2]):
            os.truncate(self.path, min(now.st_size, self.found[0]))
            os.utime(self.path, ns=self.found[1:])


def highest_missing(path: Path) -> Optional[Path]:
    """The highest folder that making `path` would make (itself or a parent); None when `path` is there."""
    return next((p for p in reversed([path, *path.parents]) if not p.exists()), None)


def fresh_dir(path: Path) -> Path:
    """A new dir of this command's own: `path`, else `path-1`, `path-2`, ... (mkdir fails if another call or
    process took one first, so two commands started in the same second never share one)."""
    candidate, n = path, 0
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            n += 1
            candidate = path.with_name(f"{path.name}-{n}")


def remove_made(path: Path, top: Optional[Path]) -> None:
    """The dir this command made removed with all in it, then the folders made for it above it (`top`, the highest
    one it made) while they are empty. None: the command made nothing, and nothing goes."""
    if top is None:
        return
    shutil.rmtree(path, ignore_errors=True)
    remove_empty(path.parent, top)


def remove_empty(folder: Path, top: Optional[Path] = None) -> None:
    """`folder`, then each folder above it up to `top`, removed while empty: the first that is not (or one outside
    `top`) stops it. None: `folder` alone."""
    for each in [folder, *folder.parents]:
        if not each.is_relative_to(top or folder) or not _rmdir(each):
            return


def _read(path: Path, times: bool) -> Optional[FileAsFound]:
    try:
        found = path.stat()
        return FileAsFound(path.read_bytes(), (found.st_atime_ns, found.st_mtime_ns) if times else None)
    except FileNotFoundError:
        return None


def _stat(path: Path) -> Optional[os.stat_result]:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def _rmdir(path: Path) -> bool:
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True
