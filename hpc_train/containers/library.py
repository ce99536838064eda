"""hpc_train's rank side for an image that has only PyTorch (``container.hpc_train=mount``, the default).

hpc_train and the pure-Python packages its ranks import are copied once into a folder named after their content
(``$HPC_TRAIN_CACHE``, else ``~/.cache/hpc_train``, a home the compute nodes share), mounted read-only at the same
path, and put first on the image's path by the entry file staged beside them. Nothing compiled is copied: torch,
numpy and the rest come from the image.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
from pathlib import Path
from typing import List, Tuple

from hpc_train.containers.base import ENTRY_FILE, ENTRY_MODULE
from hpc_train.records import rundir

# The packages the ranks import beside torch (tests/unit/test_containers.py checks this list against a rank's imports).
RANK_PACKAGES = (
    "hpc_train",
    "submitit",
    "cloudpickle",
    "omegaconf",
    "antlr4",
    "yaml",
    "hydra",
    "packaging",
    "typing_extensions",
    "tqdm",
    "hydra_plugins",  # a Hydra app's jobs unpickle its config, which names every installed plugin's classes
)
CACHE_VARIABLE = "HPC_TRAIN_CACHE"
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.pyd")
ENTRY_TEXT = f"""# Staged by hpc_train: the first thing each rank runs inside the image (see {ENTRY_MODULE}).
import runpy

runpy.run_module("{ENTRY_MODULE}", run_name="__main__")
"""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "hpc_train").expanduser().absolute()


def _sources() -> List[Tuple[str, Path]]:
    found = []
    for name in RANK_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        if spec.origin in (None, "namespace"):  # a namespace package: every portion's packages, under its name
            for folder in spec.submodule_search_locations or []:
                found += [(f"{name}.{p.name}", p) for p in sorted(Path(folder).iterdir()) if p.is_dir()]
            continue  # (a portion found twice, as an editable install lists it, is copied once: the first)
        origin = Path(spec.origin)
        found.append((name, origin.parent if origin.name == "__init__.py" else origin))
    unique = {}
    for name, path in found:
        unique.setdefault(name, path)
    return list(unique.items())


def _digest(sources: List[Tuple[str, Path]]) -> str:
    digest = hashlib.sha256(ENTRY_TEXT.encode())
    for name, path in sources:
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            stat = file.stat()
            digest.update(f"{name}:{file.relative_to(path.parent)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)  # once per process: a sweep of many runs stages one library
def library_dir() -> Path:
    """Where the staged copy of this installation lives (named by content: a changed hpc_train gets a new one)."""
    return cache_root() / "container-lib" / _digest(_sources())


def stage() -> Path:
    """Copy the rank side there, once (a finished copy is never rewritten; a half-made one is replaced)."""
    target = library_dir()
    if (target / ENTRY_FILE).exists():
        return target
    partial = rundir.temporary_name(target)  # two submissions in containers (both pid 1) never share it
    partial.mkdir(parents=True)
    for name, path in _sources():
        parent = partial.joinpath(*name.split(".")[:-1])  # a namespace package's part: its own folder only
        parent.mkdir(parents=True, exist_ok=True)
        if path.name == "__pycache__":
            continue
        if path.is_dir():
            shutil.copytree(path, parent / path.name, ignore=_SKIP, symlinks=False)
        else:
            shutil.copy2(path, parent / path.name)
    (partial / ENTRY_FILE).write_text(ENTRY_TEXT)
    try:
        rundir.replace_atomic(partial, target)
    except OSError:  # another submission staged the same content first
        shutil.rmtree(partial, ignore_errors=True)
    return target
