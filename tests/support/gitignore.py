"""The repository's `.gitignore`, read without git (the unit tier starts no process): which names are left behind by
runs and builds. Only what this project's `.gitignore` uses is understood: plain names and globs, a trailing ``/``
for folders only, a leading ``/`` for the top level only; no negation."""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import List, Tuple

from tests.support.paths import REPO


def patterns(root: Path = REPO) -> List[Tuple[str, bool, bool]]:
    """(glob, folders only, top level only) for each line of `root`/.gitignore."""
    found = []
    for line in (root / ".gitignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), f".gitignore negation is not understood here: {line}"
        found.append((line.strip("/"), line.endswith("/"), line.startswith("/")))
    return found


def ignored(path: Path, root: Path = REPO) -> bool:
    """Whether .gitignore leaves `path` (a file or folder under `root`) out."""
    relative = path.relative_to(root)
    top = len(relative.parts) == 1
    for glob, folders_only, top_only in patterns(root):
        if (folders_only and not path.is_dir()) or (top_only and not top):
            continue
        if fnmatch.fnmatch(path.name, glob):
            return True
    return False
